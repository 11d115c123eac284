//! Events: publish, list and read.

use control_plane_core::{AccountId, Checked, StoreError, TraceParent};

use crate::ApiState;
use tracing::Instrument;

use super::{
    id, ok, page_request, unix_seconds, AccountPath, Answer, ApiError, Check, Deserialize,
    EventListRequest, EventView, HeaderMap, IntoParams, ItemPath, Json, Listing, Path,
    PublishRequest, Published, Query, Scope, Serialize, Shared, State, StatusCode, ToSchema,
    UsageMetric, Value,
};

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
        page: page_request(q.limit, q.cursor.as_deref())?,
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
        ("traceparent" = Option<String>, Header, description = "W3C trace context (version 00), stored with the event and sent on its deliveries; an invalid one is ignored"),
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
    let idempotency_key = crate::idempotency::header_key(&headers)?;
    let span = tracing::debug_span!("publish", account = %account, event_type = %body.event_type);
    let traceparent = joined_trace(&headers, &span);
    let req = PublishRequest {
        account: account.clone(),
        event_type: body.event_type,
        payload: body.payload,
        idempotency_key,
        traceparent,
    }
    .checked()?;
    // Keyed publishes go alone: the key's first answer is the one returned.
    let published = if req.idempotency_key.is_some() {
        s.store.event_publish(req).instrument(span).await?
    } else {
        s.publisher.publish(req).instrument(span).await?
    };
    if published.created {
        s.usage.add(&account, UsageMetric::EventsPublished, 1);
    }
    ok(StatusCode::ACCEPTED, Published::from(published))
}

/// Events one batch publish takes at most.
pub(crate) const MAX_BATCH_EVENTS: usize = 100;

/// Deliveries one batch publish may create at most (its events times the
/// endpoints each reaches): a request of 1 MiB fanned out to 100,000
/// deliveries in 2 s before this bound (issue 72).
pub(crate) const MAX_BATCH_DELIVERIES: usize = 10_000;

/// One event of a batch publish.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchEventBody {
    /// Its type; endpoints subscribe by type.
    #[serde(rename = "type")]
    #[schema(min_length = 1, max_length = 255)]
    event_type: String,
    /// Any JSON value; sent as the `data` of every delivery.
    payload: Value,
    /// This event's idempotency key (as the `Idempotency-Key` header of a
    /// single publish): publishing it again returns the first event.
    #[schema(min_length = 1, max_length = 255)]
    idempotency_key: Option<String>,
}

/// Events to publish together.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishBatchBody {
    /// 1 to 100 events, stored in one transaction: all of them or none;
    /// together they may create at most 10,000 deliveries (events times the
    /// endpoints each reaches), or the batch is `422` and stores nothing.
    #[schema(min_items = 1, max_items = 100)]
    events: Vec<BatchEventBody>,
}

/// What a batch publish stored, in the order of the request.
#[derive(Serialize, ToSchema)]
pub(crate) struct PublishedBatch {
    /// One answer per event, as a single publish gives it.
    events: Vec<Published>,
}

/// Publishes up to 100 events at once, all or nothing: one invalid event
/// (or a key used twice in the batch) refuses the batch and stores none.
/// Each event may carry its own idempotency key.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/events/batch",
    tag = "events",
    params(
        AccountPath,
        ("traceparent" = Option<String>, Header, description = "W3C trace context (version 00), stored with every event of the batch and sent on their deliveries; an invalid one is ignored"),
    ),
    request_body = PublishBatchBody,
    responses((status = 202, description = "Accepted, every event", body = PublishedBatch)),
)]
pub(crate) async fn event_publish_batch(
    State(s): Shared,
    Scope(account): Scope,
    headers: HeaderMap,
    Json(body): Json<PublishBatchBody>,
) -> Answer {
    let n = body.events.len();
    if n == 0 || n > MAX_BATCH_EVENTS {
        return Err(ApiError::invalid(format!(
            "events: expected 1 to {MAX_BATCH_EVENTS} events, got {n}"
        )));
    }
    let span = tracing::debug_span!("publish_batch", account = %account, events = n);
    let traceparent = joined_trace(&headers, &span);
    let mut keys = std::collections::HashSet::new();
    let mut reqs = Vec::with_capacity(n);
    for (i, e) in body.events.into_iter().enumerate() {
        if let Some(k) = &e.idempotency_key {
            if !keys.insert(k.clone()) {
                return Err(ApiError::invalid(format!(
                    "events[{i}].idempotency_key: {k:?} is used by an earlier event of this batch"
                )));
            }
        }
        let req = PublishRequest {
            account: account.clone(),
            event_type: e.event_type,
            payload: e.payload,
            idempotency_key: e.idempotency_key,
            traceparent: traceparent.clone(),
        }
        .checked()
        .map_err(|e| match e {
            StoreError::InvalidInput(m) => ApiError::invalid(format!("events[{i}]: {m}")),
            other => ApiError::from(other),
        })?;
        reqs.push(req);
    }
    within_fan_out_bound(&s, &account, &reqs).await?;
    let published = s.store.event_publish_batch(reqs).instrument(span).await?;
    let created = published.iter().filter(|p| p.created).count();
    s.usage.add(
        &account,
        UsageMetric::EventsPublished,
        u64::try_from(created).unwrap_or(u64::MAX),
    );
    ok(
        StatusCode::ACCEPTED,
        PublishedBatch {
            events: published.into_iter().map(Published::from).collect(),
        },
    )
}

/// Refuses a batch that would create more than [`MAX_BATCH_DELIVERIES`]
/// deliveries, counted with core's one fan-out rule over the account's
/// endpoints as they are now (one read, bounded by the endpoint quota).
async fn within_fan_out_bound(
    s: &ApiState,
    account: &AccountId,
    reqs: &[Checked<PublishRequest>],
) -> Result<(), ApiError> {
    let endpoints = s.store.endpoint_list(account).await?;
    let deliveries: usize = reqs
        .iter()
        .map(|r| control_plane_core::fan_out(&endpoints, &r.event_type, &r.payload, None).len())
        .sum();
    if deliveries > MAX_BATCH_DELIVERIES {
        return Err(ApiError::invalid(format!(
            "this batch would create {deliveries} deliveries ({} events to the account's \
             endpoints), over the {MAX_BATCH_DELIVERIES} one request may create; publish \
             it in smaller batches",
            reqs.len()
        )));
    }
    Ok(())
}

/// The trace context a publish stores (README: Tracing): the caller's
/// `traceparent` is joined by `span`, and the event keeps the span's own
/// context when spans are exported, or the caller's as it came when not.
fn joined_trace(headers: &HeaderMap, span: &tracing::Span) -> Option<TraceParent> {
    let caller = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    if let Some(c) = &caller {
        control_plane_runtime::trace::join(c, span);
    }
    control_plane_runtime::trace::of(span).or(caller)
}
