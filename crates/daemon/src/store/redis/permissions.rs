//! The ACL user's permissions: asked at every connect (one `EVAL` of `lua/permissions.lua`, which
//! asks Redis' `redis.acl_check_cmd` about each command sluice sends, with its keys and channel,
//! running nothing; on Redis 6.2 it tries the scripts' commands on the probe key), and watched at run time (a refusal is `kind="auth"`). A missing command is a
//! configuration error, not an outage: it is named at warn level once per change (never per
//! check) and shown by `sluice_redis_acl_missing{command}`.

use std::sync::Mutex;

use prometheus::{IntCounterVec, IntGaugeVec};
use redis::{RedisResult, Value};

use super::conn::Conn;
use super::error::{refused_command, ErrorKind};
use crate::config::RedisTarget;

/// The permission probe's source (see its header).
const PROBE: &str = include_str!("../../../lua/permissions.lua");

/// Every command sluice may send, as `ACL SETUSER` names it (`+<name>`), each the label of a
/// `sluice_redis_acl_missing` series. The scripts call `time` .. `del`; the daemon itself sends
/// the rest (`cluster|slots` in a Cluster, `role` to a primary Sentinel named).
pub const COMMANDS: [&str; 19] = [
    "time",
    "getrange",
    "get",
    "zcount",
    "zrange",
    "zremrangebyscore",
    "zremrangebyrank",
    "zadd",
    "pexpire",
    "set",
    "del",
    "eval",
    "evalsha",
    "script|load",
    "hget",
    "publish",
    "subscribe",
    "cluster|slots",
    "role",
];

/// The commands to ask about for one store, with their words as sluice sends them: the
/// counters' and probe's key `probe_key`, the tenant table `tiers_key`, the reset `channel`.
/// `eval` is not asked: the probe is an `EVAL`.
pub fn probe_commands(
    target: &RedisTarget,
    probe_key: &str,
    tiers_key: &str,
    channel: &str,
) -> Vec<(&'static str, Vec<String>)> {
    let k = probe_key;
    let sha = "0".repeat(40);
    let words = |list: &[&str]| list.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let mut commands = vec![
        ("time", words(&["time"])),
        ("getrange", words(&["getrange", k, "0", "63"])),
        ("get", words(&["get", k])),
        ("zcount", words(&["zcount", k, "-inf", "+inf"])),
        (
            "zrange",
            words(&[
                "zrange",
                k,
                "+inf",
                "(0",
                "BYSCORE",
                "REV",
                "LIMIT",
                "0",
                "1",
                "WITHSCORES",
            ]),
        ),
        (
            "zremrangebyscore",
            words(&["zremrangebyscore", k, "-inf", "0"]),
        ),
        ("zremrangebyrank", words(&["zremrangebyrank", k, "0", "-1"])),
        ("zadd", words(&["zadd", k, "NX", "0", "m"])),
        ("pexpire", words(&["pexpire", k, "1"])),
        ("set", words(&["set", k, "1", "PX", "1"])),
        ("del", words(&["del", k])),
        ("evalsha", words(&["evalsha", &sha, "1", k])),
        ("script|load", words(&["script", "load", "return 1"])),
        ("hget", words(&["hget", tiers_key, "tenant"])),
        ("publish", words(&["publish", channel, "m"])),
        ("subscribe", words(&["subscribe", channel])),
    ];
    match target {
        RedisTarget::Cluster(_) => commands.push(("cluster|slots", words(&["cluster", "slots"]))),
        RedisTarget::Sentinel(_) => commands.push(("role", words(&["role"]))),
        RedisTarget::Single(_) => {}
    }
    commands
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// The commands the user may not run (empty: every one granted).
    Missing(Vec<&'static str>),
    /// The probe failed for another reason than a permission.
    Unknown(String),
}

/// Asks Redis which of `commands` the connection's user may not run: one `EVAL`. A refused
/// `EVAL` itself is reported as `eval` missing.
pub async fn probe(
    conn: &mut Conn,
    probe_key: &str,
    commands: &[(&'static str, Vec<String>)],
) -> Probed {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(PROBE).arg(1).arg(probe_key);
    for (_, words) in commands {
        cmd.arg(words.len()).arg(words);
    }
    let reply: RedisResult<Value> = conn.query(&cmd).await.and_then(Value::extract_error);
    let reply = match reply {
        Ok(reply) => reply,
        // The probe itself refused: `EVAL` not granted (named by the reply, or not on 7.0), or
        // the probe key outside the user's keys (the write probe then fails and says so).
        Err(error) if ErrorKind::of(&error) == ErrorKind::Auth => {
            let detail = error.detail().unwrap_or("");
            let named = refused_command(detail).and_then(|c| COMMANDS.iter().find(|n| **n == c));
            return match named {
                Some(command) => Probed::Missing(vec![command]),
                None if detail.contains("key") => Probed::Unknown(error.to_string()),
                None => Probed::Missing(vec!["eval"]),
            };
        }
        Err(error) => return Probed::Unknown(error.to_string()),
    };
    let positions: Vec<i64> = match redis::from_redis_value(reply) {
        Ok(positions) => positions,
        Err(error) => return Probed::Unknown(error.to_string()),
    };
    let mut missing: Vec<&'static str> = positions
        .iter()
        .filter_map(|&p| usize::try_from(p).ok()?.checked_sub(1))
        .filter_map(|i| commands.get(i).map(|(name, _)| *name))
        .collect();
    // The scripts read a value whole with GET where GETRANGE is refused (an ACL line from before
    // GETRANGE was used): only both missing is a missing permission.
    if missing.contains(&"getrange") && !missing.contains(&"get") {
        missing.retain(|name| *name != "getrange");
    }
    Probed::Missing(missing)
}

/// What the store knows about its user's permissions, and what it has said about them.
pub struct AclWatch {
    /// `sluice_redis_acl_missing{command}`: 1 while the last probe found it refused.
    missing: IntGaugeVec,
    /// `sluice_redis_errors_total`: a probe that found a command missing counts one `auth`.
    errors: IntCounterVec,
    /// The last probe's finding, and the last run-time refusal logged.
    said: Mutex<Said>,
}

#[derive(Default)]
struct Said {
    probed: Option<Probed>,
    refused: Option<String>,
}

impl AclWatch {
    /// A watch over the given series (every `COMMANDS` label pre-set by the caller).
    pub fn new(missing: IntGaugeVec, errors: IntCounterVec) -> Self {
        Self {
            missing,
            errors,
            said: Mutex::new(Said::default()),
        }
    }

    /// Records a connect's probe: the gauges, one `auth` error if anything is missing, and a warn
    /// line per missing command when the finding changed since the last probe.
    pub fn probed(&self, found: Probed) {
        let mut said = self
            .said
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Probed::Missing(missing) = &found {
            for command in COMMANDS {
                self.missing
                    .with_label_values(&[command])
                    .set(i64::from(missing.contains(&command)));
            }
            if !missing.is_empty() {
                self.errors
                    .with_label_values(&[ErrorKind::Auth.as_str()])
                    .inc();
            }
        }
        if said.probed.as_ref() == Some(&found) {
            return;
        }
        match &found {
            Probed::Missing(missing) if missing.is_empty() => {
                if said.probed.is_some() {
                    tracing::info!("Redis ACL: the user may now run every command sluice sends");
                }
            }
            Probed::Missing(missing) => {
                for command in missing {
                    tracing::warn!(
                        command,
                        "Redis ACL: the user may not run `{command}`; checks that need it get their \
                         failure mode (kind=\"auth\"): add +{command} (docs/redis.md)"
                    );
                }
            }
            Probed::Unknown(why) => {
                tracing::info!(why = %why, "Redis ACL: could not ask which commands the user may run");
            }
        }
        said.probed = Some(found);
        // A refusal at run time is worth one line again after a change.
        said.refused = None;
    }

    /// A command refused at run time (`kind="auth"`): one warn line per distinct refusal (the
    /// command the reply names, or else the last probe's finding), not one per check.
    pub fn refused(&self, error: &redis::ServerError) {
        let named = error.details().and_then(refused_command);
        let mut said = self
            .said
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let commands = match (named, &said.probed) {
            (Some(command), _) => command.to_owned(),
            (None, Some(Probed::Missing(missing))) if !missing.is_empty() => missing.join(" "),
            _ => "unknown".to_owned(),
        };
        if said.refused.as_deref() == Some(commands.as_str()) {
            return;
        }
        tracing::warn!(
            commands = %commands,
            code = error.code(),
            "Redis ACL refused a command to sluice's user: checks that need it get their failure \
             mode (kind=\"auth\"); see sluice_redis_acl_missing and docs/redis.md"
        );
        said.refused = Some(commands);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_probed_command_has_a_series_and_the_words_are_its_own() {
        let target = RedisTarget::Cluster(vec!["redis://127.0.0.1:1".into()]);
        let commands = probe_commands(&target, "rl:{sluice:probe}", "rl:tenant-tiers", "rl:resets");
        for (name, words) in &commands {
            assert!(COMMANDS.contains(name), "{name}");
            let spelled = match name.split_once('|') {
                Some((command, sub)) => words[..2] == [command, sub],
                None => words[0] == *name,
            };
            assert!(spelled, "{name}: {words:?}");
        }
        assert!(commands.iter().any(|(name, _)| *name == "cluster|slots"));
    }
}
