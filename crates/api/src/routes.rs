//! The v1 handlers, each with its OpenAPI description beside it
//! (`utoipa::path`): the router and the document are built from one list
//! (`crate::openapi`). Each handler resolves the caller's reach first, so a
//! key of one account gets `404` for every route of another.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use control_plane_core::{
    DeliveryId, DeliveryListRequest, DeliveryState, EndpointCreateRequest, EndpointId,
    EndpointUpdateRequest, EventFilter, EventId, EventListRequest, KeyId, PageRequest,
    PublishRequest, Recovery, ReplayFilter, Secret, TaskEnqueueRequest, TaskId, Timestamp,
    UsageMetric, RECOVER_TASK,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::auth::{
    caller_for_hash, generate_secret, generate_token, hash_token, validate_secret, AdminScope,
    Caller, Scope,
};
use crate::error::{ApiError, ErrorBody};
use crate::views::{
    self, AlertView, DeliveryDetail, DeliveryView, EndpointDeleted, EndpointDetail, EndpointList,
    EndpointStats, EndpointView, EndpointWithSecret, EventView, KeyCreated, Listing, Published,
    Replayed, SessionList, SessionView, TaskView, UsageList, UsageView,
};
use crate::ApiState;

type Shared = State<Arc<ApiState>>;
type Answer = Result<Response, ApiError>;

fn ok<T: Serialize>(status: StatusCode, body: T) -> Answer {
    Ok((status, Json(body)).into_response())
}

/// An optional JSON body: none when the request carries no body at all. A
/// body is read only with `content-type: application/json`, as `Json` reads
/// it; one without a content type is `415`, never dropped unread (a bulk
/// replay whose filter was dropped would replay every dead delivery).
pub(crate) struct OptionalJson<T>(Option<T>);

impl<T, S> axum::extract::FromRequest<S> for OptionalJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        if req.headers().contains_key(axum::http::header::CONTENT_TYPE) {
            let Json(v) = Json::<T>::from_request(req, state)
                .await
                .map_err(IntoResponse::into_response)?;
            return Ok(OptionalJson(Some(v)));
        }
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if body.is_empty() {
            Ok(OptionalJson(None))
        } else {
            Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a request body needs content-type: application/json",
            )
            .into_response())
        }
    }
}

/// The account a route works in.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct AccountPath {
    /// The account (tenant) name.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    #[allow(dead_code)]
    account: String,
}

/// One item of an account.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct ItemPath {
    /// The account (tenant) name.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    #[allow(dead_code)]
    account: String,
    /// The item's id.
    id: String,
}

/// Paging of a listing.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

impl PageQuery {
    fn request(&self) -> Result<PageRequest, ApiError> {
        page(self.limit, self.cursor.as_deref())
    }
}

/// A page request from a listing's `limit` and `cursor` parameters.
/// (Listings with filters repeat the two fields: `serde(flatten)` cannot
/// parse numbers out of a query string.)
pub(crate) fn page(limit: Option<u32>, cursor: Option<&str>) -> Result<PageRequest, ApiError> {
    let after = cursor
        .map(|v| {
            v.parse().map_err(|_| {
                ApiError::bad_request(format!("cursor {v:?} is not one this API gave"))
            })
        })
        .transpose()?;
    Ok(PageRequest {
        limit: limit.unwrap_or(50),
        after,
    })
}

/// Parses a path id; a malformed one cannot exist, so it is `404`.
fn id<T: FromStr>(what: &str, s: &str) -> Result<T, ApiError> {
    s.parse().map_err(|_| ApiError::not_found(what))
}

/// A caller's signing secret after checking it, or a fresh one.
fn given_or_new_secret(given: Option<String>) -> Result<String, ApiError> {
    match given {
        Some(given) => validate_secret(&given).map(|()| given),
        None => Ok(generate_secret()),
    }
}

/// `Some(Some(v))`, `Some(None)` for an explicit `null`, `None` when absent.
fn double<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Unix seconds as a time; `what` names the field in the error.
fn unix_seconds(
    what: &str,
    secs: Option<i64>,
    err: fn(String) -> ApiError,
) -> Result<Option<Timestamp>, ApiError> {
    secs.map(|s| {
        s.checked_mul(1000)
            .filter(|ms| *ms >= 0)
            .map(Timestamp::from_millis)
            .ok_or_else(|| err(format!("{what} must be Unix seconds, got {s}")))
    })
    .transpose()
}

/// Creates an account key (admin only); the key is shown this once.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/keys",
    tag = "keys",
    params(AccountPath),
    responses((status = 201, description = "The new key", body = KeyCreated)),
)]
pub(crate) async fn key_create(State(s): Shared, AdminScope(account): AdminScope) -> Answer {
    let token = generate_token("cpk_");
    let key = s
        .store
        .account_key_create(&account, &hash_token(&token))
        .await?;
    ok(
        StatusCode::CREATED,
        KeyCreated {
            id: key.id,
            account: key.account.as_str().to_string(),
            key: token,
            created_at: views::time(key.created_at),
        },
    )
}

/// Revokes an account key (admin only).
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/keys/{id}",
    tag = "keys",
    params(ItemPath),
    responses((status = 204, description = "Revoked")),
)]
pub(crate) async fn key_revoke(
    State(s): Shared,
    AdminScope(account): AdminScope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let key: KeyId = id("account key", &p.id)?;
    s.store.account_key_revoke(&account, key).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The live dashboard sessions (admin only; ADR 0021).
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    responses((status = 200, description = "Newest first, at most 1000", body = SessionList)),
)]
pub(crate) async fn session_list(State(s): Shared, caller: Caller) -> Answer {
    caller.admin_only()?;
    let mut items = Vec::new();
    for session in s.store.session_list().await? {
        let signed_in_as = match caller_for_hash(&s, &session.token_hash).await? {
            Some(Caller::Admin) => Some("admin".to_string()),
            Some(Caller::Account(a)) => Some(a.as_str().to_string()),
            None => None,
        };
        items.push(SessionView {
            id: session.id_hash,
            signed_in_as,
            created_at: views::time(session.created_at),
            expires_at: views::time(session.expires_at),
        });
    }
    ok(StatusCode::OK, SessionList { items })
}

/// A session's id in the path.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SessionPath {
    /// The session's `id` as listed.
    #[param(pattern = "^[0-9a-f]{64}$")]
    id: String,
}

/// Ends a dashboard session (admin only): its cookie opens nothing any more.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(SessionPath),
    responses((status = 204, description = "Ended")),
)]
pub(crate) async fn session_revoke(
    State(s): Shared,
    caller: Caller,
    Path(p): Path<SessionPath>,
) -> Answer {
    caller.admin_only()?;
    if s.store.session_get(&p.id).await?.is_none() {
        return Err(ApiError::not_found("session"));
    }
    s.store.session_end(&p.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A new endpoint.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointCreateBody {
    /// `http` or `https` URL the deliveries are sent to.
    url: String,
    /// Event types it receives; empty or absent means every type.
    #[serde(default)]
    event_types: Vec<String>,
    /// A filter on the event's type and payload, such as
    /// `{"data.amount": {"$gte": 100}}` (README, "Endpoint filters");
    /// absent means every event of its types.
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// `whsec_` and the base64 of 24 to 64 bytes; generated when absent.
    secret: Option<String>,
    /// One delivery in flight at a time, in publish order.
    #[serde(default)]
    ordered: bool,
    /// Requests per second at most, across every worker.
    rate_limit_per_s: Option<u32>,
    /// Deliveries in flight at most; absent means the service default.
    max_in_flight: Option<u32>,
    description: Option<String>,
}

/// `403` when an account key asks for a `max_in_flight` above the service
/// default: a larger share of every worker's send slots is the operator's
/// call (ADR 0019).
fn cap_allowed(s: &ApiState, caller: &Caller, max_in_flight: Option<u32>) -> Result<(), ApiError> {
    match (caller, max_in_flight) {
        (Caller::Account(_), Some(n)) if n > s.endpoint_concurrency => {
            Err(ApiError::forbidden(format!(
                "max_in_flight {n} is above the service default of {} \
                 (CONTROLPLANE_ENDPOINT_CONCURRENCY); only the admin token may set it higher",
                s.endpoint_concurrency
            )))
        }
        _ => Ok(()),
    }
}

/// Creates an endpoint; the answer shows its signing secret, this once.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints",
    tag = "endpoints",
    params(AccountPath),
    request_body = EndpointCreateBody,
    responses(
        (status = 201, description = "Created", body = EndpointWithSecret),
        (status = 403, description = "An account key asked for a max_in_flight above the service default", body = ErrorBody),
    ),
)]
pub(crate) async fn endpoint_create(
    State(s): Shared,
    Scope(account): Scope,
    caller: Caller,
    Json(body): Json<EndpointCreateBody>,
) -> Answer {
    cap_allowed(&s, &caller, body.max_in_flight)?;
    let secret = given_or_new_secret(body.secret)?;
    let mut req = EndpointCreateRequest::new(account, body.url, Secret::new(secret.clone()));
    req.event_types = body.event_types;
    req.filter = body.filter.map(EventFilter::parse).transpose()?;
    req.ordered = body.ordered;
    req.rate_limit_per_s = body.rate_limit_per_s;
    req.max_in_flight = body.max_in_flight;
    req.description = body.description;
    let e = s.store.endpoint_create(req).await?;
    ok(
        StatusCode::CREATED,
        EndpointWithSecret::new(&e, secret, false),
    )
}

/// Lists the account's endpoints.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints",
    tag = "endpoints",
    params(AccountPath),
    responses((status = 200, description = "Every endpoint", body = EndpointList)),
)]
pub(crate) async fn endpoint_list(State(s): Shared, Scope(account): Scope) -> Answer {
    let items = s
        .store
        .endpoint_list(&account)
        .await?
        .iter()
        .map(EndpointView::from)
        .collect();
    ok(StatusCode::OK, EndpointList { items })
}

/// An endpoint and its circuit.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{id}",
    tag = "endpoints",
    params(ItemPath),
    responses((status = 200, description = "The endpoint", body = EndpointDetail)),
)]
pub(crate) async fn endpoint_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let e = s
        .store
        .endpoint_get(&account, id("endpoint", &p.id)?)
        .await?;
    let circuit = s.store.circuit_get(&account, e.id).await?;
    ok(StatusCode::OK, EndpointDetail::new(&e, &circuit))
}

/// Changes to an endpoint: absent fields stay, `null` clears an optional one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointUpdateBody {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    /// A new filter; `null` removes it.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<Object>)]
    filter: Option<Option<Value>>,
    ordered: Option<bool>,
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<u32>)]
    rate_limit_per_s: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<u32>)]
    max_in_flight: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
}

/// Changes an endpoint.
#[utoipa::path(
    patch,
    path = "/v1/accounts/{account}/endpoints/{id}",
    tag = "endpoints",
    params(ItemPath),
    request_body = EndpointUpdateBody,
    responses(
        (status = 200, description = "The endpoint as changed", body = EndpointView),
        (status = 403, description = "An account key asked for a max_in_flight above the service default", body = ErrorBody),
    ),
)]
pub(crate) async fn endpoint_update(
    State(s): Shared,
    Scope(account): Scope,
    caller: Caller,
    Path(p): Path<ItemPath>,
    Json(body): Json<EndpointUpdateBody>,
) -> Answer {
    cap_allowed(&s, &caller, body.max_in_flight.flatten())?;
    let req = EndpointUpdateRequest {
        url: body.url,
        event_types: body.event_types,
        filter: body
            .filter
            .map(|f| f.map(EventFilter::parse).transpose())
            .transpose()?,
        ordered: body.ordered,
        rate_limit_per_s: body.rate_limit_per_s,
        max_in_flight: body.max_in_flight,
        description: body.description,
    };
    let e = s
        .store
        .endpoint_update(&account, id("endpoint", &p.id)?, req)
        .await?;
    ok(StatusCode::OK, EndpointView::from(&e))
}

/// The window of events an endpoint gets again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecoverBody {
    /// Events published at or after this time (Unix seconds).
    since: i64,
    /// Events published before this time (Unix seconds); now when absent.
    until: Option<i64>,
}

/// Recovers an endpoint: every event of the window it is subscribed to
/// (by its event types and filter) is delivered to it again, once: finished
/// deliveries are resent under their ids, missing ones created. It runs as a
/// workflow task (kind `control-plane.recover`); the answer is that task,
/// whose state and result (`GET .../tasks/{id}`) show its progress.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{id}/recover",
    tag = "endpoints",
    params(ItemPath),
    request_body = RecoverBody,
    responses((status = 202, description = "The recovery task, queued", body = TaskView)),
)]
pub(crate) async fn endpoint_recover(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    Json(body): Json<RecoverBody>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let since = unix_seconds("since", Some(body.since), ApiError::invalid)?
        .unwrap_or(Timestamp::from_millis(0));
    let until = unix_seconds("until", body.until, ApiError::invalid)?.unwrap_or(s.clock.now());
    let recovery = Recovery::new(endpoint, since, until)?;
    s.store.endpoint_get(&account, endpoint).await?;
    let payload =
        serde_json::to_value(&recovery).map_err(|e| ApiError::invalid(format!("recovery: {e}")))?;
    let enqueued = s
        .store
        .workflow_enqueue(TaskEnqueueRequest {
            id: TaskId::new(format!("recover-{}", uuid::Uuid::now_v7()))?,
            account,
            kind: RECOVER_TASK.into(),
            payload,
            run_at: None,
        })
        .await?;
    ok(StatusCode::ACCEPTED, TaskView::from(&enqueued.task))
}

/// Deletes an endpoint; its undelivered deliveries become dead.
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/endpoints/{id}",
    tag = "endpoints",
    params(ItemPath),
    responses((status = 200, description = "Deleted", body = EndpointDeleted)),
)]
pub(crate) async fn endpoint_delete(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let parked = s
        .store
        .endpoint_delete(&account, id("endpoint", &p.id)?)
        .await?;
    ok(
        StatusCode::OK,
        EndpointDeleted {
            deleted: true,
            deliveries_parked_as_dead: parked,
        },
    )
}

/// A secret to rotate to; a fresh one is generated without it.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateBody {
    /// `whsec_` and the base64 of 24 to 64 bytes.
    secret: Option<String>,
}

/// Rotates the signing secret; the previous one keeps signing for the
/// rotation grace period.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{id}/rotate-secret",
    tag = "endpoints",
    params(ItemPath),
    request_body(content = Option<RotateBody>, description = "Optional"),
    responses((status = 200, description = "The endpoint with its new secret", body = EndpointWithSecret)),
)]
pub(crate) async fn endpoint_rotate(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    OptionalJson(body): OptionalJson<RotateBody>,
) -> Answer {
    let endpoint: EndpointId = id("endpoint", &p.id)?;
    let secret = given_or_new_secret(body.and_then(|b| b.secret))?;
    let e = s
        .store
        .endpoint_rotate_secret(
            &account,
            endpoint,
            Secret::new(secret.clone()),
            s.rotation_grace,
        )
        .await?;
    ok(StatusCode::OK, EndpointWithSecret::new(&e, secret, true))
}

/// Enables an endpoint: its held deliveries resume.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{id}/enable",
    tag = "endpoints",
    params(ItemPath),
    responses((status = 200, description = "The endpoint", body = EndpointView)),
)]
pub(crate) async fn endpoint_enable(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let e = s
        .store
        .endpoint_set_enabled(
            &account,
            id("endpoint", &p.id)?,
            control_plane_core::Enablement::Enabled,
        )
        .await?;
    ok(StatusCode::OK, EndpointView::from(&e))
}

/// Why an endpoint is disabled.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DisableBody {
    /// 1 to 500 characters.
    #[schema(min_length = 1, max_length = 500)]
    reason: Option<String>,
}

/// Disables (pauses) an endpoint: its deliveries are held, never dropped,
/// and cost no attempt, until it is enabled.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{id}/disable",
    tag = "endpoints",
    params(ItemPath),
    request_body(content = Option<DisableBody>, description = "Optional"),
    responses((status = 200, description = "The endpoint", body = EndpointView)),
)]
pub(crate) async fn endpoint_disable(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    OptionalJson(body): OptionalJson<DisableBody>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let reason = body.and_then(|b| b.reason);
    if reason
        .as_ref()
        .is_some_and(|r| r.is_empty() || r.len() > 500 || r.contains('\0'))
    {
        return Err(ApiError::invalid(
            "reason must be 1 to 500 characters, without NUL",
        ));
    }
    let e = s
        .store
        .endpoint_set_enabled(
            &account,
            endpoint,
            control_plane_core::Enablement::Disabled { reason },
        )
        .await?;
    ok(StatusCode::OK, EndpointView::from(&e))
}

/// Attempts of the last hour and the last day: counts by result, success
/// rate, p50 and p95 response time.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{id}/stats",
    tag = "endpoints",
    params(ItemPath),
    responses((status = 200, description = "The endpoint's attempt statistics", body = EndpointStats)),
)]
pub(crate) async fn endpoint_stats(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let now = s.clock.now();
    let hour = now.minus(Duration::from_secs(3600));
    let day = now.minus(Duration::from_secs(86_400));
    let last_hour = s.store.attempt_stats(&account, endpoint, hour).await?;
    let last_day = s.store.attempt_stats(&account, endpoint, day).await?;
    ok(
        StatusCode::OK,
        EndpointStats {
            last_hour: (&last_hour).into(),
            last_day: (&last_day).into(),
        },
    )
}

/// Filters of the event listing.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventQuery {
    /// Only events of this type.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    event_type: Option<String>,
    /// Only events created at or after this time (Unix seconds).
    since: Option<i64>,
    /// Only events created before this time (Unix seconds).
    until: Option<i64>,
    /// Items per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// The account's events, newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events",
    tag = "events",
    params(AccountPath, EventQuery),
    responses((status = 200, description = "One page of events", body = Listing<EventView>)),
)]
pub(crate) async fn event_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<EventQuery>,
) -> Answer {
    let req = EventListRequest {
        account,
        event_type: q.event_type,
        since: unix_seconds("since", q.since, ApiError::bad_request)?,
        until: unix_seconds("until", q.until, ApiError::bad_request)?,
        page: page(q.limit, q.cursor.as_deref())?,
    };
    let p = s.store.event_list(req).await?;
    ok(StatusCode::OK, Listing::<EventView>::of(&p))
}

/// One event with the exact body its deliveries send.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events/{id}",
    tag = "events",
    params(ItemPath),
    responses((status = 200, description = "The event", body = EventView)),
)]
pub(crate) async fn event_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let e = s.store.event_get(&account, id("event", &p.id)?).await?;
    ok(StatusCode::OK, EventView::from(&e))
}

/// An event to publish.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishBody {
    /// Its type; endpoints subscribe by type.
    #[serde(rename = "type")]
    #[schema(min_length = 1, max_length = 255)]
    event_type: String,
    /// Any JSON value; sent as the `data` of every delivery.
    payload: Value,
}

/// Publishes an event: one delivery per subscribed endpoint, durable when
/// this answers. An `Idempotency-Key` header makes a repeat a no-op.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/events",
    tag = "events",
    params(
        AccountPath,
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters"),
    ),
    request_body = PublishBody,
    responses((status = 202, description = "Accepted", body = Published)),
)]
pub(crate) async fn event_publish(
    State(s): Shared,
    Scope(account): Scope,
    headers: HeaderMap,
    Json(body): Json<PublishBody>,
) -> Answer {
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 255)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Idempotency-Key must be 1 to 255 visible ASCII characters",
                    )
                })?
                .to_string(),
        ),
    };
    let req = PublishRequest {
        account: account.clone(),
        event_type: body.event_type,
        payload: body.payload,
        idempotency_key,
    };
    // Keyed publishes go alone: the key's first answer is the one returned.
    let published = if req.idempotency_key.is_some() {
        s.store.event_publish(req).await?
    } else {
        s.publisher.publish(req).await?
    };
    if published.created {
        s.usage.add(&account, UsageMetric::EventsPublished, 1);
    }
    ok(
        StatusCode::ACCEPTED,
        Published {
            id: published.event.id,
            deliveries: published.deliveries,
            duplicate: !published.created,
        },
    )
}

/// Filters of the delivery listing.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveryQuery {
    /// `pending`, `leased`, `delivered` or `dead`.
    #[param(pattern = "^(pending|leased|delivered|dead)$")]
    state: Option<String>,
    /// Only deliveries to this endpoint (a UUID).
    #[param(format = Uuid)]
    endpoint: Option<String>,
    /// Only deliveries of this event (a UUID).
    #[param(format = Uuid)]
    event: Option<String>,
    /// Items per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// The account's deliveries, newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries",
    tag = "deliveries",
    params(AccountPath, DeliveryQuery),
    responses((status = 200, description = "One page of deliveries", body = Listing<DeliveryView>)),
)]
pub(crate) async fn delivery_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<DeliveryQuery>,
) -> Answer {
    let state = q
        .state
        .as_deref()
        .map(str::parse::<DeliveryState>)
        .transpose()?;
    let bad =
        |what: &str, v: &str| ApiError::bad_request(format!("{what} must be a UUID, got {v:?}"));
    let endpoint_id = q
        .endpoint
        .as_deref()
        .map(|v| v.parse::<EndpointId>().map_err(|_| bad("endpoint", v)))
        .transpose()?;
    let event_id = q
        .event
        .as_deref()
        .map(|v| v.parse::<EventId>().map_err(|_| bad("event", v)))
        .transpose()?;
    let p = s
        .store
        .delivery_list(DeliveryListRequest {
            account,
            state,
            endpoint_id,
            event_id,
            page: page(q.limit, q.cursor.as_deref())?,
        })
        .await?;
    ok(StatusCode::OK, Listing::<DeliveryView>::of(&p))
}

/// One delivery and its attempt log.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries/{id}",
    tag = "deliveries",
    params(ItemPath),
    responses((status = 200, description = "The delivery", body = DeliveryDetail)),
)]
pub(crate) async fn delivery_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let delivery: DeliveryId = id("delivery", &p.id)?;
    let d = s.store.delivery_get(&account, delivery).await?;
    let attempts = s
        .store
        .attempt_list_for_delivery(&account, delivery)
        .await?;
    ok(StatusCode::OK, DeliveryDetail::new(&d, &attempts))
}

/// Makes a dead delivery pending again with a fresh attempt budget.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/deliveries/{id}/replay",
    tag = "deliveries",
    params(ItemPath),
    responses((status = 200, description = "The delivery, pending again", body = DeliveryView)),
)]
pub(crate) async fn delivery_replay(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let d = s
        .store
        .delivery_replay(&account, id("delivery", &p.id)?)
        .await?;
    ok(StatusCode::OK, DeliveryView::from(&d))
}

/// Sends a finished (delivered or dead) delivery again, under the same id
/// (its `webhook-id`), with a fresh attempt budget.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/deliveries/{id}/resend",
    tag = "deliveries",
    params(ItemPath),
    responses((status = 200, description = "The delivery, pending again", body = DeliveryView)),
)]
pub(crate) async fn delivery_resend(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let d = s
        .store
        .delivery_resend(&account, id("delivery", &p.id)?)
        .await?;
    ok(StatusCode::OK, DeliveryView::from(&d))
}

/// Which dead deliveries to replay; every one of the account's without it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    /// Only deliveries to this endpoint (a UUID).
    #[schema(format = Uuid)]
    endpoint_id: Option<String>,
    /// Only deliveries that died at or after this time (Unix seconds).
    dead_since: Option<i64>,
    /// Only deliveries that died before this time (Unix seconds).
    dead_until: Option<i64>,
}

/// Replays every dead delivery the filter matches, in one statement;
/// answers how many. A repeat finds nothing left to replay.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/deliveries/replay",
    tag = "deliveries",
    params(AccountPath),
    request_body(content = Option<ReplayBody>, description = "Optional"),
    responses((status = 200, description = "How many were replayed", body = Replayed)),
)]
pub(crate) async fn delivery_replay_dead(
    State(s): Shared,
    Scope(account): Scope,
    OptionalJson(body): OptionalJson<ReplayBody>,
) -> Answer {
    let mut filter = ReplayFilter::all(account);
    if let Some(b) = body {
        filter.endpoint_id = b
            .endpoint_id
            .map(|e| {
                e.parse().map_err(|_| {
                    ApiError::invalid(format!("endpoint_id is not an endpoint id: {e:?}"))
                })
            })
            .transpose()?;
        filter.dead_since = unix_seconds("dead_since", b.dead_since, ApiError::invalid)?;
        filter.dead_until = unix_seconds("dead_until", b.dead_until, ApiError::invalid)?;
    }
    let replayed = s.store.delivery_replay_dead(filter).await?;
    ok(StatusCode::OK, Replayed { replayed })
}

/// A workflow task to enqueue.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskBody {
    /// Its id, unique in the account; generated when absent. Enqueueing an
    /// id again with the same content is a no-op.
    #[schema(min_length = 1, max_length = 255)]
    id: Option<String>,
    /// What the task runner does with it.
    #[schema(min_length = 1, max_length = 255)]
    kind: String,
    #[serde(default)]
    payload: Value,
    /// Runs no sooner than this many seconds from now.
    delay_seconds: Option<u32>,
}

/// Enqueues a workflow task: `201` when new, `200` when the same task
/// was already enqueued.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/tasks",
    tag = "tasks",
    params(AccountPath),
    request_body = TaskBody,
    responses(
        (status = 201, description = "Enqueued", body = TaskView),
        (status = 200, description = "Already enqueued", body = TaskView),
    ),
)]
pub(crate) async fn task_enqueue(
    State(s): Shared,
    Scope(account): Scope,
    Json(body): Json<TaskBody>,
) -> Answer {
    let task_id = match body.id {
        Some(given) => TaskId::new(given)?,
        None => TaskId::new(uuid::Uuid::new_v4().to_string())?,
    };
    let run_at = body
        .delay_seconds
        .map(|d| s.clock.now().plus(Duration::from_secs(u64::from(d))));
    let enqueued = s
        .store
        .workflow_enqueue(TaskEnqueueRequest {
            id: task_id,
            account,
            kind: body.kind,
            payload: body.payload,
            run_at,
        })
        .await?;
    let status = if enqueued.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    ok(status, TaskView::from(&enqueued.task))
}

/// One workflow task.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/tasks/{id}",
    tag = "tasks",
    params(ItemPath),
    responses((status = 200, description = "The task", body = TaskView)),
)]
pub(crate) async fn task_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let task = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_get(&account, &task).await?;
    ok(StatusCode::OK, TaskView::from(&t))
}

/// The account's dead workflow tasks.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/dead-tasks",
    tag = "tasks",
    params(AccountPath, PageQuery),
    responses((status = 200, description = "One page of dead tasks", body = Listing<TaskView>)),
)]
pub(crate) async fn task_list_dead(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<PageQuery>,
) -> Answer {
    let p = s.store.workflow_list_dead(&account, q.request()?).await?;
    ok(StatusCode::OK, Listing::<TaskView>::of(&p))
}

/// Makes a dead task pending again with a fresh attempt budget.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/tasks/{id}/retry",
    tag = "tasks",
    params(ItemPath),
    responses((status = 200, description = "The task, pending again", body = TaskView)),
)]
pub(crate) async fn task_retry(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let task = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_retry_dead(&account, &task).await?;
    ok(StatusCode::OK, TaskView::from(&t))
}

/// The time range of a usage query.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// From this time (Unix seconds); default 24 h before `to`.
    from: Option<i64>,
    /// Until this time (Unix seconds); default now.
    to: Option<i64>,
}

/// Usage counters by hour.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/usage",
    tag = "usage",
    params(AccountPath, UsageQuery),
    responses((status = 200, description = "Hourly counters", body = UsageList)),
)]
pub(crate) async fn usage(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<UsageQuery>,
) -> Answer {
    let to = unix_seconds("to", q.to, ApiError::bad_request)?
        .unwrap_or_else(|| s.clock.now().plus(Duration::from_secs(1)));
    let from = unix_seconds("from", q.from, ApiError::bad_request)?
        .unwrap_or_else(|| to.minus(Duration::from_secs(24 * 3600)));
    let rows = s.store.usage_query(&account, from, to).await?;
    let items = rows.iter().map(UsageView::from).collect();
    ok(StatusCode::OK, UsageList { items })
}

/// The account's operational alerts, newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/alerts",
    tag = "alerts",
    params(AccountPath, PageQuery),
    responses((status = 200, description = "One page of alerts", body = Listing<AlertView>)),
)]
pub(crate) async fn alerts(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<PageQuery>,
) -> Answer {
    let p = s.store.alert_list(&account, q.request()?).await?;
    ok(StatusCode::OK, Listing::<AlertView>::of(&p))
}
