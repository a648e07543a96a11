//! `examples/envoy/rls.yaml` and `istio-envoyfilter.yaml`, checked structurally (no Envoy binary is
//! installable here): the rate limit filter calls `envoy.service.ratelimit.v3` over HTTP/2 on the
//! clusters sluice listens on; and the descriptors its route actions produce, sent by a real gRPC
//! client to a daemon with the shipped policies, select those policies.

use std::collections::BTreeMap;

use serde_yaml::Value;
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::transport::grpc::SERVICE_NAME;

use crate::grpc_client::{ask, descriptor, request, response_header, spawn_grpc, OK, OVER_LIMIT};
use crate::helpers::{repo_root, SHIPPED_POLICIES};

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join("examples/envoy").join(name))
        .expect("example exists");
    serde_yaml::from_str(&text).expect("valid YAML")
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, key| &v[*key])
}

fn cluster<'a>(clusters: &'a Value, name: &str) -> &'a Value {
    clusters
        .as_sequence()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("cluster {name} defined"))
}

fn address(cluster: &Value) -> &Value {
    &at(cluster, &["load_assignment", "endpoints"])[0]["lb_endpoints"][0]["endpoint"]["address"]
}

fn assert_http2(cluster: &Value) {
    let options = at(
        cluster,
        &[
            "typed_extension_protocol_options",
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        ],
    );
    assert!(
        at(options, &["explicit_http_config", "http2_protocol_options"]).is_mapping(),
        "gRPC needs HTTP/2"
    );
}

/// The rate limit filter of an HTTP filter list.
fn ratelimit_filter(filters: &Value) -> &Value {
    let filter = filters
        .as_sequence()
        .expect("http_filters")
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the ratelimit filter");
    let config = &filter["typed_config"];
    assert_eq!(
        config["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(
        at(config, &["rate_limit_service", "transport_api_version"]),
        "V3"
    );
    config
}

#[test]
fn bootstrap_points_the_ratelimit_filter_at_sluice() {
    let bootstrap = load("rls.yaml");
    let listener = &at(&bootstrap, &["static_resources", "listeners"])[0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let config = ratelimit_filter(&hcm["http_filters"]);
    assert_eq!(config["domain"], "edge");
    let clusters = at(&bootstrap, &["static_resources", "clusters"]);
    let target = at(
        config,
        &[
            "rate_limit_service",
            "grpc_service",
            "envoy_grpc",
            "cluster_name",
        ],
    );
    let pipe = cluster(clusters, target.as_str().expect("name"));
    assert_http2(pipe);
    assert_eq!(
        at(address(pipe), &["pipe", "path"]),
        "/var/run/sluice/rls.sock"
    );
    let tcp = cluster(clusters, "sluice_rls_tcp");
    assert_http2(tcp);
    let socket = &address(tcp)["socket_address"];
    assert_eq!(
        (socket["address"].as_str(), socket["port_value"].as_u64()),
        (Some("127.0.0.1"), Some(8081))
    );
    assert_eq!(
        tcp["health_checks"][0]["grpc_health_check"]["service_name"],
        SERVICE_NAME
    );
    // The router comes last, after the ratelimit filter.
    let names: Vec<&str> = hcm["http_filters"]
        .as_sequence()
        .expect("filters")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert_eq!(names.last(), Some(&"envoy.filters.http.router"));
}

#[test]
fn istio_filter_patches_the_same_service() {
    let filter = load("istio-envoyfilter.yaml");
    assert_eq!(filter["kind"], "EnvoyFilter");
    let patches = at(&filter, &["spec", "configPatches"])
        .as_sequence()
        .expect("patches");
    let http = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .expect("filter patch");
    let config = ratelimit_filter(&Value::Sequence(
        vec![at(http, &["patch", "value"]).clone()],
    ))
    .clone();
    let added = patches
        .iter()
        .find(|p| p["applyTo"] == "CLUSTER")
        .expect("cluster patch");
    let cluster = at(added, &["patch", "value"]);
    assert_eq!(
        cluster["name"],
        at(
            &config,
            &[
                "rate_limit_service",
                "grpc_service",
                "envoy_grpc",
                "cluster_name"
            ]
        )
        .clone()
    );
    assert_http2(cluster);
    assert_eq!(
        at(address(cluster), &["pipe", "path"]),
        "/var/run/sluice/rls.sock"
    );
}

/// Envoy's descriptor for one `rate_limits` entry and a request's headers (the actions the
/// examples use; any other kind fails the test so the example cannot outgrow it).
fn produce(rate_limit: &Value, headers: &BTreeMap<&str, &str>) -> Option<RateLimitDescriptor> {
    let mut entries = Vec::new();
    for action in rate_limit["actions"].as_sequence().expect("actions") {
        if let Some(h) = action.get("request_headers") {
            let name = h["header_name"].as_str().expect("header_name");
            match headers.get(name) {
                Some(value) => entries.push((
                    h["descriptor_key"].as_str().expect("key").to_owned(),
                    (*value).to_owned(),
                )),
                None if h["skip_if_absent"] == true => {}
                None => return None,
            }
        } else if let Some(g) = action.get("generic_key") {
            let key = g["descriptor_key"].as_str().unwrap_or("generic_key");
            entries.push((
                key.to_owned(),
                g["descriptor_value"].as_str().expect("value").to_owned(),
            ));
        } else {
            panic!("action kind not simulated: {action:?}");
        }
    }
    let pairs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Some(descriptor(&pairs))
}

/// The descriptors Envoy sends for `path` (exact or prefix routes; vh limits unless the route has
/// its own).
fn descriptors_for(
    bootstrap: &Value,
    path: &str,
    headers: &BTreeMap<&str, &str>,
) -> Vec<RateLimitDescriptor> {
    let hcm = &at(bootstrap, &["static_resources", "listeners"])[0]["filter_chains"][0]["filters"]
        [0]["typed_config"];
    let vhost = &at(hcm, &["route_config", "virtual_hosts"])[0];
    let route = vhost["routes"]
        .as_sequence()
        .expect("routes")
        .iter()
        .find(|r| {
            r["match"]["path"].as_str() == Some(path)
                || r["match"]["prefix"]
                    .as_str()
                    .is_some_and(|p| path.starts_with(p))
        })
        .expect("a route");
    let limits = match route["route"].get("rate_limits") {
        Some(own) => own,
        None => &vhost["rate_limits"],
    };
    limits
        .as_sequence()
        .expect("rate_limits")
        .iter()
        .filter_map(|l| produce(l, headers))
        .collect()
}

#[tokio::test]
async fn route_actions_select_the_shipped_policies() {
    let bootstrap = load("rls.yaml");
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut client = daemon.uds().await;

    let login: BTreeMap<&str, &str> = [("x-envoy-external-address", "198.51.100.4")].into();
    for attempt in 0..10 {
        let answer = ask(
            &mut client,
            request("edge", descriptors_for(&bootstrap, "/login", &login)),
        )
        .await;
        assert_eq!(answer.overall_code, OK, "attempt {attempt}");
        assert_eq!(
            answer.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.name.as_str()),
            Some("login")
        );
    }
    let denied = ask(
        &mut client,
        request("edge", descriptors_for(&bootstrap, "/login", &login)),
    )
    .await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    assert!(response_header(&denied, "retry-after").is_some());

    let api: BTreeMap<&str, &str> = [("x-tenant", "acme"), ("x-api-key", "k")].into();
    let answer = ask(
        &mut client,
        request("edge", descriptors_for(&bootstrap, "/orders", &api)),
    )
    .await;
    assert_eq!(answer.statuses.len(), 1);
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.as_str()),
        Some("public_api")
    );
    assert_eq!(response_header(&answer, "x-ratelimit-limit"), Some("150"));
    let gold: BTreeMap<&str, &str> = [
        ("x-tenant", "big"),
        ("x-api-key", "k"),
        ("x-tier", "enterprise"),
    ]
    .into();
    let answer = ask(
        &mut client,
        request("edge", descriptors_for(&bootstrap, "/orders", &gold)),
    )
    .await;
    assert_eq!(response_header(&answer, "x-ratelimit-limit"), Some("1500"));
    // Without an API key Envoy sends no descriptor, so it does not call the service at all.
    assert!(descriptors_for(&bootstrap, "/orders", &BTreeMap::new()).is_empty());
}
