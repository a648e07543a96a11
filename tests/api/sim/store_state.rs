//! The store's state against the scripts' invariants: every key under a sequence's prefix
//! expires and holds what a script writes.

/// Checks one key: a TTL (`PTTL` > 0), and a sorted set (a sliding log) or a short string
/// `<int>` or `<int>:<int>`.
pub fn key_invariants(conn: &mut redis::Connection, key: &str) -> Result<(), String> {
    let q = |cmd: &str| redis::cmd(cmd).arg(key).clone();
    let pttl: i64 = q("PTTL").query(conn).map_err(|e| e.to_string())?;
    let kind: String = q("TYPE").query(conn).map_err(|e| e.to_string())?;
    let parses = match kind.as_str() {
        "none" => return Ok(()), // expired between KEYS and now
        "zset" => {
            let members: u64 = q("ZCARD").query(conn).map_err(|e| e.to_string())?;
            (1..=10_000).contains(&members)
        }
        "string" => {
            // Gone since TYPE: the leased lane's keys live for seconds.
            let value: Option<String> = q("GET").query(conn).map_err(|e| e.to_string())?;
            value.is_none_or(|value| value.len() < 64 && string_parses(&value))
        }
        _ => false,
    };
    // -1: no TTL; 0: expiring within the millisecond; -2: gone since KEYS.
    if pttl == -1 {
        return Err(format!(
            "store state: key {key} ({kind}) has no TTL (PTTL {pttl})"
        ));
    }
    if !parses {
        return Err(format!(
            "store state: key {key} holds a {kind} no script writes"
        ));
    }
    Ok(())
}

/// `<int>` (a bucket's TAT, a window's packed count) or `<int>:<int>` (a TAT and remainder).
fn string_parses(value: &str) -> bool {
    let int = |s: &str| s.strip_prefix('-').unwrap_or(s).parse::<u64>().is_ok();
    match value.split_once(':') {
        Some((a, b)) => int(a) && b.parse::<u64>().is_ok(),
        None => int(value),
    }
}
