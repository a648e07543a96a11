//! `sluice injector`: a mutating admission webhook that adds the sluice sidecar to every new pod
//! that asks for it (`sluice.io/inject: enabled` on the pod or its namespace), like Istio's and
//! Linkerd's injectors. The sidecar is exactly what `sluice inject` adds to the same pod: both run
//! [`crate::inject::inject_template`], and the webhook answers with the difference as a JSONPatch.
//!
//! - `review.rs`: the AdmissionReview v1 request and response;
//! - `mutate.rs`: one pod in, a patch, warnings and an outcome out (pure);
//! - `patch.rs`: the JSONPatch between two JSON values;
//! - `tls.rs`: rustls with a certificate reloaded when its files change;
//! - `server.rs`: the webhook and admin listeners;
//! - `metrics.rs`: admissions by outcome, refusals by reason, certificate reloads;
//! - `certs.rs`: `sluice injector certs`, for clusters without cert-manager.
//!
//! Opting in: the webhook configuration's selectors decide which pods reach the injector (a
//! namespace labelled `sluice.io/inject=enabled`, or a pod labelled so), since namespace labels
//! are not in the AdmissionReview and reading them would take API access and a failure mode of
//! its own. So a pod that reaches the injector without a setting of its own was sent for its
//! namespace and is injected; `sluice.io/inject: disabled` on the pod (label or annotation) opts
//! it out.

pub mod cert_expiry;
pub mod certs;
pub mod metrics;
pub mod mutate;
pub mod patch;
pub mod review;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

pub use server::{Injector, InjectorConfig};
pub use tls::CertFiles;

use crate::inject::SidecarArgs;
use sluice::app::StartError;
use sluice::config::{parse_duration, HumanDuration, LogFormat, LogSettings};

/// Exit code for bad usage or configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

/// Arguments of `sluice injector`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct InjectorArgs {
    #[command(subcommand)]
    command: Option<InjectorCommand>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum InjectorCommand {
    /// Write a CA and a serving certificate for the injector's Service (clusters without
    /// cert-manager) and print the caBundle.
    Certs(certs::CertsArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Webhook address (HTTPS).
    #[arg(long, env = "SLUICE_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Admin address (HTTP: /livez, /readyz, /metrics).
    #[arg(long, env = "SLUICE_INJECTOR_ADMIN", default_value = "0.0.0.0:7071")]
    admin: SocketAddr,
    /// Serving certificate chain (PEM), re-read when it changes.
    #[arg(long, env = "SLUICE_INJECTOR_TLS_CERT", required = true)]
    tls_cert: Option<PathBuf>,
    /// Serving key (PEM), re-read when it changes.
    #[arg(long, env = "SLUICE_INJECTOR_TLS_KEY", required = true)]
    tls_key: Option<PathBuf>,
    /// How often to look for a new certificate (file metadata only, unless it changed).
    #[arg(long, default_value = "10s", value_parser = duration)]
    tls_reload_interval: HumanDuration,
    /// Most connections open at once on each listener.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    max_connections: u32,
    /// How long in-flight reviews may take to finish at shutdown.
    #[arg(long, default_value = "10s", value_parser = duration)]
    shutdown_grace: HumanDuration,
    /// Log format: text or json.
    #[arg(long, env = "SLUICE_INJECTOR_LOG_FORMAT", default_value = "json", value_parser = log_format)]
    log_format: LogFormat,
    /// Log level (a tracing filter; RUST_LOG overrides it).
    #[arg(long, env = "SLUICE_INJECTOR_LOG_LEVEL", default_value = "info")]
    log_level: String,
    #[command(flatten)]
    sidecar: SidecarArgs,
}

fn duration(text: &str) -> Result<HumanDuration, String> {
    parse_duration(text)
        .map(HumanDuration)
        .and_then(|d| match d.0 {
            0 => Err("must be above 0".into()),
            _ => Ok(d),
        })
}

fn log_format(text: &str) -> Result<LogFormat, String> {
    match text {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("text or json".into()),
    }
}

/// Runs `sluice injector` (or `sluice injector certs`).
pub fn run(args: InjectorArgs) -> ExitCode {
    match args.command {
        Some(InjectorCommand::Certs(certs)) => certs::run(certs),
        None => serve(args.serve),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    sluice::telemetry::init_tracing(&LogSettings {
        format: args.log_format,
        level: args.log_level.clone(),
        ..LogSettings::default()
    });
    let (Some(cert), Some(key)) = (args.tls_cert, args.tls_key) else {
        eprintln!("sluice injector: --tls-cert and --tls-key are required");
        return ExitCode::from(EXIT_CONFIG);
    };
    let config = InjectorConfig {
        listen: args.listen,
        admin: args.admin,
        tls: CertFiles { cert, key },
        reload_interval: args.tls_reload_interval.as_std(),
        options: args.sidecar.options(),
        max_connections: args.max_connections as usize,
        shutdown_grace: args.shutdown_grace.as_std(),
    };
    // Small work per review: two threads serve a cluster's pod creations.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-injector")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice injector: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        match Injector::build(config).await {
            Ok(injector) => {
                injector.run(sluice::app::shutdown_signal()).await;
                ExitCode::SUCCESS
            }
            Err(StartError::Config(error)) => {
                eprintln!("sluice injector: {error}");
                ExitCode::from(EXIT_CONFIG)
            }
            Err(StartError::Bind(error)) => {
                eprintln!("sluice injector: {error}");
                ExitCode::from(1)
            }
        }
    })
}
