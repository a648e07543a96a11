//! The Lua scripts (one per algorithm, from `lua/`), their SHA-1s, the arguments each takes and
//! how their integer replies become [`Decision`]s.

use redis::Value;

use crate::limit::{Algorithm, Decision, Micros, NEVER};

/// A script's source and its SHA-1 (what `EVALSHA` names).
#[derive(Debug, Clone)]
pub struct Script {
    /// Lua source, sent with `EVAL` when a node answers `NOSCRIPT`.
    pub source: &'static str,
    /// Hex SHA-1 of the source.
    pub sha: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: sha1_smol::Sha1::from(source.as_bytes())
                .digest()
                .to_string(),
        }
    }
}

/// The three algorithm scripts.
#[derive(Debug, Clone)]
pub struct Scripts {
    token_bucket: Script,
    sliding_log: Script,
    fixed_window: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            token_bucket: Script::new(include_str!("../../../lua/token_bucket.lua")),
            sliding_log: Script::new(include_str!("../../../lua/sliding_log.lua")),
            fixed_window: Script::new(include_str!("../../../lua/fixed_window.lua")),
        }
    }
}

/// One script invocation on one key.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    /// The script to run.
    pub script: Script,
    /// `KEYS[1]`.
    pub key: String,
    /// `ARGV`, as integers.
    pub args: Vec<u64>,
}

impl Scripts {
    /// Every script's source.
    pub fn sources(&self) -> Vec<&'static str> {
        vec![
            self.token_bucket.source,
            self.sliding_log.source,
            self.fixed_window.source,
        ]
    }

    /// The script for `algorithm`.
    pub fn for_algorithm(&self, algorithm: &Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket(_) => &self.token_bucket,
            Algorithm::SlidingLog(_) => &self.sliding_log,
            Algorithm::FixedWindow(_) => &self.fixed_window,
        }
    }

    /// The call that decides (and, with `commit`, records) `cost` on `key`. `now` is for tests
    /// only: the daemon passes `None` so that scripts read Redis `TIME`.
    pub fn call(
        &self,
        algorithm: &Algorithm,
        key: String,
        cost: u64,
        commit: bool,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args = match algorithm {
            Algorithm::TokenBucket(b) => vec![b.limit(), b.period_us(), b.capacity(), cost],
            Algorithm::SlidingLog(l) => vec![l.limit(), l.period_us(), cost],
            Algorithm::FixedWindow(w) => vec![w.limit(), w.period_us(), cost],
        };
        args.push(u64::from(commit));
        args.extend(now);
        ScriptCall {
            script: self.for_algorithm(algorithm).clone(),
            key,
            args,
        }
    }
}

/// Reads a script reply `{allowed, limit, remaining, reset_after_us, retry_after_us}`.
pub fn parse_reply(value: &Value) -> Result<Decision, String> {
    let fields: Vec<i64> =
        redis::from_redis_value_ref(value).map_err(|e| format!("unexpected script reply: {e}"))?;
    let [allowed, limit, remaining, reset, retry] = fields[..] else {
        return Err(format!(
            "script reply has {} fields, expected 5",
            fields.len()
        ));
    };
    let non_negative =
        |n: i64| u64::try_from(n).map_err(|_| format!("negative field {n} in script reply"));
    Ok(Decision {
        allowed: allowed == 1,
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        reset_after_us: non_negative(reset)?,
        retry_after_us: if retry < 0 {
            NEVER
        } else {
            non_negative(retry)?
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::TokenBucket;

    #[test]
    fn every_script_documents_its_contract() {
        let scripts = Scripts::default();
        for script in [
            &scripts.token_bucket,
            &scripts.sliding_log,
            &scripts.fixed_window,
        ] {
            for part in [
                "KEYS[1]",
                "ARGV[1]",
                "returns",
                "now_us",
                "TESTS ONLY",
                "TTL",
            ] {
                assert!(script.source.contains(part), "missing {part}");
            }
            assert_eq!(script.sha.len(), 40);
            let mut code = script
                .source
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"));
            assert!(
                code.all(|line| !line.contains("tostring(")),
                "tostring prints 14 significant digits; times have 16"
            );
        }
    }

    #[test]
    fn arguments_follow_the_script_headers() {
        let bucket =
            Algorithm::TokenBucket(TokenBucket::new(1000, 60_000_000, 150).expect("valid"));
        let call = Scripts::default().call(&bucket, "k".into(), 2, true, None);
        assert_eq!(call.args, vec![1000, 60_000_000, 150, 2, 1]);
        let call = Scripts::default().call(&bucket, "k".into(), 2, false, Some(7));
        assert_eq!(call.args, vec![1000, 60_000_000, 150, 2, 0, 7]);
    }

    #[test]
    fn replies_parse_and_never_maps_from_minus_one() {
        let reply = Value::Array([0, 10, 0, 5, -1].map(Value::Int).to_vec());
        let decision = parse_reply(&reply).expect("parses");
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after_us, NEVER);
        assert!(parse_reply(&Value::Int(1)).is_err());
    }
}
