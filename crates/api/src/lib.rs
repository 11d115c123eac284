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
pub mod idempotency;
pub mod limiter;
pub mod metrics;
mod openapi;
mod publisher;
pub mod query;
pub mod reference;
mod routes;
pub mod server;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use control_plane_core::{Clock, DynControlPlaneStore, SystemClock, Timestamp};
use control_plane_runtime::UsageMeter;

pub use auth::{generate_secret, generate_token, hash_token, Caller, MAX_TOKEN_BYTES};
pub use error::ApiError;
pub use metrics::Metrics;
pub use openapi::document as openapi_document;
pub use server::{serve, ServerLimits};

/// How the API runs.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// The admin bearer token.
    pub admin_token: String,
    /// Largest request body accepted, in bytes (`413` above).
    pub body_limit: usize,
    /// Time a request's whole body may take to arrive (`408` past it).
    pub body_timeout: Duration,
    /// How long a rotated-out secret keeps signing.
    pub rotation_grace: Duration,
    /// The service's default in-flight cap per endpoint
    /// (`CONTROLPLANE_ENDPOINT_CONCURRENCY`): a `max_in_flight` above it
    /// needs the admin token.
    pub endpoint_concurrency: u32,
    /// What one account may hold.
    pub quotas: Quotas,
}

/// What one account may hold (README "Quotas"); a create or registration
/// past one is `403` naming it. Checked and written under a lock per
/// account, so that requests racing in one process cannot pass it; API
/// processes of one postgres store that race may pass it by as many
/// processes as raced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Endpoints (`CONTROLPLANE_QUOTA_ENDPOINTS`).
    pub endpoints: u32,
    /// Registered event types (`CONTROLPLANE_QUOTA_EVENT_TYPES`).
    pub event_types: u32,
    /// Bytes of the schemas and examples of its event types, together
    /// (`CONTROLPLANE_QUOTA_SCHEMA_BYTES`).
    pub schema_bytes: u64,
}

impl Default for Quotas {
    /// 1,000 endpoints, 1,000 event types, 4 MiB of schemas and examples.
    fn default() -> Self {
        Quotas {
            endpoints: 1_000,
            event_types: 1_000,
            schema_bytes: 4 << 20,
        }
    }
}

impl ApiConfig {
    /// Defaults (1 MiB bodies within 30 s, 24 h rotation grace) with this admin token.
    pub fn new(admin_token: impl Into<String>) -> Self {
        ApiConfig {
            admin_token: admin_token.into(),
            body_limit: 1024 * 1024,
            body_timeout: Duration::from_secs(30),
            rotation_grace: Duration::from_secs(24 * 3600),
            endpoint_concurrency: control_plane_core::DEFAULT_ENDPOINT_CONCURRENCY,
            quotas: Quotas::default(),
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
    pub(crate) endpoint_concurrency: u32,
    pub(crate) quotas: Quotas,
    pub(crate) openapi: serde_json::Value,
    pub(crate) publisher: publisher::Publisher,
    pub(crate) bearer_failures: limiter::FailureLimiter,
    /// Locks that make a quota's check and its write one step per account,
    /// striped by the account's hash so that they take fixed memory.
    quota_locks: [tokio::sync::Mutex<()>; QUOTA_LOCKS],
}

/// How many quota locks there are; accounts that share one wait for each
/// other's creates only.
const QUOTA_LOCKS: usize = 64;

impl ApiState {
    /// The store.
    pub fn store(&self) -> &DynControlPlaneStore {
        &self.store
    }

    /// The time now, by the API's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The service's default in-flight cap per endpoint
    /// (`CONTROLPLANE_ENDPOINT_CONCURRENCY`).
    pub fn endpoint_concurrency(&self) -> u32 {
        self.endpoint_concurrency
    }

    /// Held from a quota's check until its write is done: creates of one
    /// account that race in this process cannot pass a quota together.
    pub(crate) async fn quota_lock(
        &self,
        account: &control_plane_core::AccountId,
    ) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        account.as_str().hash(&mut h);
        let stripe = (h.finish() % QUOTA_LOCKS as u64) as usize;
        self.quota_locks[stripe].lock().await
    }
}

/// The API's router. `metrics` is rendered at `/metrics`; `usage` is fed
/// with published events. `pages` are served beside the API on the same
/// state, limits and error shapes: the dashboard (`dashboard::router()`),
/// or `Router::new()` for the API alone.
pub fn router(
    store: DynControlPlaneStore,
    config: &ApiConfig,
    metrics: Arc<Metrics>,
    usage: Arc<UsageMeter>,
    pages: Router<Arc<ApiState>>,
) -> Router {
    // One list gives both the routes and the document they serve.
    let (routes, doc) = openapi::routes().split_for_parts();
    let state = Arc::new(ApiState {
        publisher: publisher::Publisher::new(store.clone()),
        store,
        admin_hash: hash_token(&config.admin_token),
        metrics,
        usage,
        clock: Arc::new(SystemClock),
        rotation_grace: config.rotation_grace,
        endpoint_concurrency: config.endpoint_concurrency,
        quotas: config.quotas,
        openapi: openapi::to_json(doc),
        bearer_failures: limiter::FailureLimiter::new(auth::BEARER_FAILURES, auth::BEARER_WINDOW),
        quota_locks: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
    });
    let idempotency = (state.store.clone(), config.body_limit);
    routes
        .merge(pages)
        .merge(reference::interactive())
        .fallback(|| async { ApiError::not_found("route") })
        // Inside the idempotency layer too: an answer is stored as the
        // client sees it, so a replay of a framework rejection keeps the
        // API's error shape.
        .layer(axum::middleware::from_fn(uniform_errors))
        .layer(axum::middleware::from_fn_with_state(
            idempotency,
            idempotency::idempotent_writes,
        ))
        .layer(DefaultBodyLimit::max(config.body_limit))
        .layer(axum::middleware::from_fn_with_state(
            (config.body_timeout, config.body_limit),
            server::read_body_within,
        ))
        // Outside the body's reading and the idempotency records: an
        // anonymous client costs neither (ADR 0043).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(uniform_errors))
        .with_state(state)
}

/// Gives the framework's own rejections (malformed JSON, wrong content type,
/// oversized bodies, unknown methods) the API's error shape.
async fn uniform_errors(req: Request<Body>, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    // JSON errors are the API's own; HTML ones are the pages'.
    let is_ours = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| {
            v.as_bytes().starts_with(b"application/json") || v.as_bytes().starts_with(b"text/html")
        });
    if !(status.is_client_error() || status.is_server_error()) || is_ours {
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

/// The process is up (no token needed).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    responses((status = 200, description = "Up", body = Health)),
)]
async fn healthz() -> impl IntoResponse {
    axum::Json(Health { status: "ok" })
}

/// The answer of `/healthz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`.
    status: &'static str,
}

/// The answer of `/readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Ready {
    /// Always `ready`.
    status: &'static str,
    /// `embedded` or `postgres`.
    store: &'static str,
}

/// This API's OpenAPI 3.1 document (no token needed).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    responses((status = 200, description = "The document", body = Object)),
)]
async fn serve_openapi(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    axum::Json(state.openapi.clone())
}

/// The store answers (no token needed); `503` when it does not within 2 s.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    responses((status = 200, description = "Ready", body = Ready)),
)]
async fn readyz(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    readiness(&state.store).await
}

/// `/readyz`'s answer for `store`: ready when it answers a ping within 2 s.
async fn readiness(store: &DynControlPlaneStore) -> Result<axum::Json<Ready>, ApiError> {
    match tokio::time::timeout(Duration::from_secs(2), store.ping()).await {
        Ok(Ok(())) => Ok(axum::Json(Ready {
            status: "ready",
            store: store.backend_name(),
        })),
        // The store's error may name hosts, users or paths: it goes to the
        // service's log, not to an unauthenticated caller.
        Ok(Err(e)) => {
            tracing::warn!("readiness check: the store is not reachable: {e}");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is not reachable; the service's log says why",
            ))
        }
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer within 2 s",
        )),
    }
}

/// `/healthz` and `/readyz` alone, as the API answers them: what a `worker`
/// process serves for its probes (it has no API and no token).
pub fn probes_router(store: DynControlPlaneStore) -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route(
            "/readyz",
            axum::routing::get(|State(store): State<DynControlPlaneStore>| async move {
                readiness(&store).await
            }),
        )
        .fallback(|| async { ApiError::not_found("route") })
        .with_state(store)
}

/// Prometheus metrics in the OpenMetrics text format (admin only).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((
        status = 200,
        description = "Every metric",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body = String,
    )),
)]
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
