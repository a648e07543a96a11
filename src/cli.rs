//! The command line: `sluice serve`, `sluice check`, `sluice report`, `sluice top`,
//! `sluice counters`, `sluice config check`,
//! `sluice inject`, `sluice injector` (feature `k8s`), `sluice bench` (feature `bench`).
//! Exit codes: 0 ok / allowed, 1 denied or runtime failure, 2 limiter unavailable, 64 bad usage or
//! configuration, 69 daemon unreachable.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod counters;
mod report;
mod rlqs_check;
mod top;

use sluice::app::{shutdown_signal, App, StartError};
use sluice::client::{self, Target};
use sluice::config::{load_policies, FileLimits, Settings};
use sluice::transport::wire::CheckBody;

/// Exit code for bad usage or configuration (sysexits EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;
/// Exit code when the daemon cannot be reached (sysexits EX_UNAVAILABLE).
pub const EXIT_UNREACHABLE: u8 = 69;

/// sluice: a rate-limit sidecar.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve {
        /// Settings file (TOML); default config/sluice.toml when present.
        #[arg(long, short, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Ask a running daemon whether a request may go through (exit 0 allowed, 1 denied).
    Check(CheckArgs),
    /// Spend a cost known only afterwards (an LLM's tokens) on a running daemon, whatever its
    /// counters hold (exit 0 spent, 2 unavailable).
    Report(CheckArgs),
    /// The partitions denied most, per policy, on a running daemon (its admin listener).
    Top(top::TopArgs),
    /// See or reset a partition's counter on a running daemon (its admin listener).
    Counters {
        #[command(subcommand)]
        command: counters::CountersCommand,
    },
    /// Validate configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    #[cfg(feature = "k8s")]
    /// Add the sluice native sidecar to Kubernetes YAML (stdin or a file) and print it.
    Inject(sluice_k8s::inject::InjectArgs),
    #[cfg(feature = "k8s")]
    /// The mutating admission webhook that injects the sidecar into opted-in pods.
    Injector(Box<sluice_k8s::injector::InjectorArgs>),
    #[cfg(feature = "bench")]
    /// Benchmark: own Redis and daemon, load through both transports and raw-Redis baselines.
    Bench(sluice_bench::BenchArgs),
    #[cfg(feature = "bench")]
    /// The benchmark's naive-sidecar baseline (started by `sluice bench`).
    #[command(hide = true)]
    BenchNaiveSidecar(sluice_bench::NaiveArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a policy file (YAML) or a settings file (TOML, with the policy file it names).
    Check {
        /// The file to validate.
        file: PathBuf,
        /// An Envoy configuration with the rate limit quota filter (YAML: a bootstrap, a
        /// listener or its `http_filters`): says which policies each of its buckets selects over
        /// RLQS, and fails on a bucket that selects none (it would be allowed everything).
        #[arg(long, value_name = "ENVOY_YAML")]
        rlqs: Option<PathBuf>,
    },
    /// Print the sluice policies equivalent to an envoyproxy/ratelimit configuration file.
    Convert {
        /// The envoyproxy/ratelimit file (YAML; several domains as several documents).
        file: PathBuf,
    },
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// Check only this policy.
    #[arg(long, short)]
    policy: Option<String>,
    /// A descriptor, repeatable: -d ip=203.0.113.7
    #[arg(short = 'd', long = "descriptor", value_name = "NAME=VALUE")]
    descriptors: Vec<String>,
    /// Units to spend.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Evaluate without spending.
    #[arg(long)]
    dry_run: bool,
    /// Daemon's Unix socket (default: $SLUICE_SOCKET, else $SLUICE_URL, else from settings).
    #[arg(long, conflicts_with = "http")]
    socket: Option<PathBuf>,
    /// Daemon's TCP address: http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070.
    #[arg(long, visible_alias = "url", value_parser = Target::parse_http)]
    http: Option<Target>,
    /// Settings file used to find the daemon when neither --socket nor --http is given.
    #[arg(long, short, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Print the daemon's JSON answer as is.
    #[arg(long)]
    json: bool,
}

/// Parses the command line and runs the command. A usage error exits 64 (2 means "limiter
/// unavailable" in `sluice check`'s contract).
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Serve { config } => serve(config.as_deref()),
        Command::Check(args) => check(args),
        Command::Report(args) => report::run(args),
        Command::Top(args) => top::run(args),
        Command::Counters { command } => counters::run(command),
        Command::Config {
            command: ConfigCommand::Check { file, rlqs },
        } => config_check(&file, rlqs.as_deref()),
        Command::Config {
            command: ConfigCommand::Convert { file },
        } => match sluice::config::envoy::convert_file(&file) {
            Ok(policies) => {
                print!("{policies}");
                ExitCode::SUCCESS
            }
            Err(error) => fail(EXIT_CONFIG, error),
        },
        #[cfg(feature = "k8s")]
        Command::Inject(args) => sluice_k8s::inject::run(args),
        #[cfg(feature = "k8s")]
        Command::Injector(args) => sluice_k8s::injector::run(*args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => sluice_bench::run(args),
        #[cfg(feature = "bench")]
        Command::BenchNaiveSidecar(args) => sluice_bench::run_naive_sidecar(args),
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sluice: {message}");
    ExitCode::from(code)
}

fn serve(config: Option<&Path>) -> ExitCode {
    // Bad settings are refused here, before the runtime starts; `App::build` parses them again
    // itself, as it also builds from settings made in code (tests).
    let settings = match Settings::load(config) {
        Ok((settings, _)) => settings,
        Err(error) => return fail(EXIT_CONFIG, format_args!("invalid settings: {error}")),
    };
    sluice::telemetry::init_tracing(&settings.log);
    let threads = match settings.worker_threads {
        // A sidecar shares its node with the app (and often Redis): half the cores, 1 to 4.
        0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 4)),
        n => n,
    };
    // One thread: tokio's current-thread runtime, as linkerd2-proxy does with one core. A
    // multi-thread runtime of one worker runs each stream task then the h2 connection task
    // (the LIFO slot), so every gRPC response was flushed alone (1.1 write syscalls per check);
    // on one thread the answers of one Redis batch leave together, with no hand-off between
    // the block_on thread and the worker.
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    let runtime = match builder.thread_name("sluice-worker").enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fail(1, format_args!("cannot start the runtime: {error}")),
    };
    runtime.block_on(async {
        match App::build(&settings).await {
            Ok(app) => {
                app.run(shutdown_signal()).await;
                ExitCode::SUCCESS
            }
            Err(StartError::Config(error)) => {
                fail(EXIT_CONFIG, format_args!("invalid configuration:\n{error}"))
            }
            Err(StartError::Bind(error)) => fail(1, error),
        }
    })
}

/// `-d NAME=VALUE` arguments as descriptors.
fn parse_descriptors(pairs: &[String]) -> Result<sluice::limit::Descriptors, String> {
    let mut descriptors = sluice::limit::Descriptors::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("descriptor {pair:?} is not NAME=VALUE"));
        };
        descriptors.insert(name.to_owned(), value.to_owned());
    }
    Ok(descriptors)
}

/// A runtime for one request to a daemon.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| fail(1, format_args!("cannot start the runtime: {error}")))
}

/// Sends one request to a running daemon and prints its answer: the JSON as is (`json`), else
/// `summary(status, json)`. The answer's status, or the exit code (69: unreachable).
fn ask_daemon(
    target: &Target,
    method: axum::http::Method,
    path: &str,
    body: Option<Vec<u8>>,
    json: bool,
    summary: impl FnOnce(u16, &serde_json::Value) -> String,
) -> Result<u16, ExitCode> {
    let reply = runtime()?
        .block_on(client::request(target, method, path, body))
        .map_err(|error| fail(EXIT_UNREACHABLE, error))?;
    let answer = reply.json();
    let status = reply.status.as_u16();
    if json {
        println!("{answer}");
    } else {
        println!("{}", summary(status, &answer));
    }
    Ok(status)
}

/// A field of a JSON answer as text (`-` when absent).
fn field(json: &serde_json::Value, name: &str) -> String {
    match &json[name] {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn check(args: CheckArgs) -> ExitCode {
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
        "/v1/check",
        Some(payload),
        args.json,
        summarize,
    ) {
        Ok(status) => status,
        Err(code) => return code,
    };
    match status {
        200 => ExitCode::SUCCESS,
        429 => ExitCode::from(1),
        503 => ExitCode::from(2),
        _ => ExitCode::from(EXIT_CONFIG),
    }
}

/// The daemon to ask, in the order every client of sluice uses: `--socket`, `--http`/`--url`,
/// `SLUICE_SOCKET`, `SLUICE_URL` (what `sluice inject` sets), then the settings file.
fn target(args: &CheckArgs) -> Result<Target, String> {
    if let Some(path) = &args.socket {
        return Ok(Target::Unix(path.clone()));
    }
    if let Some(target) = &args.http {
        return Ok(target.clone());
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(path) = env("SLUICE_SOCKET") {
        return Ok(Target::Unix(PathBuf::from(path)));
    }
    if let Some(url) = env("SLUICE_URL") {
        return Target::parse_http(&url).map_err(|e| format!("SLUICE_URL: {e}"));
    }
    default_target(args.config.as_deref())
}

fn default_target(config: Option<&Path>) -> Result<Target, String> {
    let (_, resolved) = Settings::load(config).map_err(|e| format!("invalid settings: {e}"))?;
    let listen = resolved.listen;
    match (listen.socket, listen.http) {
        (Some(path), _) => Ok(Target::Unix(path)),
        (None, Some(addr)) => Ok(Target::Tcp(addr)),
        (None, None) => Err("no listener configured; pass --socket or --http".into()),
    }
}

/// One line for people: the decision and its figures.
fn summarize(status: u16, json: &serde_json::Value) -> String {
    let field = |name: &str| field(json, name);
    match status {
        200 | 429 => format!(
            "{} policy={} limit={} remaining={} reset_after_ms={} retry_after_ms={} mode={}",
            if status == 200 { "allowed" } else { "denied" },
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

fn config_check(file: &Path, rlqs: Option<&Path>) -> ExitCode {
    let is_settings = file.extension().is_some_and(|ext| ext == "toml");
    let (policy_file, limits, replicas) = if is_settings {
        let (settings, resolved) = match Settings::load(Some(file)) {
            Ok(loaded) => loaded,
            Err(error) => return fail(EXIT_CONFIG, format_args!("{}: {error}", file.display())),
        };
        // The same checks `serve` makes before it connects (TLS files, URLs, clients).
        if let Err(error) = sluice::app::check_redis(&settings.redis, resolved.redis.as_ref()) {
            return fail(EXIT_CONFIG, format_args!("{}: {error}", file.display()));
        }
        if let Some(warning) = settings.embedded_store_warning(resolved.redis.as_ref()) {
            eprintln!("{}: warning: {warning}", file.display());
        }
        (settings.policies, settings.files, settings.local.replicas)
    } else {
        (file.to_owned(), FileLimits::default(), 1)
    };
    match load_policies(&policy_file, &limits) {
        Ok((set, _)) => {
            for warning in sluice::config::local_limit_warnings(&set, replicas) {
                eprintln!("{}: warning: {warning}", policy_file.display());
            }
            let names: Vec<&str> = set.iter().map(|p| p.name()).collect();
            println!(
                "{}: ok, {} policies: {}",
                policy_file.display(),
                set.len(),
                names.join(", ")
            );
            match rlqs {
                Some(envoy) => rlqs_check::run(&set, envoy, &limits),
                None => ExitCode::SUCCESS,
            }
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}
