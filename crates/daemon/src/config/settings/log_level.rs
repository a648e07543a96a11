//! `log.level` checked at load: a tracing filter reads `verbose` as "everything from the target
//! named verbose", so a typo would silence the daemon. Each comma-separated directive must be a
//! level, or `target=level` with a Rust path as the target.

/// Levels a directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Accepts `info`, `sluice=debug,warn`, `sluice::store=trace`; refuses anything else.
pub fn validate(filter: &str) -> Result<(), String> {
    if filter.trim().is_empty() {
        return Err("empty; use a level such as \"info\"".into());
    }
    for directive in filter.split(',').map(str::trim) {
        let (target, level) = match directive.split_once('=') {
            Some((target, level)) => (Some(target), level),
            None => (None, directive),
        };
        if !LEVELS.iter().any(|known| level.eq_ignore_ascii_case(known)) {
            return Err(format!(
                "{directive:?}: {level:?} is not a level (one of {})",
                LEVELS.join(", ")
            ));
        }
        let target_ok = target.is_none_or(|t| {
            !t.is_empty()
                && t.split("::").all(|part| {
                    !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                })
        });
        if !target_ok {
            return Err(format!("{directive:?}: the target is not a module path"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validate;

    #[test]
    fn levels_and_targets_pass_typos_do_not() {
        for good in [
            "info",
            "WARN",
            "sluice=debug,warn",
            "sluice::store=trace",
            "off",
        ] {
            assert!(validate(good).is_ok(), "{good}");
        }
        for bad in ["verbose", "", "sluice=loud", "info,", "=info", "a b=info"] {
            assert!(validate(bad).is_err(), "{bad}");
        }
    }
}
