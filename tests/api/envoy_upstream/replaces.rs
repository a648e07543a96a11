//! envoyproxy/ratelimit's `replaces` (their README's example 7, replayed over gRPC on the
//! embedded store and on Redis with the local layer): where a limit naming another in its
//! `replaces` applies to one descriptor of a request, the named limit does not apply to any
//! descriptor of that request (OK, no `current_limit`) and its counter is left alone. Then the
//! rest of upstream's rule (`src/service/ratelimit.go`): names are collected before anything is
//! dropped (two limits replacing each other both go), `unlimited` ones replace but are never
//! replaced, an overridden descriptor takes no part; and a sluice policy's `replaces` on the
//! check API.

use serde_json::json;
use sluice::config::HumanDuration;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

use crate::envoy_upstream::{fixture, statuses_of, Status};
use crate::grpc_client::{
    ask, descriptor, grpc_settings, request, spawn_grpc, spawn_grpc_in, with_override, GrpcApp, OK,
    OVER_LIMIT,
};
use crate::helpers::json_of;
use crate::redis_server::RedisServer;

const NOTHING: Status = (OK, 0, Unit::Unknown, 0);

async fn statuses(
    client: &mut RateLimitServiceClient<Channel>,
    asked: RateLimitRequest,
) -> (i32, Vec<Status>) {
    statuses_of(&ask(client, asked).await)
}

/// README example 7, request by request; returns how many requests gave upstream's answer.
async fn example7(daemon: &GrpcApp) -> usize {
    let mut c = daemon.tcp().await;
    let one = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    let d = "example7";
    let mut asked = 0;
    // (key_1, value_1), (user, bkthomps): 5 / sec.
    for i in 0..6u32 {
        let want = if i < 5 {
            (OK, vec![(OK, 5, Unit::Second, 4 - i)])
        } else {
            (OVER_LIMIT, vec![(OVER_LIMIT, 5, Unit::Second, 0)])
        };
        assert_eq!(
            statuses(&mut c, request(d, vec![one()])).await,
            want,
            "one {i}"
        );
        asked += 1;
    }
    // Both: only the replacing 10 / sec applies; the replaced limit's denial (remembered by the
    // local layer on Redis) does not deny, and its counter is not spent.
    for i in 0..10u32 {
        let want = (OK, vec![NOTHING, (OK, 10, Unit::Second, 9 - i)]);
        let both = request(d, vec![one(), two()]);
        assert_eq!(statuses(&mut c, both).await, want, "both {i}");
        asked += 1;
    }
    // In the other order too, now over the replacing limit.
    let want = (OVER_LIMIT, vec![(OVER_LIMIT, 10, Unit::Second, 0), NOTHING]);
    let both = request(d, vec![two(), one()]);
    assert_eq!(statuses(&mut c, both).await, want, "both, reversed");
    // (key_2, value_2), (user, bkthomps) alone: the same 10 / sec, spent by the requests above.
    let want = (OVER_LIMIT, vec![(OVER_LIMIT, 10, Unit::Second, 0)]);
    assert_eq!(statuses(&mut c, request(d, vec![two()])).await, want);
    let want = (OVER_LIMIT, vec![(OVER_LIMIT, 5, Unit::Second, 0)]);
    assert_eq!(statuses(&mut c, request(d, vec![one()])).await, want);
    asked + 3
}

#[tokio::test]
async fn readme_example_7_on_the_embedded_store() {
    let daemon = spawn_grpc(&fixture("readme_example7.yaml")).await;
    assert_eq!(example7(&daemon).await, 19);
}

fn second() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs())
}

#[tokio::test]
async fn readme_example_7_on_redis_with_the_local_layer() {
    let redis = RedisServer::start();
    // Per-second windows follow Redis's clock: an attempt during which a second ended is run
    // again with fresh counters, at most 5 times.
    for attempt in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = grpc_settings(&dir);
        settings.redis.url = Some(redis.url());
        settings.redis.key_prefix = format!("replaces-{attempt}");
        settings.redis.timeout = HumanDuration(1_000_000);
        assert!(settings.local_layer.enabled, "the local layer is on");
        let daemon = spawn_grpc_in(dir, settings, &fixture("readme_example7.yaml")).await;
        let probe = json!({"descriptors": {"rls.domain": "example7", "rls.entries": "key_1,user",
            "key_1": "value_1", "user": "bkthomps"}, "dry_run": true});
        crate::wait::wait_enforced(&daemon.app.tcp, &probe).await;
        let started = second();
        let run = tokio::spawn(async move { example7(&daemon).await });
        match run.await {
            Ok(asked) => return assert_eq!(asked, 19),
            Err(e) if second() != started => eprintln!("a second ended: {e}"),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    panic!("five attempts each crossed a second");
}

/// Upstream's rule beyond the README's example, from its service code.
#[tokio::test]
async fn replacement_follows_upstreams_rule() {
    let file = "
domain: d
descriptors:
  - key: a
    rate_limit: {name: la, replaces: [{name: lb}], unit: hour, requests_per_unit: 1}
  - key: b
    rate_limit: {name: lb, replaces: [{name: la}], unit: hour, requests_per_unit: 2}
  - key: u
    rate_limit: {unlimited: true, name: lu, replaces: [{name: lc}]}
  - key: c
    rate_limit: {name: lc, unit: hour, requests_per_unit: 3}
  - key: r
    rate_limit: {replaces: [{name: lc}], unit: hour, requests_per_unit: 4}
";
    let daemon = spawn_grpc(file).await;
    let mut c = daemon.tcp().await;
    let one = |k: &str| descriptor(&[(k, "v")]);
    // Two limits replacing each other: both dropped when both apply, each applies alone.
    let both = request("d", vec![one("a"), one("b")]);
    assert_eq!(statuses(&mut c, both).await, (OK, vec![NOTHING, NOTHING]));
    let alone = statuses(&mut c, request("d", vec![one("b")])).await;
    assert_eq!(alone, (OK, vec![(OK, 2, Unit::Hour, 1)]));
    // An unlimited limit replaces (and is never replaced: naming one is refused below).
    let unlimited: Status = (OK, 0, Unit::Unknown, u32::MAX);
    let asked = request("d", vec![one("c"), one("u"), one("r")]);
    assert_eq!(
        statuses(&mut c, asked).await,
        (OK, vec![NOTHING, unlimited, (OK, 4, Unit::Hour, 3)])
    );
    // An overridden descriptor neither replaces nor is replaced (upstream: its limit is
    // nameless).
    let asked = request("d", vec![with_override(one("c"), 7, 4), one("r")]);
    assert_eq!(
        statuses(&mut c, asked).await,
        (OK, vec![(OK, 7, Unit::Day, 6), (OK, 4, Unit::Hour, 2)])
    );
    let asked = request("d", vec![one("c"), with_override(one("r"), 9, 4)]);
    assert_eq!(
        statuses(&mut c, asked).await,
        (OK, vec![(OK, 3, Unit::Hour, 2), (OK, 9, Unit::Day, 8)])
    );
}

/// What would do nothing is refused with a reason: upstream's own refusals (an empty entry, the
/// limit's own name: `envoy_upstream`), and, where upstream ignores them, a name no limit of the
/// domain has and a name only `unlimited` limits have.
#[test]
fn a_replaces_entry_that_would_do_nothing_is_refused() {
    let file = |replaced: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: u\n    rate_limit: {{unlimited: true, name: lu}}\n  - key: r\n    rate_limit: {{replaces: [{{name: {replaced}}}], unit: hour, requests_per_unit: 4}}\n"
        )
    };
    for (replaced, reason) in [
        (
            "lx",
            "replaces `lx`, which no limit of the domain has as its `name`",
        ),
        ("lu", "replaces `lu`, which only `unlimited` limits have"),
    ] {
        let error =
            sluice::config::parse_policies(std::path::Path::new("rl.yaml"), &file(replaced))
                .expect_err(replaced)
                .to_string();
        // The line is the entry's.
        assert!(
            error.starts_with("rl.yaml:6: domain `d`, descriptor r=*: "),
            "{error}"
        );
        assert!(error.contains(reason), "{error}");
    }
    // Another domain's limit is not this domain's.
    let two = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: x, unit: hour, requests_per_unit: 1}\n---\ndomain: b\ndescriptors:\n  - key: k\n    rate_limit: {replaces: [{name: x}], unit: hour, requests_per_unit: 1}\n";
    let error = sluice::config::parse_policies(std::path::Path::new("rl.yaml"), two)
        .expect_err("other domain")
        .to_string();
    assert!(
        error.starts_with(
            "rl.yaml:9: domain `b`, descriptor k=*: replaces `x`, which no limit of the domain"
        ),
        "{error}"
    );
    // A sluice policy's list names policies of its own file.
    let native = "policies:\n  - name: a\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n    replaces:\n      - b\n      - a\n";
    let error = sluice::config::parse_policies(std::path::Path::new("p.yaml"), native)
        .expect_err("unknown and self")
        .to_string();
    assert!(
        error.contains("p.yaml:8: policy `a`: field `replaces`: `b` is not a policy of this file"),
        "{error}"
    );
    assert!(
        error.contains("p.yaml:9: policy `a`: field `replaces`: a policy cannot replace itself"),
        "{error}"
    );
}

/// A sluice policy's `replaces` applies to a check API request too: where both apply, only the
/// replacing policy counts.
#[tokio::test]
async fn a_policy_replaces_another_on_the_check_api() {
    let file = "policies:
  - {name: reads, match: {route: read}, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: vip_reads, match: {route: read, tier: vip}, key: [user], algorithm: fixed_window, limit: 3, period: 1h, replaces: [reads]}
";
    let daemon = spawn_grpc(file).await;
    let vip = json!({"descriptors": {"route": "read", "tier": "vip", "user": "u"}});
    for remaining in [2, 1, 0] {
        let body = json_of(&daemon.app.check_tcp(&vip).await);
        assert_eq!(
            (&body["allowed"], &body["policy"], &body["remaining"]),
            (&json!(true), &json!("vip_reads"), &json!(remaining)),
            "{body}"
        );
    }
    assert_eq!(json_of(&daemon.app.check_tcp(&vip).await)["allowed"], false);
    // The effective policy dump shows it.
    let dump = json_of(&daemon.app.admin_get("/v1/policies").await);
    assert_eq!(dump["policies"][1]["replaces"], json!(["reads"]), "{dump}");
    assert!(dump["policies"][0].get("replaces").is_none(), "{dump}");
    // Without the tier, the replaced policy applies, its counter untouched.
    let plain = json!({"descriptors": {"route": "read", "user": "u"}});
    let body = json_of(&daemon.app.check_tcp(&plain).await);
    assert_eq!(
        (&body["policy"], &body["remaining"]),
        (&json!("reads"), &json!(0)),
        "{body}"
    );
}
