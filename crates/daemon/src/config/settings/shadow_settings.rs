//! `[shadow]`: the secret that keys partition fingerprints (shadow would-block lines, `/v1/top`),
//! so that every pod given the same secret names a partition the same way and a fleet's logs can
//! be joined. Without it each process draws a random key: fingerprints then match within one
//! process only. The secret is never shown (`Debug` and `config check` mask it).

use serde::{Deserialize, Serialize};

use super::SettingsError;

/// Shortest secret accepted: a shorter one could be found by trying them all against a logged
/// fingerprint of a guessable partition (an IP).
pub const MIN_KEY_BYTES: usize = 16;

/// Shadow mode's log settings.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowSettings {
    /// The fingerprint secret (`SLUICE_SHADOW__FINGERPRINT_KEY`), at least [`MIN_KEY_BYTES`]
    /// bytes; the same on every pod of a fleet. Unset: a random key per process.
    pub fingerprint_key: Option<String>,
}

impl std::fmt::Debug for ShadowSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowSettings")
            .field(
                "fingerprint_key",
                &self.fingerprint_key.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl ShadowSettings {
    /// Refuses a secret too short to keep partitions unguessable.
    pub fn validate(&self) -> Result<(), SettingsError> {
        match &self.fingerprint_key {
            Some(key) if key.len() < MIN_KEY_BYTES => Err(SettingsError(format!(
                "shadow.fingerprint_key: {} bytes, need at least {MIN_KEY_BYTES} (e.g. `openssl \
                 rand -hex 16`)",
                key.len()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_refused_and_keys_never_shown() {
        let short = ShadowSettings {
            fingerprint_key: Some("abc".into()),
        };
        assert!(short.validate().is_err());
        let good = ShadowSettings {
            fingerprint_key: Some("0123456789abcdef-fleet".into()),
        };
        assert!(good.validate().is_ok());
        assert!(ShadowSettings::default().validate().is_ok());
        assert!(!format!("{good:?}").contains("fleet"));
    }
}
