//! `sluice counters get|reset`: a partition's counter on a running daemon's admin listener
//! (`/v1/counters`). Exit 0 done, 2 the store could not answer, 64 bad usage or request, 69 the
//! daemon is unreachable. A tiered policy asked without its tier descriptor is shown with a
//! warning on stderr (and `tier_warning` in the JSON): its figures are the base quota's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use axum::http::Method;
use clap::{Args, Subcommand};

use super::{ask_daemon, fail, field, parse_descriptors, EXIT_CONFIG};
use sluice::client::{self, Target};
use sluice::config::Settings;

/// `sluice counters ...`.
#[derive(Debug, Subcommand)]
pub enum CountersCommand {
    /// Show a partition's counter in its policy's terms (nothing is spent).
    Get {
        #[command(flatten)]
        counter: CounterArgs,
        /// The cost whose `allowed` / `retry_after_ms` are shown.
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// Reset a partition's counter: its next request sees a full quota (on every pod).
    Reset {
        #[command(flatten)]
        counter: CounterArgs,
    },
}

/// Which counter, and which daemon.
#[derive(Debug, Args)]
pub struct CounterArgs {
    /// The policy.
    #[arg(long, short)]
    policy: String,
    /// A descriptor of the policy's key, repeatable: -d ip=203.0.113.7
    #[arg(short = 'd', long = "descriptor", value_name = "NAME=VALUE")]
    descriptors: Vec<String>,
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

/// Runs `sluice counters ...`.
pub fn run(command: CountersCommand) -> ExitCode {
    let (args, method, cost) = match &command {
        CountersCommand::Get { counter, cost } => (counter, Method::GET, Some(*cost)),
        CountersCommand::Reset { counter } => (counter, Method::DELETE, None),
    };
    let descriptors = match parse_descriptors(&args.descriptors) {
        Ok(descriptors) => descriptors,
        Err(error) => return fail(EXIT_CONFIG, error),
    };
    let target = match admin_target(args.admin.as_ref(), args.config.as_deref()) {
        Ok(target) => target,
        Err(error) => return fail(EXIT_CONFIG, error),
    };
    let path = client::counters_path(&args.policy, &descriptors, cost);
    // The answer is printed by the closure (as is, or summarized), so that a warning in it goes
    // to stderr either way.
    let status = match ask_daemon(&target, method, &path, None, false, |status, json| {
        if let Some(warning) = json["tier_warning"].as_str() {
            eprintln!("sluice: warning: {warning}");
        }
        if args.json {
            json.to_string()
        } else {
            summarize(status, &command, json)
        }
    }) {
        Ok(status) => status,
        Err(code) => return code,
    };
    match status {
        200 => ExitCode::SUCCESS,
        503 => ExitCode::from(2),
        _ => ExitCode::from(EXIT_CONFIG),
    }
}

/// The admin listener to ask: `--admin`, `SLUICE_ADMIN_URL`, then `listen.admin` of the settings
/// (file and `SLUICE_*` variables, as `serve` reads them).
pub(super) fn admin_target(
    admin: Option<&Target>,
    config: Option<&Path>,
) -> Result<Target, String> {
    if let Some(target) = admin {
        return Ok(target.clone());
    }
    if let Some(url) = std::env::var("SLUICE_ADMIN_URL")
        .ok()
        .filter(|v| !v.is_empty())
    {
        return Target::parse_http(&url).map_err(|e| format!("SLUICE_ADMIN_URL: {e}"));
    }
    let (_, resolved) = Settings::load(config).map_err(|e| format!("invalid settings: {e}"))?;
    Ok(Target::Tcp(resolved.listen.admin))
}

/// One line for people.
fn summarize(status: u16, command: &CountersCommand, json: &serde_json::Value) -> String {
    let field = |name: &str| field(json, name);
    match (status, command) {
        (200, CountersCommand::Get { .. }) => {
            let mut line = format!(
                "{} policy={} key={} remaining={}/{} reset_after_ms={} cost={} retry_after_ms={}",
                if json["allowed"] == true {
                    "open"
                } else {
                    "blocked"
                },
                field("policy"),
                field("key"),
                field("remaining"),
                field("limit"),
                field("reset_after_ms"),
                field("cost"),
                field("retry_after_ms"),
            );
            for extra in ["tier", "local_layer_retry_after_ms"] {
                if !json[extra].is_null() {
                    line.push_str(&format!(" {extra}={}", field(extra)));
                }
            }
            line
        }
        (200, CountersCommand::Reset { .. }) => {
            let keys: Vec<&str> = json["keys"]
                .as_array()
                .map(|keys| keys.iter().filter_map(|k| k.as_str()).collect())
                .unwrap_or_default();
            format!(
                "reset policy={} key={} existed={} fleet={}",
                field("policy"),
                keys.join(","),
                field("existed"),
                field("fleet"),
            )
        }
        _ => format!("error {status}: {}: {}", field("error"), field("reason")),
    }
}
