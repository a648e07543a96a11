//! The `sluice` binary: the command line (`cli`) over the daemon's library (`sluice`) and the
//! tools' packages (`sluice_bench`, `sluice_k8s`).

mod cli;

/// mimalloc: a check allocates a little (JSON, keys, a Redis pipeline entry) and frees it at
/// once; mimalloc's thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
