//! Binding the Unix socket: create its directory, refuse a directory someone else could swap the
//! socket in (owned by another user, or writable by others without the sticky bit, anywhere on
//! the path), replace a stale socket file left by a crash (but never a live one or a non-socket
//! file), and set the file's group and permissions.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// Binds `path` with permission bits `mode`, given to group `group` when set (so a proxy's
/// workers in that group can connect to a `0660` socket). Unless `trust_dir`, every directory
/// from the root to the socket's must belong to this user or root and be writable by no one
/// else (or be sticky, like `/tmp`): another writer could unlink the socket and answer in
/// sluice's place.
pub fn bind(
    path: &Path,
    mode: u32,
    group: Option<u32>,
    trust_dir: bool,
) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)?;
        if !trust_dir {
            check_dirs(dir)?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running process", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot give {} to group {gid} (listen.socket_group): {e}; sluice's user \
                     must be a member of that group",
                    path.display()
                ),
            )
        })?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Refuses `dir` or any directory above it that others could write to, along the path as
/// written (a symlink in a directory others can write could be swapped) and as resolved.
fn check_dirs(dir: &Path) -> io::Result<()> {
    let written = std::path::absolute(dir)?;
    let resolved = std::fs::canonicalize(dir)?;
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    for ancestor in written.ancestors().chain(resolved.ancestors()) {
        let meta = std::fs::metadata(ancestor)?;
        if let Some(reason) = unsafe_dir(meta.uid(), meta.mode(), me) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "socket directory {} {reason}: another user could replace the socket; use a \
                     directory only sluice's user can write (or set listen.trust_socket_dir \
                     for a volume only this pod reaches)",
                    ancestor.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Why a directory with owner `uid` and `mode` is unsafe for a process running as `me` (`None`
/// when unknown: then only root and the mode count).
fn unsafe_dir(uid: u32, mode: u32, me: Option<u32>) -> Option<String> {
    if uid != 0 && Some(uid) != me {
        return Some(format!("belongs to another user (uid {uid})"));
    }
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky {
        return Some(format!(
            "is writable by others (mode {:04o})",
            mode & 0o7777
        ));
    }
    None
}

/// Removes the socket file at shutdown (ignoring a file already gone).
pub fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "could not remove socket file")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stale_socket_is_replaced_live_one_and_plain_files_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested").join("s.sock");
        let live = bind(&path, 0o660, None, false).expect("first bind");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert_eq!(
            bind(&path, 0o660, None, false).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        drop(live);
        bind(&path, 0o600, None, false).expect("stale socket replaced");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"keep me").expect("write");
        assert_eq!(
            bind(&plain, 0o660, None, false).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&plain).expect("still there"), b"keep me");
    }

    #[tokio::test]
    async fn the_socket_is_given_its_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        // A group this process may always give: its own file's.
        let own = std::fs::metadata(dir.path()).expect("meta").gid();
        let _listener = bind(&path, 0o660, Some(own), false).expect("bind");
        let meta = std::fs::metadata(&path).expect("meta");
        assert_eq!(
            (meta.gid(), meta.permissions().mode() & 0o777),
            (own, 0o660)
        );
    }

    #[tokio::test]
    async fn a_directory_others_can_write_or_own_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = bind(&open.join("s.sock"), 0o660, None, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("writable by others"), "{err}");
        assert!(
            !err.to_string().contains("  "),
            "one space between words: {err}"
        );
        assert!(!open.join("s.sock").exists(), "nothing bound");
        bind(&open.join("s.sock"), 0o660, None, true).expect("trusted on request");
        // Sticky, like /tmp: others cannot remove what is ours.
        let sticky = dir.path().join("sticky");
        std::fs::create_dir(&sticky).expect("mkdir");
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        bind(&sticky.join("s.sock"), 0o660, None, false).expect("sticky is safe");
        // A safe directory reached through a symlink that lives in an open one.
        let safe = dir.path().join("safe");
        std::fs::create_dir(&safe).expect("mkdir");
        std::os::unix::fs::symlink(&safe, open.join("link")).expect("symlink");
        let err = bind(&open.join("link").join("s.sock"), 0o660, None, false).unwrap_err();
        assert!(err.to_string().contains("writable by others"), "{err}");
        assert!(unsafe_dir(1234, 0o755, Some(1000))
            .expect("refused")
            .contains("another user"));
        assert_eq!(unsafe_dir(0, 0o755, Some(1000)), None, "root's is fine");
        assert_eq!(unsafe_dir(1000, 0o700, Some(1000)), None);
        assert!(
            unsafe_dir(1000, 0o770, Some(1000)).is_some(),
            "group-writable"
        );
    }
}
