//! Reading the files sluice reads while running (the policy file, the tenant table) with bounds:
//! only regular files (not `/dev/zero`, a FIFO or a directory behind a symlink), at most
//! `files.max_bytes`, within `files.read_timeout`, and not at all when the file's metadata says
//! it has not changed since the last read.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::HumanDuration;

/// `[files]`: bounds on every file read at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLimits {
    /// Largest file read, in bytes.
    pub max_bytes: u64,
    /// Longest one read may take.
    pub read_timeout: HumanDuration,
}

impl Default for FileLimits {
    fn default() -> Self {
        Self {
            max_bytes: 4 * 1024 * 1024,
            read_timeout: HumanDuration(2_000_000),
        }
    }
}

/// What identifies one version of a file without reading it: a changed file (an edit, or a
/// Kubernetes ConfigMap swapping its `..data` symlink) changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

/// Why a file was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong.
    pub reason: String,
}

/// The stamp of `path` (following symlinks), refusing anything but a regular file within the
/// size bound. Never opens the file, so a FIFO cannot block it.
pub fn stamp(path: &Path, limits: &FileLimits) -> Result<FileStamp, ReadError> {
    use std::os::unix::fs::MetadataExt;
    let error = |reason: String| ReadError {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(e.to_string()))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    if meta.len() > limits.max_bytes {
        return Err(error(format!(
            "{} bytes, over files.max_bytes ({})",
            meta.len(),
            limits.max_bytes
        )));
    }
    Ok(FileStamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// Reads `path` as UTF-8 within the bounds, on a thread of its own so that a stalled file
/// system costs that thread, not the caller, past the timeout. Blocking: call it from
/// `spawn_blocking` in async code.
pub fn read(path: &Path, limits: &FileLimits) -> Result<(String, FileStamp), ReadError> {
    let stamp = stamp(path, limits)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let owned = path.to_owned();
    let max = limits.max_bytes;
    std::thread::Builder::new()
        .name("sluice-file-read".into())
        .spawn(move || {
            let _ = tx.send(read_capped(&owned, max));
        })
        .map_err(|e| ReadError {
            path: path.to_owned(),
            reason: format!("cannot start a reader thread: {e}"),
        })?;
    let timeout = limits.read_timeout.as_std();
    let text = rx
        .recv_timeout(timeout)
        .map_err(|_| format!("not read within files.read_timeout ({timeout:?})"))
        .and_then(|result| result)
        .map_err(|reason| ReadError {
            path: path.to_owned(),
            reason,
        })?;
    Ok((text, stamp))
}

/// Reads at most `max` bytes; more is an error (the file grew after its stamp).
fn read_capped(path: &Path, max: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("over files.max_bytes ({max})"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8".into())
}

/// [`read`] from async code, off the worker threads.
pub async fn read_async(
    path: PathBuf,
    limits: FileLimits,
) -> Result<(String, FileStamp), ReadError> {
    off_thread(path, move |path| read(path, &limits)).await
}

/// [`stamp`] from async code, off the worker threads.
pub async fn stamp_async(path: PathBuf, limits: FileLimits) -> Result<FileStamp, ReadError> {
    off_thread(path, move |path| stamp(path, &limits)).await
}

/// Runs blocking file `work` off the worker threads; a panic in it is a read error.
pub(crate) async fn off_thread<T: Send + 'static>(
    path: PathBuf,
    work: impl FnOnce(&Path) -> Result<T, ReadError> + Send + 'static,
) -> Result<T, ReadError> {
    let fallback = path.clone();
    tokio::task::spawn_blocking(move || work(&path))
        .await
        .unwrap_or_else(|e| {
            Err(ReadError {
                path: fallback,
                reason: format!("reader failed: {e}"),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> FileLimits {
        FileLimits {
            max_bytes: 1024,
            read_timeout: HumanDuration(2_000_000),
        }
    }

    #[test]
    fn devices_fifos_and_big_files_are_refused_without_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let err = read(&zero, &small()).unwrap_err();
        assert!(err.reason.contains("not a regular file"), "{err}");
        let fifo = dir.path().join("fifo.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        assert!(read(&fifo, &small()).is_err(), "a FIFO is never opened");
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; 2048]).expect("write");
        let err = read(&big, &small()).unwrap_err();
        assert!(err.reason.contains("files.max_bytes"), "{err}");
        assert!(read(dir.path(), &small()).is_err(), "a directory");
    }

    #[test]
    fn the_stamp_changes_with_the_content_and_not_without() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.yaml");
        std::fs::write(&path, "a: 1\n").expect("write");
        let (text, first) = read(&path, &small()).expect("reads");
        assert_eq!(text, "a: 1\n");
        assert_eq!(stamp(&path, &small()).expect("stamp"), first);
        // A replacement by rename (as editors and the kubelet do) is a new inode.
        let next = dir.path().join("p.yaml.new");
        std::fs::write(&next, "a: 1\n").expect("write");
        std::fs::rename(&next, &path).expect("rename");
        assert_ne!(stamp(&path, &small()).expect("stamp"), first);
    }
}
