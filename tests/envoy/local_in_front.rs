//! Envoy's local rate limit filter in front of the global one (docs/envoy.md, "Two layers"): the
//! local bucket turns a flood away inside Envoy (429 without asking sluice), and what it lets
//! through is limited fleet-wide by sluice.

use serde_json::json;

use crate::grpc_client::spawn_grpc;
use crate::proxy::{self, count, statuses, Envoy};
use crate::rls::{rls_example, Via};

const POLICIES: &str = "
policies:
  - {name: per-key, match: {api_key: '*'}, key: [api_key], algorithm: fixed_window, limit: 5, period: 1h}
";

#[tokio::test]
async fn local_rate_limit_in_front_of_the_global_one() {
    let daemon = spawn_grpc(POLICIES).await;
    let mut config = rls_example(&daemon, Via::Socket);
    let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
    host["rate_limits"] = json!([{ "actions": [{ "request_headers": { "header_name": "x-api-key", "descriptor_key": "api_key" } }] }]);
    // The filter as docs/envoy.md gives it: a bucket of 8 per Envoy, refilled once an hour
    // here (a test must not wait for refills), before the global filter.
    let local = json!({
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "local_rate_limit",
            "token_bucket": { "max_tokens": 8, "tokens_per_fill": 8, "fill_interval": "3600s" },
            "filter_enabled": { "default_value": { "numerator": 100, "denominator": "HUNDRED" } },
            "filter_enforced": { "default_value": { "numerator": 100, "denominator": "HUNDRED" } }
        }
    });
    proxy::http_filters(&mut config).insert(0, local);
    let Some(envoy) = Envoy::start(config).await else {
        return;
    };
    let answers = statuses(&envoy, 12, "/api", &[("x-api-key", "k1")]).await;
    // 5 through both layers; 3 more pass the local bucket and sluice denies them; the last 4
    // never reach sluice.
    assert_eq!(count(&answers[..5], 200), 5, "{answers:?}");
    assert_eq!(count(&answers, 429), 7, "{answers:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 3);
    assert_eq!(envoy.stat("cluster.app.ratelimit.ok").await, 5);
    assert_eq!(
        envoy
            .stat("local_rate_limit.http_local_rate_limit.rate_limited")
            .await,
        4
    );
}
