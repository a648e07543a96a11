//! Binding the Unix socket: create its directory, replace a stale socket file left by a crash
//! (but never a live one or a non-socket file), and set the file's permissions.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// Binds `path` with permission bits `mode`.
pub fn bind(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
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
        let live = bind(&path, 0o660).expect("first bind");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert_eq!(
            bind(&path, 0o660).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        drop(live);
        bind(&path, 0o600).expect("stale socket replaced");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"keep me").expect("write");
        assert_eq!(
            bind(&plain, 0o660).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&plain).expect("still there"), b"keep me");
    }
}
