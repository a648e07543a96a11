//! What the "sluice ready" line says: the version, the settings file, the policy file (or
//! directory) and the store, so that an operator reading one line knows what is running.

use std::path::Path;

use crate::config::{mask_url, RedisSettings, Settings};

/// The ready line's fields, taken from the settings at build time.
#[derive(Debug, Clone)]
pub(super) struct Banner {
    /// The settings file read, or that none was (defaults and `SLUICE_*` variables only).
    pub settings: String,
    /// The policy file or directory.
    pub policies: String,
    /// The store, with any password masked.
    pub store: String,
}

impl Banner {
    pub(super) fn new(settings: &Settings) -> Self {
        Self {
            settings: settings.file.as_deref().map_or_else(
                || "none (defaults and SLUICE_* variables)".to_owned(),
                shown,
            ),
            policies: policies(&settings.policies),
            store: store(&settings.redis),
        }
    }
}

fn shown(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute.display().to_string()
}

fn policies(path: &Path) -> String {
    if path.is_dir() {
        format!("{} (directory)", shown(path))
    } else {
        shown(path)
    }
}

/// `embedded`, `redis single <url>`, `redis cluster [<seeds>]` or `redis sentinel <master>
/// [<sentinels>]`; passwords in URLs are masked (a separate `redis.password` is never shown).
pub(super) fn store(redis: &RedisSettings) -> String {
    let masked = |urls: &[String]| urls.iter().map(|u| mask_url(u)).collect::<Vec<_>>();
    if let Some(url) = redis.url.as_deref().filter(|u| !u.is_empty()) {
        format!("redis single {}", mask_url(url))
    } else if !redis.cluster.is_empty() {
        format!("redis cluster [{}]", masked(&redis.cluster).join(", "))
    } else if !redis.sentinel.nodes.is_empty() {
        format!(
            "redis sentinel {} [{}]",
            redis.sentinel.master,
            masked(&redis.sentinel.nodes).join(", ")
        )
    } else {
        "embedded".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_kind_is_named_and_passwords_masked() {
        let mut redis = RedisSettings::default();
        assert_eq!(store(&redis), "embedded");
        redis.url = Some("redis://app:s3cret@10.0.0.5:6380/0".into());
        let single = store(&redis);
        assert!(single.starts_with("redis single redis://app:"), "{single}");
        assert!(!single.contains("s3cret"), "{single}");
        redis.url = None;
        redis.cluster = vec!["redis://:s3cret@a:7000".into(), "redis://b:7001".into()];
        let cluster = store(&redis);
        assert!(cluster.starts_with("redis cluster ["), "{cluster}");
        assert!(
            !cluster.contains("s3cret") && cluster.contains("b:7001"),
            "{cluster}"
        );
        redis.cluster.clear();
        redis.sentinel.nodes = vec!["redis://:s3cret@s1:26379".into()];
        redis.sentinel.master = "mymaster".into();
        let sentinel = store(&redis);
        assert!(
            sentinel.starts_with("redis sentinel mymaster ["),
            "{sentinel}"
        );
        assert!(!sentinel.contains("s3cret"), "{sentinel}");
    }
}
