//! The `sluice inject` command line: read a file or stdin, write YAML to stdout, report to stderr.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{inject_str, Options};

/// Exit code when the input cannot be injected (sysexits EX_USAGE / EX_DATAERR family: 64).
const EXIT_REFUSED: u8 = 64;
/// Exit code when the input file cannot be read (sysexits EX_NOINPUT).
const EXIT_NO_INPUT: u8 = 66;

/// Arguments of `sluice inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to inject; `-` or nothing reads stdin.
    file: Option<PathBuf>,
    /// Image of the sidecar.
    #[arg(long, default_value_t = super::sidecar::default_image())]
    image: String,
    /// ConfigMap holding `policies.yaml`.
    #[arg(long, default_value = "sluice-policies")]
    policies_configmap: String,
    /// Secret whose keys are `SLUICE_REDIS__*` variables (optional: without it, the embedded
    /// store).
    #[arg(long, default_value = "sluice-redis")]
    redis_secret: String,
    /// Pods sharing each limit, for the `local` failure mode (default: the workload's
    /// `spec.replicas`, else 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    replicas: Option<u64>,
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
        image: args.image,
        policies_configmap: args.policies_configmap,
        redis_secret: args.redis_secret,
        replicas: args.replicas,
        overwrite: args.overwrite,
        skip_unknown: args.skip_unknown,
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
    if injected.changed.is_empty() && injected.unchanged.is_empty() {
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
