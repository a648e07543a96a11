//! The `sluice inject` command line: read a file or stdin, write YAML to stdout, report to stderr.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::sidecar::{SecretKey, DEFAULT_FINGERPRINT_KEY};
use super::{inject_str, Options};

/// Exit code when the input cannot be injected (sysexits EX_USAGE / EX_DATAERR family: 64).
const EXIT_REFUSED: u8 = 64;
/// Exit code when the input file cannot be read (sysexits EX_NOINPUT).
const EXIT_NO_INPUT: u8 = 66;

/// The sidecar's knobs, shared by `sluice inject` and `sluice injector`.
#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    /// Image of the sidecar.
    #[arg(long, default_value_t = super::sidecar::default_image())]
    pub image: String,
    /// ConfigMap holding `policies.yaml` (a pod's `sluice.io/policies-configmap` overrides it).
    #[arg(long, default_value = "sluice-policies")]
    pub policies_configmap: String,
    /// Secret whose keys are `SLUICE_REDIS__*` variables (optional: without it, the embedded
    /// store).
    #[arg(long, default_value = "sluice-redis")]
    pub redis_secret: String,
    /// The sidecar does not start without the Redis Secret (`optional: false`): a pod that
    /// cannot reach the shared counters then waits (CreateContainerConfigError) instead of
    /// enforcing the whole limit alone on the embedded store.
    #[arg(long)]
    pub require_redis_secret: bool,
    /// Pods sharing each limit, for the `local` failure mode (a pod's `sluice.io/replicas`
    /// overrides it; default: the workload's `spec.replicas`, else 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub replicas: Option<u64>,
    /// Serve Envoy's gRPC rate limit service too, on 127.0.0.1:8081 and
    /// /var/run/sluice/rls.sock (a pod's `sluice.io/grpc: enabled|disabled` overrides it).
    #[arg(long)]
    pub grpc: bool,
    /// Secret holding `shadow.fingerprint_key` (`NAME`, or `NAME:KEY`; the key defaults to
    /// `fingerprint-key`): every pod then names a partition by the same fingerprint. Required
    /// at run time: a pod without it does not start.
    #[arg(long, value_name = "NAME[:KEY]", value_parser = parse_secret_key)]
    pub fingerprint_secret: Option<SecretKey>,
}

/// `NAME` or `NAME:KEY`, each a non-empty Kubernetes name (a DNS subdomain; a key may also hold
/// `_`), at most 253 bytes.
fn parse_secret_key(text: &str) -> Result<SecretKey, String> {
    let (name, key) = text
        .split_once(':')
        .unwrap_or((text, DEFAULT_FINGERPRINT_KEY));
    let valid = |part: &str, extra: &[char]| {
        !part.is_empty()
            && part.len() <= 253
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || extra.contains(&c))
    };
    if !valid(name, &[])
        || name.starts_with(['-', '.'])
        || name.chars().any(|c| c.is_ascii_uppercase())
    {
        return Err(format!(
            "{name:?} is not a Secret name (lower case letters, digits, '-', '.')"
        ));
    }
    if !valid(key, &['_']) {
        return Err(format!(
            "{key:?} is not a Secret key (letters, digits, '-', '_', '.')"
        ));
    }
    Ok(SecretKey {
        name: name.to_owned(),
        key: key.to_owned(),
    })
}

impl SidecarArgs {
    /// The options these arguments give (no `--overwrite`, no `--skip-unknown`).
    pub fn options(&self) -> Options {
        Options {
            image: self.image.clone(),
            policies_configmap: self.policies_configmap.clone(),
            redis_secret: self.redis_secret.clone(),
            require_redis_secret: self.require_redis_secret,
            replicas: self.replicas,
            grpc: self.grpc,
            fingerprint_secret: self.fingerprint_secret.clone(),
            ..Options::default()
        }
    }
}

/// Arguments of `sluice inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to inject; `-` or nothing reads stdin.
    file: Option<PathBuf>,
    #[command(flatten)]
    sidecar: SidecarArgs,
    /// Replace a sluice container, volume, mount, variable or label whose settings differ.
    #[arg(long)]
    overwrite: bool,
    /// Copy documents of unknown kinds unchanged instead of refusing them.
    #[arg(long)]
    skip_unknown: bool,
}

/// Runs `sluice inject`: 0 written, 64 refused (nothing written), 66 unreadable input.
pub fn run(args: InjectArgs) -> ExitCode {
    let mut input = String::new();
    let read = match args.file.as_deref() {
        None => std::io::stdin().read_to_string(&mut input).map(|_| ()),
        Some(path) if path.as_os_str() == "-" => {
            std::io::stdin().read_to_string(&mut input).map(|_| ())
        }
        Some(path) => std::fs::read_to_string(path).map(|text| input = text),
    };
    if let Err(error) = read {
        let source = args
            .file
            .as_ref()
            .map_or("stdin".into(), |p| p.display().to_string());
        eprintln!("sluice inject: cannot read {source}: {error}");
        return ExitCode::from(EXIT_NO_INPUT);
    }
    let options = Options {
        overwrite: args.overwrite,
        skip_unknown: args.skip_unknown,
        ..args.sidecar.options()
    };
    let injected = match inject_str(&input, &options) {
        Ok(injected) => injected,
        Err(error) => {
            eprintln!("sluice inject: {error}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    for id in &injected.changed {
        eprintln!("{id} injected");
    }
    for id in &injected.unchanged {
        eprintln!("{id} already injected, unchanged");
    }
    for id in &injected.opted_out {
        eprintln!("{id} says sluice.io/inject: disabled, unchanged");
    }
    for warning in &injected.warnings {
        eprintln!("warning: {warning}");
    }
    let templates = injected.changed.len() + injected.unchanged.len() + injected.opted_out.len();
    if templates == 0 {
        eprintln!("sluice inject: no pod template in the input; copied unchanged");
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(injected.yaml.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("sluice inject: cannot write: {error}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
