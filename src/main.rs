//! The `sluice` binary: everything lives in the library; see `sluice::cli`.

/// mimalloc: a check allocates a little (JSON, keys, a Redis pipeline entry) and frees it at
/// once; mimalloc's thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
