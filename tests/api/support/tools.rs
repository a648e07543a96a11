//! External programs some tests need (python3, node, curl, go, nginx, kubectl, kubernetes-validate):
//! found on PATH, or the test is skipped with a printed reason; under CI (`CI` set) a required
//! one that is missing fails the test instead, since `.ci/run` installs them.

use std::path::PathBuf;
use std::process::Command;

use crate::helpers::repo_root;

/// The program's path on PATH, if any.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Whether a program that CI installs is here: `false` (after printing why the test is skipped)
/// only outside CI; panics under CI.
pub fn required(program: &str) -> bool {
    if which(program).is_some() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{program} is not on PATH; .ci/run installs it");
    }
    eprintln!("SKIPPED: {program} is not on PATH (CI installs it; see .ci/run)");
    false
}

/// Whether `python3 -m MODULE` works (kubernetes-validate is used that way, so no PATH shim is
/// needed); like [`required`]: skipped with a reason outside CI, a failure under CI.
#[allow(dead_code)] // the deploy binary's (kubernetes-validate)
pub fn required_python_module(module: &str) -> bool {
    let works = which("python3").is_some()
        && std::process::Command::new("python3")
            .args(["-m", module, "--version"])
            .output()
            .is_ok_and(|out| out.status.success());
    if works {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("python3 -m {module} does not run; .ci/run installs it");
    }
    eprintln!("SKIPPED: python3 -m {module} does not run (CI installs it; see .ci/run)");
    false
}

/// A command for an example, with no inherited SLUICE_* variables.
pub fn example(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args).current_dir(repo_root());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLUICE_") {
            command.env_remove(&name);
        }
    }
    command
}
