//! The tenant tier table in a YAML file (`tenants: {acme: enterprise}`), for the embedded store.
//! Looked at again at most once per refresh interval, by one lookup while the others use the
//! table in hand: its metadata first (an unchanged file is not read), then a bounded read
//! (`files.max_bytes`, `files.read_timeout`) off the worker threads. A file that cannot be read
//! or parsed keeps the last good table (and is logged).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{TierFuture, TierSource};
use crate::config::bounded_read::{self, FileStamp};
use crate::config::FileLimits;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    #[serde(default)]
    tenants: HashMap<String, String>,
}

type Table = Arc<HashMap<String, String>>;

struct Loaded {
    /// When the file was last looked at.
    at: Instant,
    /// Its metadata when last read.
    stamp: Option<FileStamp>,
    table: Table,
}

/// Tiers from a YAML file.
pub struct FileTiers {
    path: PathBuf,
    refresh: Duration,
    limits: FileLimits,
    loaded: Mutex<Loaded>,
}

impl FileTiers {
    /// Reads `path` now (within `limits`), and again once `refresh` has passed since the last
    /// look, if it changed.
    pub fn new(path: PathBuf, refresh: Duration, limits: FileLimits) -> Result<Self, String> {
        let (text, stamp) = bounded_read::read(&path, &limits).map_err(|e| e.to_string())?;
        let table = parse(&path, &text)?;
        Ok(Self {
            path,
            refresh,
            limits,
            loaded: Mutex::new(Loaded {
                at: Instant::now(),
                stamp: Some(stamp),
                table: Arc::new(table),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The table in hand and whether this caller should look at the file (at most one caller
    /// per refresh interval does).
    fn current(&self) -> (Table, Option<Option<FileStamp>>) {
        let mut loaded = self.lock();
        if loaded.at.elapsed() < self.refresh {
            return (loaded.table.clone(), None);
        }
        loaded.at = Instant::now();
        (loaded.table.clone(), Some(loaded.stamp))
    }

    async fn lookup(&self, tenant: &str) -> Option<String> {
        let (mut table, due) = self.current();
        if let Some(previous) = due {
            if let Some(fresh) = self.refreshed(previous).await {
                table = fresh;
            }
        }
        table.get(tenant).cloned()
    }

    /// A new table if the file changed and reads and parses; `None` to keep the one in hand.
    async fn refreshed(&self, previous: Option<FileStamp>) -> Option<Table> {
        let stamp = bounded_read::stamp_async(self.path.clone(), self.limits).await;
        if stamp.is_ok() && stamp.as_ref().ok() == previous.as_ref() {
            return None;
        }
        let read = bounded_read::read_async(self.path.clone(), self.limits)
            .await
            .map_err(|e| e.to_string())
            .and_then(|(text, stamp)| Ok((parse(&self.path, &text)?, stamp)));
        match read {
            Ok((table, stamp)) => {
                let table = Arc::new(table);
                let mut loaded = self.lock();
                loaded.table = table.clone();
                loaded.stamp = Some(stamp);
                Some(table)
            }
            Err(error) => {
                tracing::warn!(%error, "tenant table unreadable; keeping the last good one");
                None
            }
        }
    }
}

fn parse(path: &std::path::Path, text: &str) -> Result<HashMap<String, String>, String> {
    crate::config::check_expansion(text).map_err(|e| match e.line {
        Some(line) => format!("{}:{line}: {e}", path.display()),
        None => format!("{}: {e}", path.display()),
    })?;
    let raw: RawTable =
        serde_yaml::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(raw.tenants)
}

impl TierSource for FileTiers {
    fn fetch<'a>(&'a self, tenant: &'a str) -> TierFuture<'a> {
        Box::pin(async move { Ok(self.lookup(tenant).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replace(path: &std::path::Path, text: &str) {
        let next = path.with_extension("next");
        std::fs::write(&next, text).expect("write");
        std::fs::rename(&next, path).expect("rename");
    }

    #[tokio::test]
    async fn the_file_is_reread_after_the_refresh_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, "tenants:\n  acme: enterprise\n").expect("write");
        let limits = FileLimits::default();
        let tiers = FileTiers::new(path.clone(), Duration::ZERO, limits).expect("valid");
        assert_eq!(tiers.lookup("acme").await.as_deref(), Some("enterprise"));
        replace(&path, "tenants:\n  acme: free\n");
        assert_eq!(tiers.lookup("acme").await.as_deref(), Some("free"));
        replace(&path, "tenants: [");
        assert_eq!(
            tiers.lookup("acme").await.as_deref(),
            Some("free"),
            "last good table kept"
        );
        std::fs::remove_file(&path).expect("rm");
        std::os::unix::fs::symlink("/dev/zero", &path).expect("symlink");
        assert_eq!(
            tiers.lookup("acme").await.as_deref(),
            Some("free"),
            "a device is not read; last good table kept"
        );
        assert!(FileTiers::new(dir.path().join("missing.yaml"), Duration::ZERO, limits).is_err());
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        assert!(FileTiers::new(zero, Duration::ZERO, limits).is_err());
    }
}
