//! The RLQS configuration docs/envoy.md gives to copy, taken from the page as it is and run
//! through the real Envoy 1.40 against a daemon with the shipped `config/policies.yaml`: it
//! limits what the page says it limits (`public_api`, per tenant and API key: a burst of 150 on
//! the daemon's manual clock, which never refills), and its buckets match that policy (none is
//! counted as matching no policy).

use serde_json::Value;

use crate::grpc_client::spawn_grpc;
use crate::helpers::{metric_value, repo_root, SHIPPED_POLICIES};
use crate::proxy::{self, count, Envoy};
use crate::rlqs::rlqs_envoy_config;
use crate::rls::Via;

/// Requests sent, in rounds: well past the burst.
const REQUESTS: usize = 240;
const PER_ROUND: usize = 8;
/// `public_api`'s burst in config/policies.yaml.
const BURST: usize = 150;

/// The rate limit quota filter of the first `yaml` block under "The Envoy configuration to
/// copy" in docs/envoy.md.
fn filter_to_copy() -> Value {
    let page = std::fs::read_to_string(repo_root().join("docs/envoy.md")).expect("docs/envoy.md");
    let section = page
        .split_once("### The Envoy configuration to copy")
        .expect("the section")
        .1;
    let block = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block")
        .0;
    let config: Value = serde_yaml::from_str(block).expect("the block is YAML");
    let filter = config["http_filters"][0].clone();
    assert_eq!(filter["name"], "envoy.filters.http.rate_limit_quota");
    filter
}

#[tokio::test]
async fn the_configuration_to_copy_limits_the_shipped_public_api() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut config = rlqs_envoy_config(&daemon, Via::Tcp, "unused");
    let filters = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    filters[0] = filter_to_copy();
    let Some(envoy) = Envoy::start(config).await else {
        return;
    };
    let headers = [("x-tenant", "acme"), ("x-api-key", "k1")];
    let mut codes = Vec::new();
    for _ in 0..REQUESTS / PER_ROUND {
        let sends = (0..PER_ROUND).map(|_| proxy::request(envoy.port, "GET", "/", &headers));
        for answer in futures_util::future::join_all(sends).await {
            codes.push(answer.map_or(0, |a| a.status));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let admitted = count(&codes, 200);
    eprintln!("admitted {admitted} of {} (burst {BURST})", codes.len());
    assert!(
        admitted <= BURST,
        "admitted {admitted} > {BURST}: {codes:?}"
    );
    assert!(admitted > 0, "some admitted: {codes:?}\n{}", envoy.log());
    assert_eq!(admitted + count(&codes, 429), codes.len(), "{codes:?}");
    let metrics = daemon.app.metrics().await;
    let unmatched = metric_value(&metrics, "sluice_rlqs_unmatched_buckets_total", &[]);
    assert_eq!(unmatched, 0.0, "the buckets match public_api");
    let leased = metric_value(
        &metrics,
        "sluice_rlqs_assignments_total",
        &[("kind", "token_bucket")],
    );
    assert!(leased > 0.0, "token buckets backed by public_api's leases");
}
