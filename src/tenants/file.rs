//! The tenant tier table in a YAML file (`tenants: {acme: enterprise}`), for the embedded store.
//! Re-read at most once per refresh interval; a file that fails to parse keeps the last good
//! table (and is logged).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{TierFuture, TierSource};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    #[serde(default)]
    tenants: HashMap<String, String>,
}

struct Loaded {
    at: Option<Instant>,
    table: HashMap<String, String>,
}

/// Tiers from a YAML file.
pub struct FileTiers {
    path: PathBuf,
    refresh: Duration,
    loaded: Mutex<Loaded>,
}

impl FileTiers {
    /// Reads `path` (now, and again once `refresh` has passed since the last read).
    pub fn new(path: PathBuf, refresh: Duration) -> Result<Self, String> {
        let table = read(&path)?;
        Ok(Self {
            path,
            refresh,
            loaded: Mutex::new(Loaded {
                at: Some(Instant::now()),
                table,
            }),
        })
    }

    fn lookup(&self, tenant: &str) -> Option<String> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.at.is_none_or(|at| at.elapsed() >= self.refresh) {
            loaded.at = Some(Instant::now());
            match read(&self.path) {
                Ok(table) => loaded.table = table,
                Err(error) => {
                    tracing::warn!(%error, "tenant table unreadable; keeping the last good one")
                }
            }
        }
        loaded.table.get(tenant).cloned()
    }
}

fn read(path: &PathBuf) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let raw: RawTable =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(raw.tenants)
}

impl TierSource for FileTiers {
    fn fetch<'a>(&'a self, tenant: &'a str) -> TierFuture<'a> {
        let tier = self.lookup(tenant);
        Box::pin(async move { Ok(tier) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_reread_after_the_refresh_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, "tenants:\n  acme: enterprise\n").expect("write");
        let tiers = FileTiers::new(path.clone(), Duration::ZERO).expect("valid");
        assert_eq!(tiers.lookup("acme").as_deref(), Some("enterprise"));
        std::fs::write(&path, "tenants:\n  acme: free\n").expect("write");
        assert_eq!(tiers.lookup("acme").as_deref(), Some("free"));
        std::fs::write(&path, "tenants: [").expect("write");
        assert_eq!(
            tiers.lookup("acme").as_deref(),
            Some("free"),
            "last good table kept"
        );
        assert!(FileTiers::new(dir.path().join("missing.yaml"), Duration::ZERO).is_err());
    }
}
