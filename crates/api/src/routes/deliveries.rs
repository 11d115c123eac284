//! Deliveries: list and read; replay, resend and bulk replay.

use super::{
    id, ok, page_request, query, unix_seconds, AccountId, AccountPath, Answer, ApiError,
    AttemptLogView, AttemptQuery, AttemptResult, DeliveryDetail, DeliveryListRequest, DeliveryView,
    Deserialize, EndpointId, EventId, FromStr, IntoParams, ItemPath, Listing, OptionalJson, Path,
    Query, ReplayFilter, Replayed, Scope, Shared, State, StatusCode, ToSchema,
};

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
    /// Only deliveries of events of this type (1 to 255 bytes).
    #[serde(rename = "type")]
    #[param(rename = "type", min_length = 1, max_length = 255)]
    event_type: Option<String>,
    /// Only deliveries created at or after this time (Unix seconds).
    since: Option<i64>,
    /// Only deliveries created before this time (Unix seconds).
    until: Option<i64>,
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
    let state = query::delivery_state(q.state.as_deref())?;
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
            state,
            endpoint_id,
            event_id,
            event_type: q
                .event_type
                .map(|t| {
                    (!t.is_empty() && t.len() <= 255)
                        .then_some(t)
                        .ok_or_else(|| ApiError::invalid("type: 1 to 255 bytes"))
                })
                .transpose()?,
            since: unix_seconds("since", q.since, ApiError::bad_request)?,
            until: unix_seconds("until", q.until, ApiError::bad_request)?,
            ..DeliveryListRequest::all(account, page_request(q.limit, q.cursor.as_deref())?)
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
    let found = query::delivery_with_attempts(&s.store, &account, id("delivery", &p.id)?).await?;
    ok(
        StatusCode::OK,
        DeliveryDetail::new(&found.delivery, &found.attempts),
    )
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

/// Filters of an attempt search.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AttemptSearch {
    /// Only attempts that ended so: `delivered`, `failed` or `lease_expired`.
    result: Option<String>,
    /// Only attempts answered with this HTTP status.
    #[param(minimum = 100, maximum = 599)]
    status_code: Option<u16>,
    /// Only attempts recorded at or after this time (Unix seconds).
    since: Option<i64>,
    /// Only attempts recorded before this time (Unix seconds).
    until: Option<i64>,
    /// Items per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// The store's query for a search of `account`'s attempts.
fn attempt_query(account: AccountId, q: AttemptSearch) -> Result<AttemptQuery, ApiError> {
    let result = q
        .result
        .as_deref()
        .map(|r| {
            AttemptResult::from_str(r).map_err(|_| {
                ApiError::bad_request(format!(
                    "result {r:?}: expected delivered, failed or lease_expired"
                ))
            })
        })
        .transpose()?;
    if let Some(code) = q.status_code {
        if !(100..=599).contains(&code) {
            return Err(ApiError::bad_request(format!(
                "status_code {code}: expected 100 to 599"
            )));
        }
    }
    Ok(AttemptQuery {
        result,
        status_code: q.status_code,
        since: unix_seconds("since", q.since, ApiError::bad_request)?,
        until: unix_seconds("until", q.until, ApiError::bad_request)?,
        ..AttemptQuery::new(account, page_request(q.limit, q.cursor.as_deref())?)
    })
}

/// The account's delivery attempts, newest first, filtered by result,
/// status code and time window.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/attempts",
    tag = "deliveries",
    params(AccountPath, AttemptSearch),
    responses((status = 200, description = "One page of attempts", body = Listing<AttemptLogView>)),
)]
pub(crate) async fn attempt_search(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<AttemptSearch>,
) -> Answer {
    let page = s.store.attempt_search(attempt_query(account, q)?).await?;
    ok(StatusCode::OK, Listing::<AttemptLogView>::of(&page))
}

/// One endpoint's delivery attempts, newest first, filtered as the
/// account's are.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{id}/attempts",
    tag = "deliveries",
    params(ItemPath, AttemptSearch),
    responses((status = 200, description = "One page of attempts", body = Listing<AttemptLogView>)),
)]
pub(crate) async fn endpoint_attempt_search(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    Query(q): Query<AttemptSearch>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let query = attempt_query(account, q)?.of_endpoint(endpoint);
    let page = s.store.attempt_search(query).await?;
    ok(StatusCode::OK, Listing::<AttemptLogView>::of(&page))
}
