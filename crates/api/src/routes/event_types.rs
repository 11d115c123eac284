//! The event-type catalogue: register, read, list, remove, send an example.

use super::{
    id, ok, over_quota, query, AccountPath, Answer, ApiError, ApiState, Check, Deserialize,
    EventType, EventTypePut, EventTypeView, IntoParams, IntoResponse, ItemPath, Json, ListQuery,
    Listing, Path, Published, Query, Scope, Shared, State, StatusCode, ToSchema, Value,
};

/// One registered type of an account.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct EventTypePath {
    /// The account (tenant) name.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    #[allow(dead_code)]
    account: String,
    /// The type's name, as events are published with it.
    name: String,
}

/// What a type is registered with; a registration replaces all of it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventTypeBody {
    /// What the type means, at most 1024 bytes.
    #[serde(default)]
    #[schema(max_length = 1024)]
    description: String,
    /// A JSON Schema (draft 2020-12 unless `$schema` names another) that
    /// every payload of the type must match; only local `$ref`s resolve.
    schema: Option<Value>,
    /// An example payload; it must match `schema`. Sent by `send-example`.
    example: Option<Value>,
}

/// Registers an event type, or replaces its registration. From then on a
/// publish of the type whose payload does not match its schema is `422`,
/// naming the failing path, and stores nothing.
#[utoipa::path(
    put,
    path = "/v1/accounts/{account}/event-types/{name}",
    tag = "event types",
    params(EventTypePath),
    request_body = EventTypeBody,
    responses((status = 200, description = "The type as registered", body = EventTypeView)),
)]
pub(crate) async fn event_type_put(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<EventTypePath>,
    Json(body): Json<EventTypeBody>,
) -> Answer {
    let req = EventTypePut {
        schema: body.schema,
        example: body.example,
        ..EventTypePut::new(account, p.name, body.description)
    };
    // Checked and written under the account's quota lock, so that
    // registrations that race cannot pass the quota together.
    let _quota = s.quota_lock(&req.account).await;
    within_quotas(&s, &req).await?;
    // Compiling a schema is CPU work bounded by its limits: it runs on a
    // blocking thread, never on a worker the dispatcher shares.
    let checked = tokio::task::spawn_blocking(move || req.checked())
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("schema check: {e}"),
            )
        })??;
    let t = s.store.event_type_put(checked).await?;
    ok(StatusCode::OK, EventTypeView::from(&t))
}

/// Refuses a registration that takes the account past its quota of event
/// types or of schema and example bytes (the type's own earlier
/// registration, if any, does not count: it is replaced).
async fn within_quotas(s: &ApiState, req: &EventTypePut) -> Result<(), ApiError> {
    let size = |t: Option<String>| t.map_or(0, |t| t.len() as u64);
    let mine = size(req.schema_text()?) + size(req.example_text());
    let others: Vec<EventType> = s
        .store
        .event_type_list(&req.account)
        .await?
        .into_iter()
        .filter(|t| t.name != req.name)
        .collect();
    let quotas = s.quotas;
    let holds = others.len() as u64 + 1;
    if holds > u64::from(quotas.event_types) {
        let setting = "CONTROLPLANE_QUOTA_EVENT_TYPES";
        let quota = quotas.event_types.into();
        return Err(over_quota(
            &req.account,
            "event types",
            holds,
            quota,
            setting,
        ));
    }
    let bytes = others
        .iter()
        .map(|t| {
            size(t.schema.as_ref().map(|v| v.to_string()))
                + size(t.example.as_ref().map(|v| v.to_string()))
        })
        .sum::<u64>()
        + mine;
    if bytes > quotas.schema_bytes {
        let setting = "CONTROLPLANE_QUOTA_SCHEMA_BYTES";
        let what = "bytes of schemas and examples";
        return Err(over_quota(
            &req.account,
            what,
            bytes,
            quotas.schema_bytes,
            setting,
        ));
    }
    Ok(())
}

/// The account's registered types, by name, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/event-types",
    tag = "event types",
    params(AccountPath, ListQuery),
    responses((status = 200, description = "One page of the catalogue", body = Listing<EventTypeView>)),
)]
pub(crate) async fn event_type_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<ListQuery>,
) -> Answer {
    let mut types = s.store.event_type_list(&account).await?;
    // By name as bytes: the order the cursor compares in.
    types.sort_by(|a, b| a.name.cmp(&b.name));
    let key = |t: &EventType| t.name.clone();
    let page = Listing::<EventTypeView>::page(&types, key, q.limit()?, q.cursor.as_deref());
    ok(StatusCode::OK, page)
}

/// One registered type.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/event-types/{name}",
    tag = "event types",
    params(EventTypePath),
    responses((status = 200, description = "The type", body = EventTypeView)),
)]
pub(crate) async fn event_type_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<EventTypePath>,
) -> Answer {
    let t = s.store.event_type_get(&account, &p.name).await?;
    ok(StatusCode::OK, EventTypeView::from(&t))
}

/// Removes a type from the catalogue: its publishes are no longer checked.
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/event-types/{name}",
    tag = "event types",
    params(EventTypePath),
    responses((status = 204, description = "Removed")),
)]
pub(crate) async fn event_type_delete(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<EventTypePath>,
) -> Answer {
    s.store.event_type_delete(&account, &p.name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Which example to send.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendExampleBody {
    /// A registered type with an example.
    #[serde(rename = "type")]
    #[schema(min_length = 1, max_length = 255)]
    event_type: String,
}

/// Sends a type's example to this endpoint alone, whatever its event types
/// and filter say: one event of the type with the example as its payload,
/// delivered (signed, retried) like any other.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{id}/send-example",
    tag = "endpoints",
    params(ItemPath),
    request_body = SendExampleBody,
    responses((status = 202, description = "Accepted", body = Published)),
)]
pub(crate) async fn endpoint_send_example(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
    Json(body): Json<SendExampleBody>,
) -> Answer {
    let endpoint = id("endpoint", &p.id)?;
    let published = query::send_example(&s, &account, &body.event_type, endpoint).await?;
    ok(StatusCode::ACCEPTED, Published::from(published))
}
