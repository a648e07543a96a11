//! The baseline a team writes in an afternoon: an axum server that answers the same check request
//! with one unbatched `EVALSHA` of sluice's own script per request, on one shared redis-rs
//! multiplexed connection. Run by `sluice bench` as its own process (`sluice bench-naive-sidecar`,
//! hidden), so that its CPU is measured apart, with as many worker threads as the daemon.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use clap::Args;
use redis::aio::MultiplexedConnection;
use serde::Deserialize;

use super::algorithms;
use sluice::limit::Key;
use sluice::store::redis::keys::redis_key;
use sluice::store::redis::scripts::oracle::ScriptCalls;
use sluice::store::redis::scripts::Scripts;
use sluice::store::Spend;

/// Options of the naive sidecar.
#[derive(Debug, Args)]
pub struct NaiveArgs {
    /// Redis URL.
    #[arg(long)]
    redis: String,
    /// Where to listen.
    #[arg(long)]
    listen: SocketAddr,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Answer without Redis: the no-op HTTP floor of the lease rows.
    #[arg(long)]
    noop: bool,
}

#[derive(Deserialize)]
struct CheckBody {
    policy: String,
    descriptors: HashMap<String, String>,
}

#[derive(Clone)]
struct Naive {
    conn: MultiplexedConnection,
    /// Per policy: the script's SHA and its arguments after the key.
    scripts: HashMap<&'static str, (String, Vec<Vec<u8>>)>,
}

async fn check(
    State(naive): State<Naive>,
    Json(body): Json<CheckBody>,
) -> (StatusCode, Json<serde_json::Value>) {
    let Some((sha, args)) = naive.scripts.get(body.policy.as_str()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "policy"})),
        );
    };
    let k = body.descriptors.get("k").map_or("", String::as_str);
    let key = redis_key("naive", &Key::new(body.policy.as_str().into(), [k]));
    let mut conn = naive.conn.clone();
    let reply: redis::RedisResult<Vec<i64>> = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(args)
        .query_async(&mut conn)
        .await;
    match reply {
        Ok(fields) if fields.len() == 5 => {
            let allowed = fields[0] == 1;
            let status = if allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let body = serde_json::json!({"allowed": allowed, "remaining": fields[2]});
            (status, Json(body))
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": "redis"})),
        ),
    }
}

async fn serve(args: NaiveArgs) -> anyhow::Result<()> {
    if args.noop {
        return super::leases::serve_floor(args.listen).await;
    }
    let client = redis::Client::open(args.redis.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let scripts = Scripts::default();
    let mut table = HashMap::new();
    for (policy, algorithm) in algorithms() {
        let call = scripts.call(&algorithm, String::new(), 1, Spend::Record, None);
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&*call.script.source)
            .query_async(&mut conn)
            .await?;
        table.insert(policy, (sha, call.args));
    }
    let router = Router::new()
        .route("/v1/check", post(check))
        .with_state(Naive {
            conn,
            scripts: table,
        });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    axum::serve(listener, router).await?;
    Ok(())
}

/// Runs the naive sidecar until killed.
pub fn run(args: NaiveArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build();
    let result = runtime
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(serve(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("naive sidecar: {error:#}");
            ExitCode::from(1)
        }
    }
}
