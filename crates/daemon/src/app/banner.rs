//! What the "sluice ready" line says: the version, the settings file, the policy file (or
//! directory) and the store, so that an operator reading one line knows what is running.

use std::path::Path;

use crate::config::{mask_url, RedisTarget, Settings};

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
    /// `redis` is where the settings say Redis is (`None`: the embedded store).
    pub(super) fn new(settings: &Settings, redis: Option<&RedisTarget>) -> Self {
        Self {
            settings: settings.file.as_deref().map_or_else(
                || "none (defaults and SLUICE_* variables)".to_owned(),
                shown,
            ),
            policies: policies(&settings.policies),
            store: store(redis),
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
pub(super) fn store(redis: Option<&RedisTarget>) -> String {
    let masked = |urls: &[String]| urls.iter().map(|u| mask_url(u)).collect::<Vec<_>>();
    match redis {
        None => "embedded".to_owned(),
        Some(RedisTarget::Single(url)) => format!("redis single {}", mask_url(url)),
        Some(RedisTarget::Cluster(seeds)) => {
            format!("redis cluster [{}]", masked(seeds).join(", "))
        }
        Some(RedisTarget::Sentinel(sentinel)) => format!(
            "redis sentinel {} [{}]",
            sentinel.master,
            masked(&sentinel.nodes).join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisSettings;

    /// The banner's store for `redis`, through the settings' own parse.
    fn store_of(redis: &RedisSettings) -> String {
        store(redis.target().expect("valid").as_ref())
    }

    #[test]
    fn every_store_kind_is_named_and_passwords_masked() {
        let mut redis = RedisSettings::default();
        assert_eq!(store_of(&redis), "embedded");
        redis.url = Some("redis://app:s3cret@10.0.0.5:6380/0".into());
        let single = store_of(&redis);
        assert!(single.starts_with("redis single redis://app:"), "{single}");
        assert!(!single.contains("s3cret"), "{single}");
        redis.url = None;
        redis.cluster = vec!["redis://:s3cret@a:7000".into(), "redis://b:7001".into()];
        let cluster = store_of(&redis);
        assert!(cluster.starts_with("redis cluster ["), "{cluster}");
        assert!(
            !cluster.contains("s3cret") && cluster.contains("b:7001"),
            "{cluster}"
        );
        redis.cluster.clear();
        redis.sentinel.nodes = vec!["redis://:s3cret@s1:26379".into()];
        redis.sentinel.master = "mymaster".into();
        let sentinel = store_of(&redis);
        assert!(
            sentinel.starts_with("redis sentinel mymaster ["),
            "{sentinel}"
        );
        assert!(!sentinel.contains("s3cret"), "{sentinel}");
    }
}
