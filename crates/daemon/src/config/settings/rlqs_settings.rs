//! The budget of Envoy's rate limit quota service (`[envoy.rlqs]`): how many buckets the
//! daemon keeps for RLQS streams, per stream, per connection and in all, and how large a
//! bucket's id may be. Every bucket kept is counted against all three; past any of them a new
//! bucket is answered without being kept.

use serde::{Deserialize, Serialize};

use super::SettingsError;

/// Default most buckets one RLQS stream keeps (an Envoy's reports all go to one stream).
pub const DEFAULT_MAX_BUCKETS_PER_STREAM: usize = 1_000;
/// Default most buckets the RLQS streams of one connection keep together.
pub const DEFAULT_MAX_BUCKETS_PER_CONNECTION: usize = 2_000;
/// Default most buckets the daemon keeps over every RLQS stream.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000;
/// Default most bytes of a bucket id (its keys and values together).
pub const DEFAULT_MAX_BUCKET_ID_BYTES: usize = 1_024;
/// Most buckets accepted for any of the three counts.
pub const MAX_BUCKETS_SETTING: usize = 1_000_000;
/// Largest bucket id accepted for `max_bucket_id_bytes`.
pub const MAX_BUCKET_ID_BYTES_SETTING: usize = 65_536;

/// `[envoy.rlqs]`: the budget of RLQS buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlqsSettings {
    /// Most buckets one stream keeps.
    pub max_buckets_per_stream: usize,
    /// Most buckets the streams of one connection keep together.
    pub max_buckets_per_connection: usize,
    /// Most buckets the daemon keeps in all.
    pub max_buckets: usize,
    /// Most bytes of a bucket id's keys and values; a larger id is refused unread further and
    /// never echoed back.
    pub max_bucket_id_bytes: usize,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        Self {
            max_buckets_per_stream: DEFAULT_MAX_BUCKETS_PER_STREAM,
            max_buckets_per_connection: DEFAULT_MAX_BUCKETS_PER_CONNECTION,
            max_buckets: DEFAULT_MAX_BUCKETS,
            max_bucket_id_bytes: DEFAULT_MAX_BUCKET_ID_BYTES,
        }
    }
}

impl RlqsSettings {
    /// Checks each count is 1 to [`MAX_BUCKETS_SETTING`] and the id size 1 to
    /// [`MAX_BUCKET_ID_BYTES_SETTING`].
    pub fn validate(&self) -> Result<(), SettingsError> {
        for (name, value) in [
            ("max_buckets_per_stream", self.max_buckets_per_stream),
            (
                "max_buckets_per_connection",
                self.max_buckets_per_connection,
            ),
            ("max_buckets", self.max_buckets),
        ] {
            if value == 0 || value > MAX_BUCKETS_SETTING {
                return Err(SettingsError(format!(
                    "envoy.rlqs.{name}: must be 1 to {MAX_BUCKETS_SETTING}, got {value}"
                )));
            }
        }
        let bytes = self.max_bucket_id_bytes;
        if bytes == 0 || bytes > MAX_BUCKET_ID_BYTES_SETTING {
            return Err(SettingsError(format!(
                "envoy.rlqs.max_bucket_id_bytes: must be 1 to {MAX_BUCKET_ID_BYTES_SETTING}, got {bytes}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_is_checked_by_name() {
        RlqsSettings::default().validate().expect("defaults valid");
        let zero = RlqsSettings {
            max_buckets_per_connection: 0,
            ..RlqsSettings::default()
        };
        let err = zero.validate().unwrap_err().0;
        assert!(
            err.starts_with("envoy.rlqs.max_buckets_per_connection"),
            "{err}"
        );
        let huge = RlqsSettings {
            max_bucket_id_bytes: MAX_BUCKET_ID_BYTES_SETTING + 1,
            ..RlqsSettings::default()
        };
        let err = huge.validate().unwrap_err().0;
        assert!(err.starts_with("envoy.rlqs.max_bucket_id_bytes"), "{err}");
    }
}
