//! The signed tokens the check API hands out and reads back (concurrency permits,
//! reservations): `<id>.<mac>.<payload>`, a 128-bit id from the operating system's CSPRNG (32
//! hex digits), the first 64 bits of HMAC-SHA1 over a domain, the id and the payload (16 hex
//! digits), and the payload in base64url. The key is `shadow.fingerprint_key` (the same on
//! every pod given it, so any pod reads any pod's token), else random per process. Each kind of
//! token has its own domain, so a token of one kind never reads as another.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::shadow_log::Hmac;
use crate::limit::Key;

/// Why a token does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TokenError {
    /// Not a token's shape.
    Malformed(&'static str),
    /// The MAC does not hold: forged, altered, or signed with another key.
    Forged,
}

/// Signs and reads tokens with one key.
pub(super) struct Signer {
    hmac: Hmac,
}

/// An id: 128 bits from the operating system's CSPRNG.
pub(super) fn random_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // The OS refused randomness (never on Linux once booted): ids from the std hasher's
        // random keys, unique per call, still unknowable to clients.
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        let high = state.hash_one(std::time::Instant::now());
        let low = state.hash_one(std::thread::current().id());
        return (u128::from(high) << 64) | u128::from(low);
    }
    u128::from_be_bytes(bytes)
}

impl Signer {
    /// Tokens signed with `secret` (`None`: a random key of this process).
    pub(super) fn new(secret: Option<&[u8]>) -> Self {
        let hmac = match secret {
            Some(secret) => Hmac::new(secret),
            None => Hmac::new(&random_id().to_be_bytes()),
        };
        Self { hmac }
    }

    /// The token of `id` and `payload` in `domain`.
    pub(super) fn seal(&self, domain: &[u8], id: u128, payload: &[u8]) -> String {
        let mac = self.hmac.mac64(&[domain, &id.to_be_bytes(), payload]);
        format!("{id:032x}.{mac:016x}.{}", URL_SAFE_NO_PAD.encode(payload))
    }

    /// The id and payload of a token of `domain` this key signed, at most `max_len` bytes long
    /// (a payload signed here is text: anything else is a forgery).
    pub(super) fn open(
        &self,
        domain: &[u8],
        token: &str,
        max_len: usize,
    ) -> Result<(u128, String), TokenError> {
        if token.len() > max_len {
            return Err(TokenError::Malformed("longer than any token sluice issues"));
        }
        let mut fields = token.splitn(3, '.');
        let (Some(id), Some(mac), Some(payload)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(TokenError::Malformed("expected <id>.<mac>.<partitions>"));
        };
        let hex = |text: &str, len: usize| {
            (text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u128::from_str_radix(text, 16).ok())
                .flatten()
        };
        let (Some(id), Some(mac)) = (hex(id, 32), hex(mac, 16)) else {
            return Err(TokenError::Malformed(
                "the id is 32 hex digits and the mac 16",
            ));
        };
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed("the partitions are not base64url"))?;
        let expected = self.hmac.mac64(&[domain, &id.to_be_bytes(), &payload]);
        if u128::from(expected) != mac {
            return Err(TokenError::Forged);
        }
        let text = String::from_utf8(payload).map_err(|_| TokenError::Forged)?;
        Ok((id, text))
    }
}

/// `policy \0 partition` of a key (partitions escape control bytes, and policy names are
/// `[a-z0-9_-]`, so `\0` and `\n` occur inside neither), pushed onto `out`.
pub(super) fn push_key(out: &mut String, key: &Key) {
    out.push_str(key.policy());
    out.push('\0');
    out.push_str(key.partition());
}

/// The key `push_key` wrote as `text` (a signed payload: anything else is a forgery).
pub(super) fn read_key(text: &str) -> Result<Key, TokenError> {
    let (policy, partition) = text.split_once('\0').ok_or(TokenError::Forged)?;
    Ok(Key::from_partition(
        std::sync::Arc::from(policy),
        partition.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_in_its_domain_with_its_key() {
        let signer = Signer::new(Some(b"k"));
        let token = signer.seal(b"a\0", 7, b"payload");
        assert_eq!(
            signer.open(b"a\0", &token, 100),
            Ok((7, "payload".to_owned()))
        );
        assert_eq!(signer.open(b"b\0", &token, 100), Err(TokenError::Forged));
        assert_eq!(
            Signer::new(Some(b"other")).open(b"a\0", &token, 100),
            Err(TokenError::Forged)
        );
        assert!(matches!(
            signer.open(b"a\0", &token, 10),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn ids_differ() {
        assert_ne!(random_id(), random_id());
    }
}
