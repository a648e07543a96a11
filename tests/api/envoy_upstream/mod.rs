//! envoyproxy/ratelimit's own configuration tests (`test/config/config_test.go` on its
//! `test/config/*.yaml`) replayed against sluice: every file upstream loads, loads; every file
//! it refuses, sluice refuses with a reason; every lookup gives upstream's answer (code,
//! `current_limit`, `limit_remaining`) over gRPC, on the embedded store and on Redis. The
//! lookups are data: `envoy_upstream/lookups.yaml`.

mod figures;
mod flows;
mod replaces;
mod stats;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::json;
use sluice::config::envoy::{convert, convert_sources, DomainMerge};
use sluice::config::{parse_policies, HumanDuration};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::grpc_client::{ask, descriptor, grpc_settings, request, spawn_grpc_in, GrpcApp, OK};
use crate::redis_server::RedisServer;

/// A fixture (upstream's file, see `envoy_upstream/SOURCE.md`).
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/api/envoy_upstream")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Upstream's answer to one descriptor (asked once, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No limit applies: OK, no `current_limit`, remaining 0.
    Nothing,
    /// `unlimited: true`: OK, no `current_limit`, remaining `u32::MAX`.
    Unlimited,
    /// OK with this limit per unit and this remaining.
    Limit(u32, Unit, u32),
}

/// One upstream lookup: a domain, the entries of one descriptor, the answer.
pub type Case = (String, Vec<(String, String)>, Want);

/// A case as `lookups.yaml` writes it.
pub type RawCase = (String, Vec<(String, String)>, RawWant);

/// An answer as `lookups.yaml` writes it.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub enum RawWant {
    /// `nothing` or `unlimited`.
    Word(String),
    /// `[per_unit, unit, remaining]`.
    Limit(u32, String, u32),
}

impl From<RawWant> for Want {
    fn from(raw: RawWant) -> Self {
        match raw {
            RawWant::Word(word) if word == "nothing" => Want::Nothing,
            RawWant::Word(word) if word == "unlimited" => Want::Unlimited,
            RawWant::Word(word) => panic!("unknown answer {word:?}"),
            RawWant::Limit(per_unit, unit, remaining) => {
                let unit = Unit::from_str_name(&unit.to_ascii_uppercase()).expect("a unit");
                Want::Limit(per_unit, unit, remaining)
            }
        }
    }
}

/// The lookups of upstream's config tests, per file (`envoy_upstream/lookups.yaml`).
pub fn lookups() -> BTreeMap<String, Vec<Case>> {
    let raw: BTreeMap<String, Vec<RawCase>> =
        serde_yaml::from_str(&fixture("lookups.yaml")).expect("lookups.yaml");
    raw.into_iter()
        .map(|(file, cases)| {
            let cases = cases
                .into_iter()
                .map(|(domain, entries, want)| (domain, entries, want.into()))
                .collect();
            (file, cases)
        })
        .collect()
}

/// Asks every case in order; returns how many gave upstream's answer (panics on the first that
/// does not, naming it).
pub async fn replay(daemon: &GrpcApp, cases: &[Case]) -> usize {
    match try_replay(daemon, cases).await {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    }
}

/// The wall clock's minute (Redis counts windows by its own `TIME`).
fn minute() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs() / 60)
}

/// [`replay`] on Redis, whose windows follow the real clock: an attempt during which a minute
/// window ended (counters shared across cases start afresh) is retried, at most 3 times.
pub async fn replay_on_redis(
    policies: &str,
    redis: &RedisServer,
    prefix: &str,
    cases: &[Case],
) -> usize {
    for attempt in 0..3 {
        let started = minute();
        let prefix = format!("{prefix}-{attempt}");
        let daemon = daemon(policies, Some((redis, &prefix)), cases).await;
        match try_replay(&daemon, cases).await {
            Ok(n) => return n,
            Err(e) if minute() != started => eprintln!("a minute ended during the attempt: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("three attempts each crossed a minute");
}

async fn try_replay(daemon: &GrpcApp, cases: &[Case]) -> Result<usize, String> {
    let mut client = daemon.tcp().await;
    for (n, (domain, entries, want)) in cases.iter().enumerate() {
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let answer = ask(&mut client, request(domain, vec![descriptor(&entries)])).await;
        let status = &answer.statuses[0];
        let got = match &status.current_limit {
            None if status.limit_remaining == u32::MAX => Want::Unlimited,
            None if status.limit_remaining == 0 => Want::Nothing,
            None => panic!(
                "case {n} {entries:?}: no limit, remaining {}",
                status.limit_remaining
            ),
            Some(limit) => Want::Limit(
                limit.requests_per_unit,
                Unit::try_from(limit.unit).expect("a unit"),
                status.limit_remaining,
            ),
        };
        if (answer.overall_code, status.code, got) != (OK, OK, *want) {
            return Err(format!(
                "case {n}: {domain} {entries:?}: got {:?}, want {:?}",
                (answer.overall_code, status.code, got),
                (OK, OK, *want)
            ));
        }
    }
    Ok(cases.len())
}

/// A daemon on the embedded store, or on Redis when `redis` is given, enforcing `policies`;
/// on Redis it is returned once the first limited case of `cases` is decided there.
pub async fn daemon(
    policies: &str,
    redis: Option<(&RedisServer, &str)>,
    cases: &[Case],
) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    let Some((server, prefix)) = redis else {
        return spawn_grpc_in(dir, settings, policies).await;
    };
    settings.redis.url = Some(server.url());
    settings.redis.key_prefix = prefix.into();
    settings.redis.timeout = HumanDuration(1_000_000);
    let daemon = spawn_grpc_in(dir, settings, policies).await;
    // Redis is reached in the background: wait (bounded) until a check is decided there.
    let (domain, entries, _) = cases
        .iter()
        .find(|(_, _, want)| matches!(want, Want::Limit(..)))
        .expect("a limited case");
    let mut descriptors = serde_json::Map::new();
    descriptors.insert("rls.domain".into(), json!(domain));
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    descriptors.insert("rls.entries".into(), json!(keys.join(",")));
    for (key, value) in entries {
        descriptors.insert(key.clone(), json!(value));
    }
    let probe = json!({"descriptors": descriptors});
    crate::wait::wait_enforced(&daemon.app.tcp, &probe).await;
    daemon
}

/// The files upstream loads with their lookups (the merged pair is converted together).
pub fn loaded() -> Vec<(String, String, Vec<Case>)> {
    lookups()
        .into_iter()
        .map(|(file, cases)| {
            let text = if file == "merge_domain_key*.yaml" {
                let (one, two) = (
                    fixture("merge_domain_key1.yaml"),
                    fixture("merge_domain_key2.yaml"),
                );
                let files = [
                    (Path::new("merge_domain_key1.yaml"), one.as_str()),
                    (Path::new("merge_domain_key2.yaml"), two.as_str()),
                ];
                convert_sources(&files, DomainMerge::Merge).expect("merged")
            } else {
                fixture(&file)
            };
            (file, text, cases)
        })
        .collect()
}

#[tokio::test]
async fn upstream_config_lookups_on_the_embedded_store() {
    let mut cases = 0;
    for (name, text, lookups) in loaded() {
        parse_policies(Path::new(&name), &text).unwrap_or_else(|e| panic!("{name}: {e}"));
        cases += replay(&daemon(&text, None, &lookups).await, &lookups).await;
    }
    assert_eq!(cases, 67);
}

/// `sluice config convert`'s output loaded as a sluice policy file, with every stand-in renamed
/// as an operator may (what it stands for is its `envoy_stand_in`, not its name), gives
/// upstream's answer to every lookup.
#[tokio::test]
async fn upstream_config_lookups_on_the_converted_files_renamed() {
    let mut cases = 0;
    let mut renamed_any = false;
    for (name, text, lookups) in loaded() {
        // The merged pair is converted already.
        let mut converted = if name.contains('*') {
            text
        } else {
            convert(&text).unwrap_or_else(|e| panic!("{name}: {e:?}"))
        };
        for kind in ["unlimited", "exempt", "shadow-blocked", "override"] {
            let prefix = format!("rls-{kind}-");
            renamed_any |= converted.contains(&prefix);
            converted = converted.replace(&prefix, &format!("renamed-{kind}-"));
        }
        parse_policies(Path::new(&name), &converted).unwrap_or_else(|e| panic!("{name}: {e}"));
        cases += replay(&daemon(&converted, None, &lookups).await, &lookups).await;
    }
    assert!(renamed_any);
    assert_eq!(cases, 67);
}

#[tokio::test]
async fn upstream_config_lookups_on_redis() {
    let redis = RedisServer::start();
    let mut cases = 0;
    for (at, (_, text, lookups)) in loaded().into_iter().enumerate() {
        cases += replay_on_redis(&text, &redis, &format!("upstream-{at}"), &lookups).await;
    }
    assert_eq!(cases, 67);
}

/// Every file upstream refuses, refused with a reason like upstream's.
#[test]
fn upstream_refusals_are_refused_with_a_reason() {
    let refused = |name: &str, text: &str, reason: &str| {
        let error = parse_policies(Path::new(name), text)
            .expect_err(name)
            .to_string();
        assert!(error.contains(reason), "{name}: {error}");
    };
    let files = [
        ("bad_limit_unit.yaml", "invalid rate limit unit \"foo\""),
        ("bad_yaml.yaml", "found unexpected end of stream"),
        ("duplicate_key.yaml", "duplicate descriptor composite key"),
        ("empty_domain.yaml", "descriptors"),
        ("empty_key.yaml", "descriptor has empty key"),
        ("misspelled_key.yaml", "ratelimit"),
        ("misspelled_key2.yaml", "requestsperunit"),
        ("non_map_list.yaml", "descriptors"),
        ("non_string_key.yaml", "0.25"),
        (
            "replaces_empty.yaml",
            "should not have an empty replaces entry",
        ),
        (
            "replaces_self.yaml",
            "replaces should not contain name of same descriptor",
        ),
        (
            "unlimited_with_unit.yaml",
            "should not specify rate limit unit when unlimited",
        ),
    ];
    for (name, reason) in files {
        refused(name, &fixture(name), reason);
    }
    // Two files with one domain: refused unless merged (TestDuplicateDomain).
    let basic = fixture("basic_config.yaml");
    let duplicate = fixture("duplicate_domain.yaml");
    let two = [
        (Path::new("basic_config.yaml"), basic.as_str()),
        (Path::new("duplicate_domain.yaml"), duplicate.as_str()),
    ];
    let problems = convert_sources(&two, DomainMerge::Refuse).expect_err("duplicate domain");
    assert!(
        problems[0].starts_with("duplicate_domain.yaml: duplicate domain 'test-domain'"),
        "{problems:?}"
    );
    assert!(convert_sources(&two, DomainMerge::Merge).is_ok());
    // One file merged with itself repeats a key (TestDuplicateKeyDomainMerge).
    let one = fixture("merge_domain_key1.yaml");
    let twice = [
        (Path::new("a.yaml"), one.as_str()),
        (Path::new("b.yaml"), one.as_str()),
    ];
    let problems = convert_sources(&twice, DomainMerge::Merge).expect_err("duplicate key");
    assert!(
        problems[0].contains("duplicate descriptor composite key"),
        "{problems:?}"
    );
    // The configured name is the reported one (TestBasicConfig's key4).
    assert!(convert(&basic)
        .expect("loads")
        .contains("name: key4_rate_limit"));
}

/// A status as `(code, requests_per_unit, unit, remaining)`; no `current_limit` is `(code, 0,
/// Unknown, remaining)`.
pub type Status = (i32, u32, Unit, u32);

/// An answer as `(overall code, [status])`.
pub fn statuses_of(answer: &RateLimitResponse) -> (i32, Vec<Status>) {
    let statuses = answer
        .statuses
        .iter()
        .map(|s| match &s.current_limit {
            Some(l) => (
                s.code,
                l.requests_per_unit,
                Unit::try_from(l.unit).expect("a unit"),
                s.limit_remaining,
            ),
            None => (s.code, 0, Unit::Unknown, s.limit_remaining),
        })
        .collect();
    (answer.overall_code, statuses)
}
