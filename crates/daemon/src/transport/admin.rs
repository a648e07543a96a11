//! The admin listener: `/livez` (the process answers), `/readyz` (accepting checks; never
//! depends on Redis), `/metrics` (Prometheus text), `/v1/policies` (the effective policies),
//! `POST /v1/explain`, `GET`/`DELETE /v1/counters` (see [`super::counters`]), `GET /v1/top`
//! (see [`super::top`]) and `/v1/openapi.json` (the published API of both listeners:
//! `docs/openapi.json`, built in).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::wire::{CheckBody, ErrorReply};
use crate::check::CheckService;
use crate::config::{AdminResets, HumanDuration, LocalPeers};
use crate::limit::{Algorithm, Policy, Quota};
use crate::telemetry::Metrics;

#[derive(Clone)]
struct AdminCtx {
    service: Arc<CheckService>,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    access: Arc<AdminAccess>,
}

/// Who may see raw partitions and reset counters on the admin listener.
#[derive(Debug, Clone, Default)]
pub struct AdminAccess {
    /// Who may reset counters.
    pub resets: AdminResets,
    /// The clients that count as local (`listen.local_peers`).
    pub local_peers: LocalPeers,
}

impl AdminAccess {
    /// Whether the client at `peer` is local (unknown: not local).
    pub fn is_local(&self, peer: Option<std::net::SocketAddr>) -> bool {
        peer.is_some_and(|p| self.local_peers.contains(p.ip()))
    }
}

/// The admin router. `ready` turns false when the daemon starts draining; `access` says who may
/// reset counters and see raw partitions.
pub fn router(
    service: Arc<CheckService>,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    access: AdminAccess,
) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .route("/v1/policies", get(policies))
        .route("/v1/explain", post(explain))
        .route("/v1/counters", any(counters))
        .route("/v1/top", any(top))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(AdminCtx {
            service,
            metrics,
            ready,
            access: Arc::new(access),
        })
}

async fn not_found() -> Response {
    super::http::error_response((
        StatusCode::NOT_FOUND,
        ErrorReply::new(
            "not_found",
            "no such endpoint; the admin listener serves /livez, /readyz, /metrics, \
             /v1/policies, /v1/openapi.json, POST /v1/explain, GET or DELETE /v1/counters and \
             GET /v1/top",
        ),
    ))
}

async fn method_not_allowed() -> Response {
    super::http::error_response((
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorReply::new(
            "method_not_allowed",
            "use GET (POST for /v1/explain, GET or DELETE for /v1/counters)",
        ),
    ))
}

/// The OpenAPI document of the check and admin APIs, as the repository holds it.
pub const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn livez() -> &'static str {
    "ok\n"
}

/// Ready while accepting checks. Deliberately blind to the store's health: a sidecar that turns
/// unready pulls its whole pod out of the Service, which would defeat fail-open.
async fn readyz(State(ctx): State<AdminCtx>) -> Response {
    let ready = ctx.ready.load(Ordering::SeqCst);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({
        "ready": ready,
        "store": ctx.service.store_name(),
        "policies": ctx.service.policies().len(),
    });
    if let Some(health) = ctx.service.store_health() {
        body["redis"] = health.as_str().into();
    }
    (status, Json(body)).into_response()
}

async fn render_metrics(State(ctx): State<AdminCtx>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        ctx.metrics.render(),
    )
        .into_response()
}

/// What the check API would answer for this request body, policy by policy: which apply and
/// why the others do not, partitions, tiers, costs, current state. Nothing is spent.
async fn explain(State(ctx): State<AdminCtx>, headers: HeaderMap, body: Body) -> Response {
    let limits = ctx.service.limits();
    let body = match super::http::read_json::<CheckBody>(&headers, body, limits).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    match ctx.service.explain(&body.into()).await {
        Ok(explanation) => Json(explanation).into_response(),
        Err(error) => super::http::error_response(ErrorReply::from_check_error(&error)),
    }
}

async fn counters(State(ctx): State<AdminCtx>, request: Request) -> Response {
    super::counters::counters(&ctx.service, &ctx.access, request).await
}

async fn top(State(ctx): State<AdminCtx>, request: Request) -> Response {
    super::top::top(&ctx.service, &ctx.access, request).await
}

async fn policies(State(ctx): State<AdminCtx>) -> Json<Value> {
    let set = ctx.service.policies();
    Json(json!({
        "version": ctx.metrics.policies_version.get(),
        "policies": set.iter().map(|p| dump(p)).collect::<Vec<_>>(),
    }))
}

fn dump(policy: &Policy) -> Value {
    let parts = policy.parts();
    let conditions: serde_json::Map<String, Value> = parts
        .conditions
        .iter()
        .map(|(name, pattern)| (name.clone(), Value::String(pattern.to_string())))
        .collect();
    let mut value = json!({
        "name": policy.name(),
        "description": parts.description,
        "match": conditions,
        "path_case": parts.path_case.as_str(),
        "key": parts.key,
        "group": parts.group,
        "failure_mode": parts.failure_mode.as_str(),
        "shadow": parts.shadow,
        "enforce_percent": parts.enforce_percent,
        "timeout": parts.timeout_us.map(|us| HumanDuration(us).to_string()),
        "reports": parts.reports,
    });
    if let Some(cost) = &parts.cost {
        value["cost"] = json!({ "descriptor": cost.descriptor, "table": cost.costs });
    }
    if !parts.replaces.is_empty() {
        value["replaces"] = json!(parts.replaces);
    }
    if let Some(kind) = parts.stand_in {
        value["envoy_stand_in"] = json!(kind.as_str());
    }
    if let Some(ttl) = parts.reservation_ttl_us {
        value["reservations"] = json!(true);
        value["reservation_ttl"] = json!(HumanDuration(ttl).to_string());
    }
    if parts.deny {
        // A block list has no quota: its placeholder's period is the wait it tells.
        value["deny"] = json!(true);
        let period = parts.quota.windows().first().map(|w| w.period_us());
        value["period"] = json!(period.map(|us| HumanDuration(us).to_string()));
        return value;
    }
    merge(&mut value, quota(&parts.quota));
    if let Some(tiers) = &parts.tiers {
        let levels: serde_json::Map<String, Value> = tiers
            .levels
            .iter()
            .map(|(tier, level)| (tier.clone(), quota(level)))
            .collect();
        value["tiers"] = json!({ "descriptor": tiers.descriptor, "levels": levels });
    }
    value
}

/// A quota as in the policy file: `algorithm` with `limit`/`period`/`burst` for one window or
/// `limits` for several, and `local_limit`.
fn quota(quota: &Quota) -> Value {
    let mut value = match quota.windows() {
        [only] => window(only),
        windows => json!({ "limits": windows.iter().map(window).collect::<Vec<_>>() }),
    };
    if let Some(first) = quota.windows().first() {
        value["algorithm"] = first.name().into();
        // One bound for the whole policy: only token buckets carry it.
        if let Algorithm::TokenBucket(bucket) = first {
            value["report_debt_periods"] = bucket.report_debt().into();
        }
    }
    if let Some(local) = quota.local() {
        value["local_limit"] = window(&Algorithm::TokenBucket(*local));
    }
    value
}

fn window(algorithm: &Algorithm) -> Value {
    let mut value = json!({
        "period": HumanDuration(algorithm.period_us()).to_string(),
    });
    match algorithm {
        Algorithm::TokenBucket(bucket) => {
            value["limit"] = bucket.limit().into();
            value["burst"] = bucket.capacity().into();
        }
        Algorithm::FixedWindow(fixed) => {
            value["limit"] = algorithm.limit().into();
            if let Some(calendar) = fixed.calendar_of() {
                value["period"] = calendar.unit().name().into();
                value["calendar"] = true.into();
                value["time_zone"] = calendar.zone_name().into();
            }
        }
        Algorithm::SlidingLog(_) => {
            value["limit"] = algorithm.limit().into();
        }
        Algorithm::Concurrency(concurrency) => {
            value = json!({
                "limit": concurrency.limit(),
                "permit_ttl": HumanDuration(concurrency.ttl_us()).to_string(),
            });
        }
    }
    value
}

fn merge(target: &mut Value, extra: Value) {
    if let (Value::Object(target), Value::Object(extra)) = (target, extra) {
        target.extend(extra);
    }
}
