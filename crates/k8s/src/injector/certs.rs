//! `sluice injector certs`: for clusters without cert-manager, a CA and a serving certificate for
//! the injector's Service DNS names, written as `ca.crt`, `tls.crt` and `tls.key` (the keys of a
//! `kubernetes.io/tls` Secret), and the CA as the base64 `caBundle` the webhook configuration
//! needs, on stdout. The CA's key is never written: to rotate, run it again and replace both the
//! Secret and the `caBundle`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine;
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// Exit code for bad arguments (EX_USAGE).
const EXIT_USAGE: u8 = 64;
/// Exit code when the files cannot be written (EX_CANTCREAT).
const EXIT_CANT_CREATE: u8 = 73;

/// Arguments of `sluice injector certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// The injector's Service.
    #[arg(long, default_value = "sluice-injector")]
    service: String,
    /// The Service's namespace.
    #[arg(long, default_value = "sluice-system")]
    namespace: String,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Directory for ca.crt, tls.crt and tls.key (created if needed; existing files are never
    /// overwritten).
    #[arg(long)]
    out: PathBuf,
    /// Validity of both certificates, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    days: u32,
}

/// PEM texts of a generated set.
#[derive(Debug)]
pub struct Generated {
    /// The CA certificate (`ca.crt`; base64 of it is the `caBundle`).
    pub ca: String,
    /// The serving certificate (`tls.crt`).
    pub cert: String,
    /// The serving key (`tls.key`).
    pub key: String,
}

/// The DNS names the API server may use for `service` in `namespace`.
pub fn service_names(service: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{cluster_domain}"),
    ]
}

/// A new CA and a serving certificate for `names`, valid `days` days from now.
pub fn generate(names: Vec<String>, days: u32) -> Result<Generated, rcgen::Error> {
    let now = OffsetDateTime::now_utc();
    // A little slack for clocks slightly behind this machine's.
    let (not_before, not_after) = (now - Duration::hours(1), now + Duration::days(days.into()));
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "sluice injector CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca.not_before, ca.not_after) = (not_before, not_after);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let common_name = names.get(2).cloned().unwrap_or_default();
    let mut leaf = CertificateParams::new(names)?;
    leaf.distinguished_name
        .push(DnType::CommonName, common_name);
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    (leaf.not_before, leaf.not_after) = (not_before, not_after);
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;
    Ok(Generated {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Runs `sluice injector certs`: 0 written, 64 bad arguments, 73 files not written.
pub fn run(args: CertsArgs) -> ExitCode {
    for (what, value) in [
        ("--service", &args.service),
        ("--namespace", &args.namespace),
    ] {
        if !is_dns_label(value) {
            eprintln!(
                "sluice injector certs: {what} {value:?} is not a DNS label (lowercase letters, \
                 digits and '-', at most 63)"
            );
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if !args.cluster_domain.split('.').all(is_dns_label) {
        eprintln!(
            "sluice injector certs: --cluster-domain {:?} is not a DNS name",
            args.cluster_domain
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let names = service_names(&args.service, &args.namespace, &args.cluster_domain);
    let generated = match generate(names.clone(), args.days) {
        Ok(generated) => generated,
        Err(error) => {
            eprintln!("sluice injector certs: cannot generate: {error}");
            return ExitCode::from(1);
        }
    };
    if let Err(error) = write_all(&args.out, &generated) {
        eprintln!("sluice injector certs: {error}");
        return ExitCode::from(EXIT_CANT_CREATE);
    }
    let bundle = base64::engine::general_purpose::STANDARD.encode(&generated.ca);
    eprintln!(
        "wrote {dir}/ca.crt, tls.crt and tls.key for {names}, valid {days} days.\n\
         Next: kubectl -n {ns} create secret tls sluice-injector-tls --cert={dir}/tls.crt \
         --key={dir}/tls.key\n\
         and put the line below (printed on stdout) as caBundle in both webhooks of the \
         MutatingWebhookConfiguration.",
        dir = args.out.display(),
        names = names.join(", "),
        days = args.days,
        ns = args.namespace,
    );
    println!("{bundle}");
    ExitCode::SUCCESS
}

/// Writes the three files, none of which may exist yet; the key is readable by its owner only.
fn write_all(dir: &Path, generated: &Generated) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = [
        ("ca.crt", &generated.ca, 0o644),
        ("tls.crt", &generated.cert, 0o644),
        ("tls.key", &generated.key, 0o600),
    ];
    if let Some((name, ..)) = files.iter().find(|(name, ..)| dir.join(name).exists()) {
        return Err(format!(
            "{} exists; remove the old files or choose another --out",
            dir.join(name).display()
        ));
    }
    for (name, text, mode) in files {
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut file| file.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// An RFC 1123 label: what Service and namespace names are.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
}
