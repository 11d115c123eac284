//! The HTTP API (v1) of the control plane (README "HTTP API (v1)", ADR 0007), over the
//! `ControlPlaneStore` port only.
//!
//! Every route but `/healthz` and `/readyz` needs `Authorization: Bearer
//! <token>`: the admin token reaches every account and `/metrics`, an
//! account key only its own account (anything else is `404`). Every error,
//! including the framework's own rejections, has the shape
//! `{"error": {"code", "message"}}`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod error;
pub mod metrics;
mod routes;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use control_plane_core::{Clock, DynControlPlaneStore, SystemClock, UsageMeter};
use tokio_util::sync::CancellationToken;

pub use auth::{generate_secret, generate_token, hash_token, Caller};
pub use error::ApiError;
pub use metrics::Metrics;

/// How the API runs.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// The admin bearer token.
    pub admin_token: String,
    /// Largest request body accepted, in bytes (`413` above).
    pub body_limit: usize,
    /// How long a rotated-out secret keeps signing.
    pub rotation_grace: Duration,
}

impl ApiConfig {
    /// Defaults (1 MiB bodies, 24 h rotation grace) with this admin token.
    pub fn new(admin_token: impl Into<String>) -> Self {
        ApiConfig {
            admin_token: admin_token.into(),
            body_limit: 1024 * 1024,
            rotation_grace: Duration::from_secs(24 * 3600),
        }
    }
}

/// What handlers share.
pub struct ApiState {
    pub(crate) store: DynControlPlaneStore,
    pub(crate) admin_hash: String,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) usage: Arc<UsageMeter>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) rotation_grace: Duration,
}

/// The API's router. `metrics` is rendered at `/metrics`; `usage` is fed
/// with published events.
pub fn router(
    store: DynControlPlaneStore,
    config: &ApiConfig,
    metrics: Arc<Metrics>,
    usage: Arc<UsageMeter>,
) -> Router {
    let state = Arc::new(ApiState {
        store,
        admin_hash: hash_token(&config.admin_token),
        metrics,
        usage,
        clock: Arc::new(SystemClock),
        rotation_grace: config.rotation_grace,
    });
    let v1 = "/v1/accounts/{account}";
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .route(&format!("{v1}/keys"), post(routes::key_create))
        .route(
            &format!("{v1}/keys/{{id}}"),
            axum::routing::delete(routes::key_revoke),
        )
        .route(
            &format!("{v1}/endpoints"),
            post(routes::endpoint_create).get(routes::endpoint_list),
        )
        .route(
            &format!("{v1}/endpoints/{{id}}"),
            get(routes::endpoint_get)
                .patch(routes::endpoint_update)
                .delete(routes::endpoint_delete),
        )
        .route(
            &format!("{v1}/endpoints/{{id}}/rotate-secret"),
            post(routes::endpoint_rotate),
        )
        .route(
            &format!("{v1}/endpoints/{{id}}/enable"),
            post(routes::endpoint_enable),
        )
        .route(
            &format!("{v1}/endpoints/{{id}}/stats"),
            get(routes::endpoint_stats),
        )
        .route(
            &format!("{v1}/endpoints/{{id}}/disable"),
            post(routes::endpoint_disable),
        )
        .route(
            &format!("{v1}/events"),
            post(routes::event_publish).get(routes::event_list),
        )
        .route(&format!("{v1}/events/{{id}}"), get(routes::event_get))
        .route(&format!("{v1}/deliveries"), get(routes::delivery_list))
        .route(
            &format!("{v1}/deliveries/replay"),
            post(routes::delivery_replay_dead),
        )
        .route(
            &format!("{v1}/deliveries/{{id}}"),
            get(routes::delivery_get),
        )
        .route(
            &format!("{v1}/deliveries/{{id}}/replay"),
            post(routes::delivery_replay),
        )
        .route(&format!("{v1}/tasks"), post(routes::task_enqueue))
        .route(&format!("{v1}/tasks/{{id}}"), get(routes::task_get))
        .route(
            &format!("{v1}/tasks/{{id}}/retry"),
            post(routes::task_retry),
        )
        .route(&format!("{v1}/dead-tasks"), get(routes::task_list_dead))
        .route(&format!("{v1}/usage"), get(routes::usage))
        .route(&format!("{v1}/alerts"), get(routes::alerts))
        .fallback(|| async { ApiError::not_found("route") })
        .layer(DefaultBodyLimit::max(config.body_limit))
        .layer(axum::middleware::from_fn(uniform_errors))
        .with_state(state)
}

/// Serves `router` on `listener` until `stop` is cancelled; requests in
/// progress finish.
///
/// # Errors
/// When the server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

/// Gives the framework's own rejections (malformed JSON, wrong content type,
/// oversized bodies, unknown methods) the API's error shape.
async fn uniform_errors(req: Request<Body>, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let message = if text.trim().is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, message).into_response();
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn readyz(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => Ok(axum::Json(serde_json::json!({
            "status": "ready",
            "store": state.store.backend_name(),
        }))),
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store is not reachable: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer within 2 s",
        )),
    }
}

async fn render_metrics(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
) -> Result<Response, ApiError> {
    caller.admin_only()?;
    let out = state.metrics.render(&state.store).await?;
    let mut r = out.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(r)
}
