//! `sluice top`: the partitions each policy denied most on a running daemon (`GET /v1/top` on
//! its admin listener), then those shadow policies would have blocked most, as a table or the
//! daemon's JSON. Exit 0 shown, 64 bad usage or request,
//! 69 the daemon is unreachable.

use std::path::PathBuf;
use std::process::ExitCode;

use axum::http::Method;
use clap::Args;

use super::counters::admin_target;
use super::{ask_daemon, fail, field, EXIT_CONFIG};
use sluice::client::Target;

/// `sluice top ...`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Only this policy (default: every policy with a denial or a shadow would-block).
    #[arg(long, short)]
    policy: Option<String>,
    /// Partitions per policy (1 to 64).
    #[arg(long, short = 'n', default_value_t = 10)]
    limit: usize,
    /// The daemon's admin listener: http://127.0.0.1:7071, 127.0.0.1:7071 or localhost:7071
    /// (default: $SLUICE_ADMIN_URL, else `listen.admin` from the settings).
    #[arg(long, value_parser = Target::parse_http)]
    admin: Option<Target>,
    /// Settings file used to find the admin listener when neither --admin nor
    /// $SLUICE_ADMIN_URL is given.
    #[arg(long, short, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Print the daemon's JSON answer as is.
    #[arg(long)]
    json: bool,
}

/// Runs `sluice top`.
pub(super) fn run(args: TopArgs) -> ExitCode {
    let target = match admin_target(args.admin.as_ref(), args.config.as_deref()) {
        Ok(target) => target,
        Err(error) => return fail(EXIT_CONFIG, error),
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(policy) = &args.policy {
        query.append_pair("policy", policy);
    }
    query.append_pair("limit", &args.limit.to_string());
    let path = format!("/v1/top?{}", query.finish());
    match ask_daemon(&target, Method::GET, &path, None, args.json, table) {
        Ok(200) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_CONFIG),
        Err(code) => code,
    }
}

/// A table for people: one block per policy, one row per partition; denials first, then
/// shadow would-blocks.
fn table(status: u16, json: &serde_json::Value) -> String {
    if status != 200 {
        return format!(
            "error {status}: {}: {}",
            field(json, "error"),
            field(json, "reason")
        );
    }
    let raw = json["raw_partitions"] == true;
    let mut out = String::new();
    let lists = |name: &str| json[name].as_array().map_or(&[][..], Vec::as_slice);
    let (denied, shadow) = (lists("policies"), lists("shadow"));
    if denied.is_empty() {
        out.push_str("no denials yet");
    }
    blocks(
        &mut out,
        denied,
        raw,
        "denials",
        "DENIALS",
        "LAST DENIED (UTC)",
    );
    // A daemon from before would-block lists has no `shadow` field: nothing to say of it.
    if json.get("shadow").is_some() {
        out.push_str("\n\n");
        if shadow.is_empty() {
            out.push_str("no shadow would-blocks yet");
        }
        blocks(
            &mut out,
            shadow,
            raw,
            "shadow would-blocks (nothing blocked)",
            "WOULD",
            "LAST WOULD-BLOCK (UTC)",
        );
    }
    let held = lists("concurrency");
    if !held.is_empty() {
        out.push_str("\n\n");
        held_blocks(&mut out, held, raw);
    }
    out
}

/// One block per concurrency policy: its partitions with the slots held now.
fn held_blocks(out: &mut String, lists: &[serde_json::Value], raw: bool) {
    for (i, policy) in lists.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!(
            "policy {}: permits held now, per partition this pod took permits in (at most {})\n",
            field(policy, "policy"),
            field(policy, "capacity"),
        ));
        out.push_str(&format!(
            "{:>6} {:>6} {:>10} {:<24} {:<16} PARTITION",
            "HELD", "LIMIT", "ACQUIRED", "LAST ACQUIRED (UTC)", "FINGERPRINT"
        ));
        for entry in policy["entries"].as_array().map_or(&[][..], Vec::as_slice) {
            let partition = if raw {
                field(entry, "partition")
            } else {
                "(loopback clients only)".to_owned()
            };
            let held = entry["held"]
                .as_u64()
                .map_or_else(|| "?".to_owned(), |n| n.to_string());
            out.push_str(&format!(
                "\n{held:>6} {:>6} {:>10} {:<24} {:<16} {partition}",
                field(entry, "limit"),
                field(entry, "acquired"),
                utc(entry["last_acquired_unix_ms"].as_u64().unwrap_or(0)),
                field(entry, "fingerprint"),
            ));
        }
    }
}

/// One block per list of `lists`.
fn blocks(
    out: &mut String,
    lists: &[serde_json::Value],
    raw: bool,
    what: &str,
    count: &str,
    last: &str,
) {
    for (i, policy) in lists.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!(
            "policy {}: {} {what} (top {} of at most {} partitions tracked)\n",
            field(policy, "policy"),
            field(policy, "denials"),
            policy["entries"].as_array().map_or(0, Vec::len),
            field(policy, "capacity"),
        ));
        out.push_str(&format!(
            "{:>10} {:>8} {:<24} {:<16} {}",
            count, "±ERROR", last, "FINGERPRINT", "PARTITION"
        ));
        for entry in policy["entries"].as_array().map_or(&[][..], Vec::as_slice) {
            let partition = if raw {
                let cut = if entry["partition_truncated"] == true {
                    "…"
                } else {
                    ""
                };
                format!("{}{cut}", field(entry, "partition"))
            } else {
                "(loopback clients only)".to_owned()
            };
            out.push_str(&format!(
                "\n{:>10} {:>8} {:<24} {:<16} {}",
                field(entry, "denials"),
                field(entry, "error"),
                utc(entry["last_denied_unix_ms"].as_u64().unwrap_or(0)),
                field(entry, "fingerprint"),
                partition,
            ));
        }
    }
}

/// `2026-12-04T03:29:22.123Z` from milliseconds since the epoch (civil-from-days, no crate).
fn utc(ms: u64) -> String {
    let secs = ms / 1_000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        ms % 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_partitions_print_with_their_slots_held() {
        let json = serde_json::json!({
            "raw_partitions": true, "policies": [], "shadow": [],
            "concurrency": [{"policy": "gen", "capacity": 64, "entries": [
                {"fingerprint": "00000000000000aa", "partition": "acme", "held": 7, "limit": 8,
                 "acquired": 12, "last_acquired_unix_ms": 0},
                {"fingerprint": "00000000000000bb", "partition": "beta", "held": null, "limit": 8,
                 "acquired": 1, "last_acquired_unix_ms": 0}]}]
        });
        let out = table(200, &json);
        assert!(out.contains("policy gen: permits held now"), "{out}");
        let rows: Vec<&str> = out
            .lines()
            .filter(|l| l.ends_with("acme") || l.ends_with("beta"))
            .collect();
        assert_eq!(rows.len(), 2, "{out}");
        assert!(
            rows[0]
                .trim_start()
                .starts_with("7      8         12 1970-01-01T00:00:00.000Z"),
            "{out}"
        );
        assert!(rows[1].trim_start().starts_with('?'), "{out}");
        // A daemon that lists none prints nothing of it.
        let none = table(
            200,
            &serde_json::json!({"policies": [], "shadow": [], "concurrency": []}),
        );
        assert!(!none.contains("permits held"), "{none}");
    }

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_796_355_762_123), "2026-12-04T03:42:42.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
