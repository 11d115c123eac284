//! Poll endpoints (ADR 0051): the consumer of an endpoint of kind `poll`
//! reads its events in order with a cursor, with its account's key.
//! Reading is acknowledging: what a read returns is delivered.

use control_plane_core::{PollPage, PollRequest, Polled, DEFAULT_POLL_LIMIT, MAX_POLL_LIMIT};
use serde::Serialize;

use super::{
    id, ok, Answer, ApiError, Deserialize, ErrorBody, ItemPath, Path, Query, Scope, Shared, State,
    StatusCode, ToSchema, Value,
};
use crate::views::time;
use utoipa::IntoParams;

/// Where a read starts and how much it takes.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PollQuery {
    /// Events at most, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `cursor` of the previous read. Absent, the read starts at the
    /// oldest event the attempt log still keeps; an earlier cursor reads
    /// the same events again.
    #[param(pattern = "^[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// One event as its consumer reads it.
#[derive(Serialize, ToSchema)]
pub(crate) struct PolledView {
    /// The delivery this read acknowledged (`webhook-id` of a pushed one).
    #[schema(value_type = uuid::Uuid)]
    id: String,
    #[schema(value_type = uuid::Uuid)]
    event_id: String,
    event_type: String,
    /// The body a pushed endpoint would receive: `{"type","timestamp","data"}`.
    #[schema(value_type = Object)]
    payload: Value,
    #[schema(format = DateTime)]
    published_at: String,
    /// When it was first handed out by a read (the delivery's attempt).
    #[schema(format = DateTime)]
    read_at: String,
}

impl From<Polled> for PolledView {
    fn from(p: Polled) -> Self {
        PolledView {
            id: p.delivery_id.to_string(),
            event_id: p.event_id.to_string(),
            event_type: p.event_type,
            payload: serde_json::from_str(&p.body).unwrap_or(Value::String(p.body)),
            published_at: time(p.published_at),
            read_at: time(p.read_at),
        }
    }
}

/// One read.
#[derive(Serialize, ToSchema)]
pub(crate) struct PollView {
    /// The events, oldest first.
    data: Vec<PolledView>,
    /// Give it as `cursor` to the next read.
    cursor: String,
    /// Whether the read took everything there was (fewer than `limit`).
    done: bool,
}

impl From<PollPage> for PollView {
    fn from(p: PollPage) -> Self {
        PollView {
            data: p.events.into_iter().map(PolledView::from).collect(),
            cursor: p.cursor.to_string(),
            done: p.done,
        }
    }
}

/// Reads a poll endpoint's next events, in publish order, and marks them
/// delivered (one attempt each): its consumer's way in, with the account's
/// key. Read again with the returned `cursor`; repeat an earlier cursor to
/// read the same events again after a lost answer.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{id}/poll",
    tag = "endpoints",
    params(ItemPath, PollQuery),
    responses(
        (status = 200, description = "The next events and the cursor after them", body = PollView),
        (status = 422, description = "The endpoint is not a poll endpoint, or the cursor is ahead of every read of it", body = ErrorBody),
    ),
)]
pub(crate) async fn endpoint_poll(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    Query(q): Query<PollQuery>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let limit = q.limit.unwrap_or(DEFAULT_POLL_LIMIT);
    if !(1..=MAX_POLL_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be from 1 to {MAX_POLL_LIMIT}, got {limit}"
        )));
    }
    let after = match q.cursor.as_deref() {
        None => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_request(format!("cursor must be one a read returned, got {c:?}"))
        })?),
    };
    let page = s
        .store
        .delivery_poll(PollRequest::new(account, endpoint, after, limit)?)
        .await?;
    ok(StatusCode::OK, PollView::from(page))
}
