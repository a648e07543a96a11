//! `sluice report`: spend a cost known only afterwards (an LLM's tokens) on a running daemon
//! (`POST /v1/report`), whatever its counters hold. Exit 0 spent (within the limit or past it:
//! the line says which), 2 the limiter could not take it (a fail-closed policy), 64 bad usage or
//! request, 69 the daemon is unreachable.

use std::process::ExitCode;

use super::{ask_daemon, fail, field, parse_descriptors, target, CheckArgs, EXIT_CONFIG};
use sluice::transport::wire::CheckBody;

/// Runs `sluice report`.
pub(super) fn run(args: CheckArgs) -> ExitCode {
    let descriptors = match parse_descriptors(&args.descriptors) {
        Ok(descriptors) => descriptors,
        Err(error) => return fail(EXIT_CONFIG, error),
    };
    let target = match target(&args) {
        Ok(target) => target,
        Err(error) => return fail(EXIT_CONFIG, error),
    };
    let body = CheckBody {
        policy: args.policy,
        descriptors,
        cost: args.cost,
        dry_run: args.dry_run,
        reserve: false,
    };
    let payload = serde_json::to_vec(&body).unwrap_or_default();
    let status = match ask_daemon(
        &target,
        axum::http::Method::POST,
        "/v1/report",
        Some(payload),
        args.json,
        summarize,
    ) {
        Ok(status) => status,
        Err(code) => return code,
    };
    match status {
        200 => ExitCode::SUCCESS,
        503 => ExitCode::from(2),
        _ => ExitCode::from(EXIT_CONFIG),
    }
}

/// One line for people: spent within or past the limit, and what is left.
fn summarize(status: u16, json: &serde_json::Value) -> String {
    let field = |name: &str| field(json, name);
    match status {
        200 => format!(
            "{} policy={} limit={} remaining={} reset_after_ms={} retry_after_ms={} mode={}",
            if json["within_limit"] == true {
                "spent"
            } else {
                "spent_over_limit"
            },
            field("policy"),
            field("limit"),
            field("remaining"),
            field("reset_after_ms"),
            field("retry_after_ms"),
            field("mode"),
        ),
        503 => format!("unavailable policy={}", field("policy")),
        _ => format!("error {status}: {}: {}", field("error"), field("reason")),
    }
}
