//! A poisoned key stays its own problem: a foreign sorted set of 300,000 members, or a 1 MB
//! string, under a policy's key fails only the checks that name it (their failure mode, a warn
//! line with the policy and a fingerprint), after bounded work, and never leaves Redis busy long
//! enough for the other checks of the same batches to miss their deadline.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use serde_json::json;
use sluice::client::Target;
use sluice::limit::{Algorithm, FixedWindow, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::Item;
use sluice::store::Spend;

use crate::helpers::{json_of, metric_value, post, sluice_command, ChildGuard};
use crate::redis::batch::{decisions, run_batch, Check};
use crate::redis::differential::{with_redis, START};
use crate::redis_server::RedisServer;

/// Members of the foreign sorted set.
const MEMBERS: u64 = 300_000;

/// Adds `MEMBERS` members scored 1.. (long past: a sliding log would drop them all, one by one)
/// to `key`, in one server-side loop.
fn poison(conn: &mut redis::Connection, key: &str) {
    let added: u64 = redis::cmd("EVAL")
        .arg(
            "for i = 1, tonumber(ARGV[1]), 1000 do local a = {} for j = i, i + 999 do \
             a[#a + 1] = j a[#a + 1] = 'm' .. j end redis.call('ZADD', KEYS[1], unpack(a)) end \
             return redis.call('ZCARD', KEYS[1])",
        )
        .arg(1)
        .arg(key)
        .arg(MEMBERS)
        .query(conn)
        .expect("the foreign sorted set is built");
    assert_eq!(added, MEMBERS);
}

fn zcard(conn: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_foreign_sorted_set_fails_only_its_own_check_and_is_logged() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    poison(&mut conn, "rl:{login:huge}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, lines: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n") + "\n").expect("write");
        path.display().to_string()
    };
    let policies = file(
        "policies.yaml",
        &["policies:".into(), "  - {name: login, key: [ip], algorithm: sliding_log, limit: 10, period: 5m, failure_mode: closed}".into()],
    );
    let (http, admin) = (RedisServer::free_port(), RedisServer::free_port());
    // 50 ms: ten times the default, for a debug build on a shared machine, and still far below
    // what O(members) work on the set costs Redis (hundreds of milliseconds).
    let settings = file(
        "sluice.toml",
        &[
            format!("policies = {policies:?}"),
            format!("listen = {{ http = \"127.0.0.1:{http}\", admin = \"127.0.0.1:{admin}\", socket = \"\" }}"),
            "log = { format = \"json\" }".into(),
            format!("redis = {{ url = {:?}, timeout = \"50ms\" }}", server.url()),
        ],
    );
    let stderr = dir.path().join("stderr.log");
    let child = sluice_command(dir.path(), &["serve", "--config", &settings])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("spawn");
    let mut guard = ChildGuard(Some(child));
    let tcp = Arc::new(Target::Tcp(
        format!("127.0.0.1:{http}").parse().expect("addr"),
    ));
    let admin = Target::Tcp(format!("127.0.0.1:{admin}").parse().expect("addr"));
    let check = |ip: &str| {
        json!({"policy": "login", "descriptors": {"ip": ip}})
            .to_string()
            .into_bytes()
    };
    crate::wait::wait_for_store(&admin).await;

    // Rounds of 9 concurrent checks (so that they share batches): the poisoned partition and 8
    // others, fresh ones each round.
    for round in 0..3 {
        let mut tasks = Vec::new();
        for i in 0..9 {
            let ip = if i == 0 {
                "huge".to_owned()
            } else {
                format!("203.0.113.{}", round * 10 + i)
            };
            let (tcp, body) = (Arc::clone(&tcp), check(&ip));
            tasks.push(tokio::spawn(async move {
                (ip, post(&tcp, "/v1/check", body).await)
            }));
        }
        for task in tasks {
            let (ip, reply) = task.await.expect("check task");
            let body = json_of(&reply);
            if ip == "huge" {
                assert_eq!(reply.status, 503, "round {round}: {body}");
                assert_eq!(body["error"], "limiter_unavailable", "{body}");
            } else {
                assert_eq!(reply.status, 200, "round {round} {ip}: {body}");
                assert_eq!(body["mode"], "enforced", "round {round} {ip}: {body}");
            }
        }
    }
    assert_eq!(
        zcard(&mut conn, "rl:{login:huge}"),
        MEMBERS,
        "the foreign set is left alone"
    );

    let _ = Command::new("kill")
        .args(["-TERM", &guard.id().to_string()])
        .status();
    guard.wait_timeout(Duration::from_secs(10));
    let log = std::fs::read_to_string(&stderr).expect("log");
    let warned: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["message"]
                .as_str()
                .is_some_and(|m| m.contains("is not sluice's"))
        })
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "one warn line a minute per partition: {log}"
    );
    assert_eq!(warned[0]["policy"], "login", "{log}");
    assert_eq!(
        warned[0]["partition"].as_str().map(str::len),
        Some(16),
        "a fingerprint: {log}"
    );
    assert!(!log.contains("huge"), "no raw partition in the log: {log}");
}

#[test]
fn oversized_values_fail_their_own_check_after_bounded_work() {
    let log = Algorithm::SlidingLog(SlidingLog::new(10, 1_000_000).expect("valid"));
    let bucket = Algorithm::TokenBucket(TokenBucket::new(10, 1_000_000, 10).expect("valid"));
    let window = Algorithm::FixedWindow(FixedWindow::new(10, 1_000_000).expect("valid"));
    // Checks of one item (name, algorithm), then a group whose second item is poisoned.
    let single = [
        ("good", log),
        ("set", log),
        ("set", bucket),
        ("string", window),
        ("string", bucket),
        ("string", log),
    ];
    let item = |(name, algorithm): (&str, Algorithm)| Item {
        key: format!("{{poisoned}}:{name}"),
        algorithm,
        cost: 1,
        enforce: true,
    };
    let mut checks: Vec<Check> = single
        .into_iter()
        .map(|c| (Spend::Record, vec![item(c)]))
        .collect();
    checks.push((Spend::Record, vec![item(("good", log)), item(("set", log))]));
    checks.push((Spend::Record, vec![item(("good", log))]));
    let key = |name: &str| format!("{{poisoned}}:{name}");
    with_redis(|conn| {
        poison(conn, &key("set"));
        let long = "7".repeat(1 << 20);
        redis::cmd("SET")
            .arg(key("string"))
            .arg(&long)
            .query::<()>(conn)
            .expect("a 1 MB string");
        let replies = run_batch(conn, &checks, START);
        let error = |value: &Value| match value {
            Value::ServerError(error) => {
                format!("{} {}", error.code(), error.details().unwrap_or(""))
            }
            other => panic!("expected an error, got {other:?}"),
        };
        for (n, reply) in replies.iter().enumerate().take(6).skip(1) {
            let text = error(reply);
            assert!(
                text.starts_with("BADSTATE") && text.ends_with("[item 1]"),
                "check {n}: {text}"
            );
        }
        assert!(
            error(&replies[6]).ends_with("[item 2]"),
            "the group's second item"
        );
        let remaining: Vec<u64> = [0, 7]
            .iter()
            .map(|&i| decisions(&replies[i], 1)[0].remaining)
            .collect();
        assert_eq!(remaining, [9, 8], "the good key's checks are answered");
        assert_eq!(zcard(conn, &key("set")), MEMBERS, "the set is left alone");
        let length: u64 = redis::cmd("STRLEN")
            .arg(key("string"))
            .query(conn)
            .expect("STRLEN");
        assert_eq!(length, 1 << 20, "the string is left alone");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_getrange_still_reads_values_whole() {
    let redis = RedisServer::start();
    let older: Vec<String> = crate::redis::acl::documented_acl("sluice", "pw")
        .into_iter()
        .filter(|word| word != "+getrange")
        .collect();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&older)
        .query::<()>(&mut redis.connection())
        .expect("ACL SETUSER");
    let policies = "policies:\n  - {name: api, key: [k], algorithm: token_bucket, limit: 2, period: 1h, burst: 2, failure_mode: closed}\n  - {name: page, key: [k], algorithm: fixed_window, limit: 2, period: 1h, failure_mode: closed}\n";
    let url = format!("redis://sluice:pw@127.0.0.1:{}", redis.port);
    let app = crate::redis::tls::spawn_on_redis(policies, |s| s.redis.url = Some(url)).await;
    app.wait_for_store().await;
    let mut statuses = Vec::new();
    for policy in ["api", "page"] {
        for _ in 0..3 {
            let check = json!({"policy": policy, "descriptors": {"k": "x"}});
            statuses.push(app.check_tcp(&check).await.status.as_u16());
        }
    }
    assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);
    let metrics = app.metrics().await;
    for kind in ["auth", "other", "bad_key"] {
        let errors = metric_value(&metrics, "sluice_redis_errors_total", &[("kind", kind)]);
        assert_eq!(errors, 0.0, "{kind} errors with the older ACL line");
    }
}

#[test]
fn numbers_no_algorithm_writes_are_foreign_under_every_algorithm() {
    let foreign = [
        "1e15",
        " 12",
        "0x10",
        "1.5",
        "+5",
        "12345678901234567",
        "-123456789012345678",
        "1:2:3",
        "12:",
        "not a number",
    ];
    let algorithms = [
        Algorithm::TokenBucket(TokenBucket::new(10, 1_000_000, 10).expect("valid")),
        Algorithm::SlidingLog(SlidingLog::new(10, 1_000_000).expect("valid")),
        Algorithm::FixedWindow(FixedWindow::new(10, 1_000_000).expect("valid")),
    ];
    with_redis(|conn| {
        for (i, value) in foreign.iter().enumerate() {
            let key = format!("{{foreign:{i}}}");
            redis::cmd("SET")
                .arg(&key)
                .arg(*value)
                .query::<()>(conn)
                .expect("SET");
            let checks: Vec<Check> = algorithms
                .iter()
                .map(|&algorithm| {
                    let item = Item {
                        key: key.clone(),
                        algorithm,
                        cost: 1,
                        enforce: true,
                    };
                    (Spend::Record, vec![item])
                })
                .collect();
            for (reply, algorithm) in run_batch(conn, &checks, START).iter().zip(&algorithms) {
                assert!(
                    matches!(reply, Value::ServerError(e) if e.code() == "BADSTATE"),
                    "{value:?} under {}: {reply:?}",
                    algorithm.name()
                );
            }
            let kept: String = redis::cmd("GET").arg(&key).query(conn).expect("GET");
            assert_eq!(kept, *value, "left as it was");
        }
    });
}
