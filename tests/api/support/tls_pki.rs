//! Certificates for the TLS tests, generated per test with rcgen: a CA, a server certificate for
//! `localhost` and 127.0.0.1 (signed by it), a client certificate (signed by it), and a second,
//! unrelated CA; plus a `redis-server` serving only TLS on a free port, killed on drop.

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use tempfile::TempDir;

use crate::redis_server::{free_port, spawn_sentinel, spawn_server, wait_until};

/// PEM files in a temporary directory.
pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    /// Generates every certificate.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = ca("sluice test CA");
        let server = leaf(&ca, "redis", &["localhost"], true);
        let named = leaf(&ca, "redis.internal", &["redis.internal"], false);
        let client = leaf(&ca, "sluice", &[], false);
        let other = ca_pem("some other CA");
        let write =
            |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).expect("write pem");
        write("ca.pem", &ca.pem());
        write("server.pem", &server.0);
        write("server.key", &server.1);
        write("named.pem", &named.0);
        write("named.key", &named.1);
        write("client.pem", &client.0);
        write("client.key", &client.1);
        write("other-ca.pem", &other);
        Self { dir }
    }

    /// A file of the set (`ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`,
    /// `other-ca.pem`, and `named.pem`/`named.key`: a server certificate for `redis.internal`
    /// only).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `redis-server` arguments that serve TLS only (`--port 0`) on `port`.
    pub fn server_args(&self, port: u16, auth_clients: bool) -> Vec<String> {
        let path = |name: &str| self.path(name).display().to_string();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path("server.pem"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ]
    }

    /// A TLS client of `url` that trusts the CA and presents the client certificate.
    pub fn client(&self, url: &str) -> redis::Client {
        sluice::store::redis::access::install_crypto_provider();
        let read = |name: &str| std::fs::read(self.path(name)).expect("read pem");
        let certs = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read("client.pem"),
                client_key: read("client.key"),
            }),
            root_cert: Some(read("ca.pem")),
        };
        redis::Client::build_with_tls(url, certs).expect("tls client")
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca")
}

fn ca_pem(name: &str) -> String {
    ca(name).pem()
}

/// A certificate and key signed by `ca`; a server certificate also names 127.0.0.1 and may act as
/// a client (Redis nodes connect to each other with it).
fn leaf(
    ca: &CertifiedIssuer<'_, KeyPair>,
    cn: &str,
    names: &[&str],
    with_ip: bool,
) -> (String, String) {
    let is_server = !names.is_empty();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if is_server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    if with_ip {
        let ip = "127.0.0.1".parse().expect("ip");
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, ca).expect("sign");
    (cert.pem(), key.serialize_pem())
}

/// A `redis-server` that speaks TLS only, killed on drop.
pub struct TlsRedis {
    child: Child,
    /// Its TLS port.
    pub port: u16,
    dir: TempDir,
}

impl TlsRedis {
    /// Starts it with `extra` arguments and waits until a TLS PING (with the client
    /// certificate) answers.
    pub fn start(pki: &TestPki, auth_clients: bool, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut args = pki.server_args(port, auth_clients);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = spawn_server(&dir, port, &args);
        let server = Self { child, port, dir };
        // Up is all this asks (whatever name its certificate has): the tests verify.
        let client = pki.client(&format!("{}/#insecure", server.url()));
        wait_until("redis-server --tls-port", || {
            client
                .get_connection_with_timeout(Duration::from_millis(300))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
        server
    }

    /// Starts a TLS-only Sentinel (`--tls-replication yes`: it reaches the primary over TLS too)
    /// watching this server as `mymaster`, and waits until it names it.
    pub fn sentinel(&self, pki: &TestPki) -> TlsRedis {
        let port = free_port();
        let conf = self.dir.path().join(format!("sentinel-{port}.conf"));
        let mut text = String::new();
        let args = pki.server_args(port, false);
        for pair in args.chunks(2) {
            text.push_str(&format!(
                "{} {}\n",
                pair[0].trim_start_matches("--"),
                pair[1]
            ));
        }
        text.push_str(&format!(
            "bind 127.0.0.1\ndir {}\ntls-replication yes\nsentinel monitor mymaster 127.0.0.1 {} 1\n",
            self.dir.path().display(),
            self.port
        ));
        std::fs::write(&conf, text).expect("sentinel conf");
        let sentinel = TlsRedis {
            child: spawn_sentinel(&conf),
            port,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let client = pki.client(&format!("rediss://127.0.0.1:{port}"));
        let primary = self.port;
        wait_until("TLS Sentinel naming the primary", || {
            client
                .get_connection_with_timeout(Duration::from_millis(300))
                .and_then(|mut c| {
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg("mymaster")
                        .query::<(String, u16)>(&mut c)
                })
                .is_ok_and(|(_, port)| port == primary)
        });
        sentinel
    }

    /// `rediss://localhost:<port>` (the name the server certificate carries).
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    /// A synchronous TLS connection as the default user, for inspecting state.
    pub fn connection(&self, pki: &TestPki) -> redis::Connection {
        pki.client(&self.url())
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to TLS redis")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three TLS-only cluster-enabled primaries (`--tls-cluster yes`: the bus and the slot map speak
/// TLS), created with `redis-cli --tls --cluster create`.
pub struct TlsCluster {
    /// The nodes.
    pub nodes: Vec<TlsRedis>,
}

impl TlsCluster {
    /// Starts the nodes, creates the cluster and waits for `cluster_state:ok`.
    pub fn start(pki: &TestPki) -> Self {
        Self::start_with(pki, "server")
    }

    /// Like [`TlsCluster::start`], the nodes serving `<cert>.pem` / `<cert>.key`.
    pub fn start_with(pki: &TestPki, cert: &str) -> Self {
        let cert_file = pki.path(&format!("{cert}.pem")).display().to_string();
        let key_file = pki.path(&format!("{cert}.key")).display().to_string();
        let mut nodes: Vec<TlsRedis> = Vec::new();
        for _ in 0..3 {
            let conf = format!("nodes-{}.conf", nodes.len());
            let extra = [
                "--tls-cert-file",
                &cert_file,
                "--tls-key-file",
                &key_file,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ];
            nodes.push(TlsRedis::start(pki, false, &extra));
        }
        let ca = pki.path("ca.pem");
        let status = std::process::Command::new("redis-cli")
            .arg("--tls")
            .arg("--cacert")
            .arg(&ca)
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs (install redis-tools)");
        assert!(status.success(), "redis-cli --tls --cluster create failed");
        for node in &nodes {
            let client = pki.client(&format!("{}/#insecure", node.url()));
            wait_until("TLS cluster_state:ok", || {
                client
                    .get_connection_with_timeout(Duration::from_millis(300))
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
        }
        Self { nodes }
    }

    /// Seed URLs (by name, as the certificate has it).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TlsRedis::url).collect()
    }
}
