//! Who sluice is on Redis and how it proves the server is Redis: the ACL user and password that
//! override the URLs', and TLS (rustls, never OpenSSL) for `rediss://` URLs, with a CA bundle
//! (the system's roots by default: `SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS bundle; the built-in
//! Mozilla roots only where the system has none), a client certificate for mutual TLS, and an
//! `insecure` switch for self-signed test setups. Files are read once, bounded, when the store is
//! built.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::Once;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Largest PEM file read (a CA bundle of the whole Mozilla set is ~250 KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Credentials and TLS for every connection.
#[derive(Clone, Default)]
pub struct Access {
    /// ACL user on the data nodes, overriding the URL's.
    pub username: Option<String>,
    /// Password on the data nodes, overriding the URL's.
    pub password: Option<String>,
    /// TLS material, used by `rediss://` URLs.
    pub tls: TlsOptions,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// TLS material, loaded.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// CA bundle and client certificate (each `None` when not configured).
    pub certificates: Option<TlsCertificates>,
    /// Verify the chain but not that the certificate names the host (single primary, Cluster).
    pub skip_hostname: bool,
    /// Skip certificate verification entirely.
    pub insecure: bool,
}

impl TlsOptions {
    /// The certificates to hand to redis-rs (empty: the built-in roots, no client certificate).
    pub fn certificates(&self) -> TlsCertificates {
        self.certificates.clone().unwrap_or(TlsCertificates {
            client_tls: None,
            root_cert: None,
        })
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let certs = self.certificates.as_ref();
        f.debug_struct("TlsOptions")
            .field("ca", &certs.is_some_and(|c| c.root_cert.is_some()))
            .field(
                "client_cert",
                &certs.is_some_and(|c| c.client_tls.is_some()),
            )
            .field("verify_hostname", &!self.skip_hostname)
            .field("insecure", &self.insecure)
            .finish()
    }
}

/// For log lines: what the TLS settings amount to, in words.
impl fmt::Display for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.insecure {
            return f.write_str("certificates not verified (redis.tls.insecure)");
        }
        let certs = self.certificates.as_ref();
        let ca = if certs.is_some_and(|c| c.root_cert.is_some()) {
            "the configured CA"
        } else {
            "the system CAs"
        };
        let client = if certs.is_some_and(|c| c.client_tls.is_some()) {
            "a client certificate"
        } else {
            "no client certificate"
        };
        let host = if self.skip_hostname {
            "hostname not checked"
        } else {
            "hostname checked"
        };
        write!(f, "for rediss:// URLs: {ca}, {client}, {host}")
    }
}

/// Files that make up the TLS settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsFiles<'a> {
    /// CA bundle (PEM).
    pub ca: Option<&'a Path>,
    /// Client certificate chain (PEM).
    pub cert: Option<&'a Path>,
    /// Client key (PEM).
    pub key: Option<&'a Path>,
}

impl TlsOptions {
    /// Reads and checks the files (each PEM must parse, so a wrong file fails at start, not at the
    /// first connection).
    /// Without `ca_file`, `rediss://` URLs (`uses_tls`) trust what the system trusts:
    /// [`system_roots`].
    pub fn load(files: TlsFiles<'_>, insecure: bool, uses_tls: bool) -> Result<Self, String> {
        let root_cert = match files.ca {
            Some(path) => Some(read_certificates("redis.tls.ca_file", path)?),
            None if uses_tls && !insecure => system_roots()?,
            None => None,
        };
        let client_tls = match (files.cert, files.key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read_certificates("redis.tls.cert_file", cert)?,
                client_key: read_key("redis.tls.key_file", key)?,
            }),
            (None, None) => None,
            _ => return Err("redis.tls: cert_file and key_file go together".into()),
        };
        let certificates =
            (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
                client_tls,
                root_cert,
            });
        let options = Self {
            certificates,
            skip_hostname: false,
            insecure,
        };
        // redis-rs parses the PEMs when a client is built: do it once now, for the errors.
        install_crypto_provider();
        redis::Client::build_with_tls("rediss://localhost", options.certificates())
            .map_err(|e| format!("redis.tls: {e}"))?;
        Ok(options)
    }
}

/// A PEM file holding at least one certificate, each of which parses.
/// The roots the system trusts, as one PEM bundle, the way OpenSSL, curl and Go find them:
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` when set, else the OS bundle (`/etc/ssl/certs/...` and the
/// other usual places). `None` when the system has none at all: redis-rs then uses the Mozilla
/// roots compiled in. A named file that cannot be read is an error, not a silent fallback.
pub fn system_roots() -> Result<Option<Vec<u8>>, String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        if let Some(error) = found.errors.first() {
            return Err(format!(
                "redis.tls: the system's CA certificates cannot be read ({error}); fix \
                 SSL_CERT_FILE / SSL_CERT_DIR or set redis.tls.ca_file"
            ));
        }
        tracing::info!("no system CA certificates found; trusting the built-in Mozilla roots");
        return Ok(None);
    }
    for error in &found.errors {
        tracing::warn!(%error, "a system CA certificate source was skipped");
    }
    let mut pem = Vec::with_capacity(found.certs.len() * 2048);
    for cert in &found.certs {
        pem_encode(cert.as_ref(), &mut pem);
    }
    Ok(Some(pem))
}

/// Appends `der` as a PEM `CERTIFICATE` block (base64 in 64-column lines).
fn pem_encode(der: &[u8], out: &mut Vec<u8>) {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(b"-----END CERTIFICATE-----\n");
}

fn read_certificates(setting: &str, path: &Path) -> Result<Vec<u8>, String> {
    let bytes = read_pem(setting, path)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        cert.map_err(|e| format!("{setting} {}: {e}", path.display()))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!(
            "{setting} {}: no CERTIFICATE in it",
            path.display()
        ));
    }
    Ok(bytes)
}

/// A PEM file holding a private key.
fn read_key(setting: &str, path: &Path) -> Result<Vec<u8>, String> {
    let bytes = read_pem(setting, path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| format!("{setting} {}: no private key in it ({e})", path.display()))?;
    Ok(bytes)
}

fn read_pem(setting: &str, path: &Path) -> Result<Vec<u8>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("{setting} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{setting} {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!("{setting} {}: larger than 1 MiB", path.display()));
    }
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{setting} {}: not a PEM file", path.display()));
    }
    Ok(bytes)
}

/// rustls needs one process-wide crypto provider; sluice uses ring's. Idempotent.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An error means another provider was installed first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Whether `error` came from TLS (handshake, certificate verification), for the error kind.
pub fn is_tls_error(error: &(dyn std::error::Error + 'static)) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next = Some(error);
    let mut depth = 0;
    while let Some(error) = next.take() {
        depth += 1;
        if depth > 8 {
            return false;
        }
        if error.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        // redis-rs keeps the cause behind an `Arc`, which `source()` hands out as itself.
        next = match error.downcast_ref::<Shared>() {
            Some(shared) => Some(&**shared as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_debug_output() {
        let access = Access {
            username: Some("app".into()),
            password: Some("s3cret".into()),
            tls: TlsOptions::default(),
        };
        let text = format!("{access:?}");
        assert!(text.contains("app") && !text.contains("s3cret"), "{text}");
    }

    #[test]
    fn files_that_are_not_pem_are_refused_at_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").expect("write");
        let files = TlsFiles {
            ca: Some(&path),
            ..TlsFiles::default()
        };
        let error = TlsOptions::load(files, false, true).expect_err("refused");
        assert!(
            error.contains("redis.tls.ca_file") && error.contains("not a PEM"),
            "{error}"
        );
        // A key where the CA bundle belongs: PEM, but no certificate in it.
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";
        std::fs::write(&path, key).expect("write");
        let error = TlsOptions::load(files, false, true).expect_err("refused");
        assert!(error.contains("no CERTIFICATE"), "{error}");
        let missing = TlsFiles {
            ca: Some(Path::new("/nonexistent/ca.pem")),
            ..TlsFiles::default()
        };
        assert!(TlsOptions::load(missing, false, true).is_err());
    }
}
