//! A limit lowered by a reload over live partitions, on Redis: the new limit applies to the state
//! as it is (docs/policies.md, "Changing a policy"). A partition that already used more than the
//! new limit is denied with `remaining` 0 and its policy enforced, never its failure mode: the
//! scripts once answered a negative `remaining`, which the daemon refused as a protocol error.
//! Every script path is asked: a single check (the algorithm's own script), a batch of single
//! checks (the batch script's lean loop), a check of every policy at once (its general loop), a
//! report, and a dry run; under both failure modes, for each algorithm.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{json_of, metric_value, post, spawn_served, test_settings, TestApp};
use crate::redis_server::RedisServer;

const ALGORITHMS: [&str; 3] = ["token_bucket", "sliding_log", "fixed_window"];
const MODES: [&str; 2] = ["open", "closed"];
const BEFORE: u64 = 10;
const AFTER: u64 = 5;
/// Checks admitted before the reload: more than the new limit, fewer than the old.
const USED: u64 = 8;
const WAIT: Duration = Duration::from_secs(30);

fn name(algorithm: &str, mode: &str) -> String {
    format!("{algorithm}_{mode}")
}

/// Every algorithm under both failure modes, `limit` per hour; a bucket refills BEFORE per hour
/// and holds `limit` (its state is a time, the TAT: a lower rate makes the tokens taken so far
/// fewer, a lower burst is what leaves a bucket over its new limit).
fn policies(limit: u64) -> String {
    let mut yaml = String::from("policies:\n");
    for algorithm in ALGORITHMS {
        for mode in MODES {
            let quota = match algorithm {
                "token_bucket" => format!("limit: {BEFORE}, burst: {limit}"),
                _ => format!("limit: {limit}"),
            };
            let _ = writeln!(
                yaml,
                "  - {{name: {}, key: [ip], algorithm: {algorithm}, {quota}, period: 1h, failure_mode: {mode}}}",
                name(algorithm, mode)
            );
        }
    }
    yaml
}

fn ask(policy: Option<&str>, ip: &str) -> Value {
    match policy {
        Some(policy) => json!({"policy": policy, "descriptors": {"ip": ip}}),
        None => json!({"descriptors": {"ip": ip}}),
    }
}

/// Asserts an answer (a check's, a batch entry's or a report's) is enforced and denies with
/// nothing left, `what` naming it.
fn assert_full(answer: &Value, what: &str) {
    assert_eq!(answer["mode"], "enforced", "{what}: {answer}");
    assert_eq!(answer["limit"], AFTER, "{what}: {answer}");
    assert_eq!(answer["remaining"], 0, "{what}: {answer}");
    let passed = answer["allowed"]
        .as_bool()
        .or_else(|| answer["within_limit"].as_bool());
    assert_eq!(passed, Some(false), "{what}: {answer}");
}

async fn lowered(app: &TestApp) -> bool {
    let dump = json_of(&app.admin_get("/v1/policies").await);
    dump["policies"].as_array().is_some_and(|all| {
        all.iter().all(|p| match p["algorithm"] == "token_bucket" {
            true => p["burst"] == AFTER,
            false => p["limit"] == AFTER,
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_denies_what_was_used_past_it_on_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, policies(BEFORE)).expect("write policies");
    let mut settings = test_settings(dir.path());
    settings.policies = file.clone();
    settings.policies_poll = HumanDuration(20_000);
    settings.redis.url = Some(redis.url());
    // Generous: small shared CI machines; timing is the benchmark's job, not this test's.
    settings.redis.timeout = HumanDuration(2_000_000);
    settings.local_layer.enabled = false;
    let app = spawn_served(dir, settings).await;
    app.wait_for_store().await;

    // USED units on every partition: "single" and "batch" per policy, and "all" through the
    // check that every policy matches.
    for algorithm in ALGORITHMS {
        for mode in MODES {
            let policy = name(algorithm, mode);
            for ip in ["single", "batch", "report", "dry"] {
                for n in 0..USED {
                    let reply = app.check_tcp(&ask(Some(&policy), ip)).await;
                    assert_eq!(
                        reply.status, 200,
                        "{policy} {ip} check {n} before the reload"
                    );
                }
            }
        }
    }
    for n in 0..USED {
        let reply = app.check_tcp(&ask(None, "all")).await;
        assert_eq!(
            reply.status, 200,
            "check {n} of every policy before the reload"
        );
    }

    let next = app.dir.path().join("policies.next");
    std::fs::write(&next, policies(AFTER)).expect("write the new policies");
    std::fs::rename(&next, &file).expect("swap the policy file");
    crate::wait::eventually_within("the lowered limits are loaded", WAIT, || async {
        lowered(&app).await
    })
    .await;

    for algorithm in ALGORITHMS {
        for mode in MODES {
            let policy = name(algorithm, mode);
            for n in 0..3 {
                let reply = app.check_tcp(&ask(Some(&policy), "single")).await;
                assert_eq!(reply.status, 429, "{policy}: check {n} after the reload");
                assert_full(&json_of(&reply), &format!("{policy} check {n}"));
            }
            let batch = app
                .batch(&[ask(Some(&policy), "batch"), ask(Some(&policy), "batch2")])
                .await;
            assert_eq!(batch.status, 200, "{policy}: batch");
            let results = json_of(&batch)["results"].clone();
            assert_full(&results[0], &format!("{policy} in a batch"));
            assert_eq!(results[1]["allowed"], true, "{policy}: a fresh partition");
            let reply = app.dry_run(&ask(Some(&policy), "dry")).await;
            assert_full(&json_of(&reply), &format!("{policy} dry run"));
            let body = ask(Some(&policy), "report").to_string().into_bytes();
            let reply = post(&app.tcp, "/v1/report", body).await;
            assert_eq!(reply.status, 200, "{policy}: report");
            assert_full(&json_of(&reply), &format!("{policy} report"));
        }
    }
    let reply = app.check_tcp(&ask(None, "all")).await;
    assert_eq!(
        reply.status, 429,
        "the check of every policy after the reload"
    );
    assert_eq!(json_of(&reply)["mode"], "enforced", "{}", json_of(&reply));

    let metrics = app.metrics().await;
    let errors = metric_value(&metrics, "sluice_redis_errors_total", &[]);
    assert_eq!(errors, 0.0, "no Redis call failed");
}
