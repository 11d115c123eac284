//! The v1 handlers. Each one resolves the caller's reach first, so a key of
//! one account gets `404` for every route of another.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use control_plane_core::{
    AlertKind, DeliveryId, DeliveryListRequest, DeliveryState, EndpointCreateRequest, EndpointId,
    EndpointUpdateRequest, EventId, EventListRequest, KeyId, PageRequest, PublishRequest,
    ReplayFilter, Secret, TaskEnqueueRequest, TaskId, Timestamp, UsageMetric,
};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use crate::auth::{
    generate_secret, generate_token, hash_token, validate_secret, AdminScope, Scope,
};
use crate::error::ApiError;
use crate::{views, ApiState};

type Shared = State<Arc<ApiState>>;
type Answer = Result<Response, ApiError>;

fn ok(status: StatusCode, body: Value) -> Answer {
    Ok((status, Json(body)).into_response())
}

/// One page of a listing: its items and the cursor of the next page.
fn listed<T>(p: &control_plane_core::Page<T>, view: fn(&T) -> Value) -> Answer {
    let items: Vec<Value> = p.items.iter().map(view).collect();
    ok(
        StatusCode::OK,
        json!({"items": items, "next_cursor": p.next.map(|n| n.to_string())}),
    )
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

pub(crate) async fn key_create(State(s): Shared, AdminScope(account): AdminScope) -> Answer {
    let token = generate_token("cpk_");
    let key = s
        .store
        .account_key_create(&account, &hash_token(&token))
        .await?;
    ok(
        StatusCode::CREATED,
        json!({
            "id": key.id,
            "account": key.account.as_str(),
            "key": token,
            "created_at": key.created_at.to_rfc3339(),
        }),
    )
}

pub(crate) async fn key_revoke(
    State(s): Shared,
    AdminScope(account): AdminScope,
    Path((_, key)): Path<(String, String)>,
) -> Answer {
    let key: KeyId = id("account key", &key)?;
    s.store.account_key_revoke(&account, key).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointCreateBody {
    url: String,
    #[serde(default)]
    event_types: Vec<String>,
    secret: Option<String>,
    #[serde(default)]
    ordered: bool,
    rate_limit_per_s: Option<u32>,
    max_in_flight: Option<u32>,
    description: Option<String>,
}

pub(crate) async fn endpoint_create(
    State(s): Shared,
    Scope(account): Scope,
    Json(body): Json<EndpointCreateBody>,
) -> Answer {
    let secret = given_or_new_secret(body.secret)?;
    let mut req = EndpointCreateRequest::new(account, body.url, Secret::new(secret.clone()));
    req.event_types = body.event_types;
    req.ordered = body.ordered;
    req.rate_limit_per_s = body.rate_limit_per_s;
    req.max_in_flight = body.max_in_flight;
    req.description = body.description;
    let e = s.store.endpoint_create(req).await?;
    let mut view = views::endpoint(&e);
    view["secret"] = json!(secret);
    ok(StatusCode::CREATED, view)
}

pub(crate) async fn endpoint_list(State(s): Shared, Scope(account): Scope) -> Answer {
    let items: Vec<Value> = s
        .store
        .endpoint_list(&account)
        .await?
        .iter()
        .map(views::endpoint)
        .collect();
    ok(StatusCode::OK, json!({ "items": items }))
}

pub(crate) async fn endpoint_get(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
) -> Answer {
    let e = s
        .store
        .endpoint_get(&account, id("endpoint", &endpoint)?)
        .await?;
    let circuit = s.store.circuit_get(&account, e.id).await?;
    let mut view = views::endpoint(&e);
    view["circuit"] = json!({
        "mode": circuit.mode.as_str(),
        "consecutive_failures": circuit.consecutive_failures,
        "open_until": circuit.open_until.map(|t| t.to_rfc3339()),
    });
    ok(StatusCode::OK, view)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointUpdateBody {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    ordered: Option<bool>,
    #[serde(default, deserialize_with = "double")]
    rate_limit_per_s: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double")]
    max_in_flight: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double")]
    description: Option<Option<String>>,
}

pub(crate) async fn endpoint_update(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
    Json(body): Json<EndpointUpdateBody>,
) -> Answer {
    let req = EndpointUpdateRequest {
        url: body.url,
        event_types: body.event_types,
        ordered: body.ordered,
        rate_limit_per_s: body.rate_limit_per_s,
        max_in_flight: body.max_in_flight,
        description: body.description,
    };
    let e = s
        .store
        .endpoint_update(&account, id("endpoint", &endpoint)?, req)
        .await?;
    ok(StatusCode::OK, views::endpoint(&e))
}

pub(crate) async fn endpoint_delete(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
) -> Answer {
    let parked = s
        .store
        .endpoint_delete(&account, id("endpoint", &endpoint)?)
        .await?;
    ok(
        StatusCode::OK,
        json!({"deleted": true, "deliveries_parked_as_dead": parked}),
    )
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateBody {
    secret: Option<String>,
}

pub(crate) async fn endpoint_rotate(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
    body: Option<Json<RotateBody>>,
) -> Answer {
    let endpoint: EndpointId = id("endpoint", &endpoint)?;
    let secret = given_or_new_secret(body.and_then(|Json(b)| b.secret))?;
    let e = s
        .store
        .endpoint_rotate_secret(
            &account,
            endpoint,
            Secret::new(secret.clone()),
            s.rotation_grace,
        )
        .await?;
    let mut view = views::endpoint(&e);
    view["secret"] = json!(secret);
    view["previous_secret_expires_at"] =
        json!(e.secrets.previous_expires_at.map(|t| t.to_rfc3339()));
    ok(StatusCode::OK, view)
}

pub(crate) async fn endpoint_enable(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
) -> Answer {
    let e = s
        .store
        .endpoint_set_enabled(
            &account,
            id("endpoint", &endpoint)?,
            control_plane_core::Enablement::Enabled,
        )
        .await?;
    ok(StatusCode::OK, views::endpoint(&e))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DisableBody {
    reason: Option<String>,
}

/// Holds the endpoint's deliveries (never drops them) until it is enabled.
pub(crate) async fn endpoint_disable(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
    body: Option<Json<DisableBody>>,
) -> Answer {
    let endpoint = id("endpoint", &endpoint)?;
    let reason = body.and_then(|Json(b)| b.reason);
    if reason
        .as_ref()
        .is_some_and(|r| r.is_empty() || r.len() > 500)
    {
        return Err(ApiError::invalid("reason must be 1 to 500 characters"));
    }
    let e = s
        .store
        .endpoint_set_enabled(
            &account,
            endpoint,
            control_plane_core::Enablement::Disabled { reason },
        )
        .await?;
    ok(StatusCode::OK, views::endpoint(&e))
}

/// Attempts of the last hour and the last day: counts by result, success
/// rate, p50 and p95 response time.
pub(crate) async fn endpoint_stats(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, endpoint)): Path<(String, String)>,
) -> Answer {
    let endpoint = id("endpoint", &endpoint)?;
    let now = s.clock.now();
    let mut view = serde_json::Map::new();
    for (name, span) in [("last_hour", 3600), ("last_day", 86_400)] {
        let since = now.minus(Duration::from_secs(span));
        let stats = s.store.attempt_stats(&account, endpoint, since).await?;
        view.insert(name.into(), views::attempt_stats(&stats));
    }
    ok(StatusCode::OK, Value::Object(view))
}

/// Newest first; filters `type`, `since` and `until` (Unix seconds).
pub(crate) async fn event_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let req = EventListRequest {
        account,
        event_type: q.get("type").cloned(),
        since: query_time(&q, "since")?,
        until: query_time(&q, "until")?,
        page: page(&q)?,
    };
    let p = s.store.event_list(req).await?;
    listed(&p, views::event)
}

pub(crate) async fn event_get(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, event)): Path<(String, String)>,
) -> Answer {
    let e = s.store.event_get(&account, id("event", &event)?).await?;
    ok(StatusCode::OK, views::event(&e))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishBody {
    #[serde(rename = "type")]
    event_type: String,
    payload: Value,
}

pub(crate) async fn event_publish(
    State(s): Shared,
    Scope(account): Scope,
    headers: HeaderMap,
    Json(body): Json<PublishBody>,
) -> Answer {
    if AlertKind::from_event_type(&body.event_type).is_some() {
        return Err(ApiError::invalid(format!(
            "event type {:?} is reserved for operational events",
            body.event_type
        )));
    }
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
    let published = s
        .store
        .event_publish(PublishRequest {
            account: account.clone(),
            event_type: body.event_type,
            payload: body.payload,
            idempotency_key,
        })
        .await?;
    if published.created {
        s.usage.add(&account, UsageMetric::EventsPublished, 1);
    }
    ok(
        StatusCode::ACCEPTED,
        json!({
            "id": published.event.id,
            "deliveries": published.deliveries,
            "duplicate": !published.created,
        }),
    )
}

fn query_u32(q: &HashMap<String, String>, name: &str, default: u32) -> Result<u32, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| {
            ApiError::bad_request(format!("{name} must be a whole number, got {v:?}"))
        }),
    }
}

fn query_cursor(q: &HashMap<String, String>) -> Result<Option<i64>, ApiError> {
    q.get("cursor")
        .map(|v| {
            v.parse().map_err(|_| {
                ApiError::bad_request(format!("cursor {v:?} is not one this API gave"))
            })
        })
        .transpose()
}

fn page(q: &HashMap<String, String>) -> Result<PageRequest, ApiError> {
    Ok(PageRequest {
        limit: query_u32(q, "limit", 50)?,
        after: query_cursor(q)?,
    })
}

pub(crate) async fn delivery_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let state = q
        .get("state")
        .map(|v| v.parse::<DeliveryState>())
        .transpose()?;
    let bad =
        |what: &str, v: &str| ApiError::bad_request(format!("{what} must be a UUID, got {v:?}"));
    let endpoint_id = q
        .get("endpoint")
        .map(|v| v.parse::<EndpointId>().map_err(|_| bad("endpoint", v)))
        .transpose()?;
    let event_id = q
        .get("event")
        .map(|v| v.parse::<EventId>().map_err(|_| bad("event", v)))
        .transpose()?;
    let p = s
        .store
        .delivery_list(DeliveryListRequest {
            account,
            state,
            endpoint_id,
            event_id,
            page: page(&q)?,
        })
        .await?;
    listed(&p, views::delivery)
}

pub(crate) async fn delivery_get(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, delivery)): Path<(String, String)>,
) -> Answer {
    let delivery: DeliveryId = id("delivery", &delivery)?;
    let d = s.store.delivery_get(&account, delivery).await?;
    let attempts: Vec<Value> = s
        .store
        .attempt_list_for_delivery(&account, delivery)
        .await?
        .iter()
        .map(views::attempt)
        .collect();
    let mut view = views::delivery(&d);
    view["attempt_log"] = json!(attempts);
    ok(StatusCode::OK, view)
}

pub(crate) async fn delivery_replay(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, delivery)): Path<(String, String)>,
) -> Answer {
    let d = s
        .store
        .delivery_replay(&account, id("delivery", &delivery)?)
        .await?;
    ok(StatusCode::OK, views::delivery(&d))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    endpoint_id: Option<String>,
    dead_since: Option<i64>,
    dead_until: Option<i64>,
}

fn unix_seconds(name: &str, secs: Option<i64>) -> Result<Option<Timestamp>, ApiError> {
    secs.map(|s| {
        s.checked_mul(1000)
            .filter(|ms| *ms >= 0)
            .map(Timestamp::from_millis)
            .ok_or_else(|| ApiError::invalid(format!("{name} must be Unix seconds, got {s}")))
    })
    .transpose()
}

/// Replays every dead delivery the body's filter matches (all of the
/// account's without a body); answers how many.
pub(crate) async fn delivery_replay_dead(
    State(s): Shared,
    Scope(account): Scope,
    body: Option<Json<ReplayBody>>,
) -> Answer {
    let mut filter = ReplayFilter::all(account);
    if let Some(Json(b)) = body {
        filter.endpoint_id = b
            .endpoint_id
            .map(|e| {
                e.parse().map_err(|_| {
                    ApiError::invalid(format!("endpoint_id is not an endpoint id: {e:?}"))
                })
            })
            .transpose()?;
        filter.dead_since = unix_seconds("dead_since", b.dead_since)?;
        filter.dead_until = unix_seconds("dead_until", b.dead_until)?;
    }
    let replayed = s.store.delivery_replay_dead(filter).await?;
    ok(StatusCode::OK, json!({ "replayed": replayed }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskBody {
    id: Option<String>,
    kind: String,
    #[serde(default)]
    payload: Value,
    delay_seconds: Option<u32>,
}

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
    ok(status, views::task(&enqueued.task))
}

pub(crate) async fn task_get(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, task)): Path<(String, String)>,
) -> Answer {
    let task = TaskId::new(task).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_get(&account, &task).await?;
    ok(StatusCode::OK, views::task(&t))
}

pub(crate) async fn task_list_dead(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = s.store.workflow_list_dead(&account, page(&q)?).await?;
    listed(&p, views::task)
}

pub(crate) async fn task_retry(
    State(s): Shared,
    Scope(account): Scope,
    Path((_, task)): Path<(String, String)>,
) -> Answer {
    let task = TaskId::new(task).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_retry_dead(&account, &task).await?;
    ok(StatusCode::OK, views::task(&t))
}

fn query_time(q: &HashMap<String, String>, name: &str) -> Result<Option<Timestamp>, ApiError> {
    q.get(name)
        .map(|v| {
            v.parse::<i64>()
                .ok()
                .and_then(|secs| secs.checked_mul(1000))
                .map(Timestamp::from_millis)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{name} must be Unix seconds, got {v:?}"))
                })
        })
        .transpose()
}

pub(crate) async fn usage(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let to = query_time(&q, "to")?.unwrap_or_else(|| s.clock.now().plus(Duration::from_secs(1)));
    let from = query_time(&q, "from")?.unwrap_or_else(|| to.minus(Duration::from_secs(24 * 3600)));
    let rows = s.store.usage_query(&account, from, to).await?;
    let items: Vec<Value> = rows.iter().map(views::usage).collect();
    ok(StatusCode::OK, json!({ "items": items }))
}

pub(crate) async fn alerts(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = s.store.alert_list(&account, page(&q)?).await?;
    listed(&p, views::alert)
}
