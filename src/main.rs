//! The `sluice` binary: everything lives in the library; see `sluice::cli`.

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
