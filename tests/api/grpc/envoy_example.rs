//! `examples/envoy/rls.yaml` and `istio-envoyfilter.yaml`, checked structurally: the rate limit
//! filter calls `envoy.service.ratelimit.v3` over HTTP/2 on the clusters sluice listens on. What
//! their route actions select, behind a real Envoy: `tests/envoy` (`cargo test --test envoy`).

use serde_yaml::Value;
use sluice::transport::grpc::SERVICE_NAME;

use crate::helpers::repo_root;

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
