//! A check's answer written as JSON by hand: the bytes serde_json writes for [`CheckReply`]
//! (same fields, order, `null`s and escapes; the tests hold them equal), without serde's map
//! machinery, which cost about 7% of a `/v1/check`'s instructions (callgrind).

use super::CheckReply;

impl CheckReply<'_> {
    /// Appends the answer's JSON to `out`: exactly `serde_json::to_vec(self)`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut digits = itoa::Buffer::new();
        let mut number =
            |out: &mut Vec<u8>, n: u64| out.extend_from_slice(digits.format(n).as_bytes());
        out.extend_from_slice(if self.allowed {
            b"{\"allowed\":true,\"policy\":"
        } else {
            b"{\"allowed\":false,\"policy\":"
        });
        match self.policy {
            Some(name) => string(out, name),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(window) = self.window {
            out.extend_from_slice(b",\"window\":");
            number(out, window as u64);
        }
        out.extend_from_slice(b",\"limit\":");
        match self.limit {
            Some(limit) => number(out, limit),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"remaining\":");
        match self.remaining {
            Some(remaining) => number(out, remaining),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"reset_after_ms\":");
        number(out, self.reset_after_ms);
        out.extend_from_slice(b",\"retry_after_ms\":");
        number(out, self.retry_after_ms);
        out.extend_from_slice(b",\"mode\":\"");
        out.extend_from_slice(self.mode.as_str().as_bytes());
        out.push(b'"');
        if let Some(error) = self.error {
            out.extend_from_slice(b",\"error\":");
            string(out, error);
        }
        if let Some(seconds) = self.retry_after_sec {
            out.extend_from_slice(b",\"retry_after_sec\":");
            number(out, seconds);
        }
        if let Some(permit) = self.permit {
            out.extend_from_slice(b",\"permit\":");
            string(out, permit);
        }
        if let Some(reservation) = self.reservation {
            out.extend_from_slice(b",\"reservation\":");
            string(out, reservation);
        }
        out.push(b'}');
    }
}

/// A JSON string: as it is between quotes when nothing in it needs an escape (policy names,
/// error codes, permits and reservations never do), else serde_json's own escaping.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, s).is_err() {
        // Writing to a Vec does not fail; an empty string keeps the JSON whole regardless.
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::CheckReply;
    use crate::check::Mode;

    fn same_as_serde(reply: &CheckReply<'_>) {
        let mut ours = Vec::new();
        reply.write_json(&mut ours);
        let theirs = serde_json::to_vec(reply).expect("serialises");
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs)
        );
    }

    #[test]
    fn every_shape_is_serdes() {
        let allowed = CheckReply {
            allowed: true,
            policy: Some("public_api"),
            window: None,
            limit: Some(150),
            remaining: Some(149),
            reset_after_ms: 60,
            retry_after_ms: 0,
            mode: Mode::Enforced,
            error: None,
            retry_after_sec: None,
            permit: None,
            reservation: None,
        };
        same_as_serde(&allowed);
        same_as_serde(&CheckReply {
            policy: None,
            limit: None,
            remaining: None,
            reset_after_ms: 0,
            ..allowed.clone()
        });
        same_as_serde(&CheckReply {
            allowed: false,
            window: Some(1),
            remaining: Some(0),
            retry_after_ms: u64::MAX,
            mode: Mode::LocalLimit,
            error: Some("rate_limit"),
            retry_after_sec: Some(u64::MAX),
            ..allowed.clone()
        });
        same_as_serde(&CheckReply {
            policy: Some("quote\" back\\slash \u{1} tab\t é 🦀"),
            permit: Some("p.1-abc_DEF"),
            reservation: Some("r.2-xyz_GHI"),
            mode: Mode::FailClosed,
            error: Some("limiter_unavailable"),
            ..allowed
        });
    }

    fn mode() -> impl Strategy<Value = Mode> {
        proptest::sample::select(Mode::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn any_reply_is_serdes(
            allowed: bool,
            policy in proptest::option::of(any::<String>()),
            window in proptest::option::of(any::<usize>()),
            limit: Option<u64>,
            remaining: Option<u64>,
            reset_after_ms: u64,
            retry_after_ms: u64,
            mode in mode(),
            error in proptest::option::of(proptest::sample::select(vec!["rate_limit", "limiter_unavailable"])),
            retry_after_sec: Option<u64>,
            permit in proptest::option::of(any::<String>()),
            reservation in proptest::option::of(any::<String>()),
        ) {
            same_as_serde(&CheckReply {
                allowed,
                policy: policy.as_deref(),
                window,
                limit,
                remaining,
                reset_after_ms,
                retry_after_ms,
                mode,
                error,
                retry_after_sec,
                permit: permit.as_deref(),
                reservation: reservation.as_deref(),
            });
        }
    }
}
