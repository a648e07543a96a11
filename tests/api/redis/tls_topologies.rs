//! TLS to a Redis Cluster (`--tls-cluster yes`: nodes found through the slot map are reached over
//! TLS with the same CA) and to Sentinel (TLS to the Sentinel and to the primary it names), with
//! the ACL user of docs/redis.md (plus `+cluster|slots` or `+role`) on the data nodes; real `redis-server` processes, certificates generated per test.

use std::time::Duration;

use serde_json::json;

use crate::redis::tls::spawn_on_redis;
use crate::tls_pki::{TestPki, TlsCluster, TlsRedis};

/// Keys in many slots, so that every node of the Cluster is used.
const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 2, period: 1h, failure_mode: closed}
";

const WAIT: Duration = Duration::from_secs(30);

/// Three checks of each of `ips` once Redis answers; every third one must be denied.
async fn assert_enforced(app: &crate::helpers::TestApp, ips: usize) {
    let first = json!({"policy": "login", "descriptors": {"ip": "probe"}});
    crate::wait::eventually_within("connected over TLS", WAIT, || async {
        app.check_tcp(&first).await.status != 503
    })
    .await;
    for ip in 0..ips {
        let check = json!({"policy": "login", "descriptors": {"ip": format!("10.0.0.{ip}")}});
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(app.check_tcp(&check).await.status.as_u16());
        }
        assert_eq!(statuses, [200, 200, 429], "ip {ip}");
    }
}

/// The ACL line of docs/redis.md for user `sluice` (password `pw`) plus `extra`.
fn set_user(conn: &mut redis::Connection, extra: &str) {
    let mut args = crate::redis::acl::documented_acl("sluice", "pw");
    args.push(extra.to_owned());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(args)
        .query(conn)
        .expect("ACL SETUSER");
}

fn ca_only(pki: &TestPki) -> impl FnOnce(&mut sluice::config::Settings) + '_ {
    |s| s.redis.tls.ca_file = Some(pki.path("ca.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    let pki = TestPki::generate();
    let cluster = TlsCluster::start(&pki);
    for node in &cluster.nodes {
        set_user(&mut node.connection(&pki), "+cluster|slots");
    }
    // One seed is enough: the others come from the slot map, over TLS.
    let seed = cluster.urls()[..1].to_vec();
    let ca = ca_only(&pki);
    let app = spawn_on_redis(POLICIES, |s| {
        s.redis.cluster = seed;
        s.redis.username = Some("sluice".into());
        s.redis.password = Some("pw".into());
        ca(s);
    })
    .await;
    assert_enforced(&app, 12).await;
    // The counters are spread over the nodes (hash tags), all reached over TLS.
    let mut holding = 0;
    for node in &cluster.nodes {
        let mut conn = node.connection(&pki);
        let size: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
        holding += usize::from(size > 0);
    }
    assert!(holding >= 2, "counters on {holding} node(s) only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_without_the_name_check() {
    let pki = TestPki::generate();
    // Certificates that name `redis.internal`, reached at 127.0.0.1 (seed and slot map).
    let cluster = TlsCluster::start_with(&pki, "named");
    let seed = vec![format!("rediss://127.0.0.1:{}", cluster.nodes[0].port)];
    let ca = ca_only(&pki);
    let app = spawn_on_redis(POLICIES, |s| {
        s.redis.cluster = seed;
        s.redis.tls.verify_hostname = false;
        ca(s);
    })
    .await;
    assert_enforced(&app, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_with_an_acl_user() {
    let pki = TestPki::generate();
    let primary = TlsRedis::start(&pki, false, &[]);
    let sentinel = primary.sentinel(&pki);
    let mut conn = primary.connection(&pki);
    set_user(&mut conn, "+role");
    let ca = ca_only(&pki);
    let app = spawn_on_redis(POLICIES, |s| {
        s.redis.sentinel.nodes = vec![format!("rediss://127.0.0.1:{}", sentinel.port)];
        s.redis.sentinel.master = "mymaster".into();
        s.redis.username = Some("sluice".into());
        s.redis.password = Some("pw".into());
        ca(s);
    })
    .await;
    assert_enforced(&app, 2).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:*")
        .query(&mut conn)
        .expect("KEYS");
    assert!(keys.iter().any(|k| k.contains("login")), "{keys:?}");
}
