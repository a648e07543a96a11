//! Six Envoys, each with its own sluice, all on one Redis: concurrent clients of every Envoy
//! together get exactly the limit, never more (the counters are Redis's, not a pod's).

use serde_json::json;

use crate::grpc_client::{grpc_settings, spawn_grpc_in, GrpcApp};
use crate::proxy::{self, count, Envoy};
use crate::redis_server::RedisServer;
use crate::rls::{rls_example, Via};

const POLICIES: &str = "
policies:
  - {name: shared, match: {generic_key: shared}, key: [generic_key], algorithm: sliding_log, limit: 50, period: 1h, failure_mode: closed}
";
const PODS: usize = 6;
const PER_CLIENT: usize = 20;

async fn sluice_on(redis: &RedisServer) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = "fleet".into();
    let daemon = spawn_grpc_in(dir, settings, POLICIES).await;
    daemon.app.wait_for_store().await;
    daemon
}

#[tokio::test]
async fn six_envoys_on_one_redis_admit_exactly_the_limit() {
    if proxy::binary().is_none() {
        return;
    }
    let redis = RedisServer::start();
    let mut pods = Vec::new();
    for i in 0..PODS {
        let daemon = sluice_on(&redis).await;
        let via = if i % 2 == 0 { Via::Socket } else { Via::Tcp };
        let mut config = rls_example(&daemon, via);
        let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
        host["rate_limits"] =
            json!([{ "actions": [{ "generic_key": { "descriptor_value": "shared" } }] }]);
        let envoy = Envoy::start(config).await.expect("envoy");
        pods.push((daemon, envoy));
    }
    // Two concurrent clients per Envoy.
    let mut clients = Vec::new();
    for (_, envoy) in &pods {
        for _ in 0..2 {
            let port = envoy.port;
            clients.push(tokio::spawn(async move {
                let mut codes = Vec::with_capacity(PER_CLIENT);
                for _ in 0..PER_CLIENT {
                    let answer = proxy::request(port, "GET", "/api", &[]).await;
                    codes.push(answer.map_or(0, |a| a.status));
                }
                codes
            }));
        }
    }
    let mut codes = Vec::new();
    for client in clients {
        codes.extend(client.await.expect("client"));
    }
    assert_eq!(codes.len(), PODS * 2 * PER_CLIENT);
    assert_eq!(count(&codes, 200), 50, "{codes:?}");
    assert_eq!(count(&codes, 429), codes.len() - 50, "{codes:?}");
    for (_, envoy) in &pods {
        assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    }
}
