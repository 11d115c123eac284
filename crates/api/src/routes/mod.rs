//! The v1 handlers, each with its OpenAPI description beside it
//! (`utoipa::path`): the router and the document are built from one list
//! (`crate::openapi`). Each handler resolves the caller's reach first, so a
//! key of one account gets `404` for every route of another.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use control_plane_core::{
    AccountId, AttemptQuery, AttemptResult, Check, DeliveryListRequest, EndpointCreateRequest,
    EndpointId, EndpointUpdateRequest, EventFilter, EventId, EventListRequest, EventType,
    EventTypePut, KeyId, PageRequest, PublishRequest, Recovery, ReplayFilter, Secret,
    TaskEnqueueRequest, TaskId, TaskListRequest, TaskState, Timestamp, UsageMetric,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::auth::{caller_for_hash, generate_token, hash_token, AdminScope, Caller, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::query::{self, over_quota, page_request};
use crate::views::{
    self, AlertView, AttemptLogView, DeliveryDetail, DeliveryView, EndpointDeleted, EndpointDetail,
    EndpointStats, EndpointView, EndpointWithSecret, EventTypeView, EventView, KeyCreated, Listing,
    Published, Replayed, SessionList, SessionView, TaskView, UsageList, UsageView,
};
use crate::ApiState;

pub(crate) mod admin;
pub(crate) mod deliveries;
pub(crate) mod endpoints;
pub(crate) mod event_types;
pub(crate) mod events;
pub(crate) mod operations;
pub(crate) mod poll;
pub(crate) mod portal;
pub(crate) mod tasks;

type Shared = State<Arc<ApiState>>;
type Answer = Result<Response, ApiError>;

fn ok<T: Serialize>(status: StatusCode, body: T) -> Answer {
    Ok((status, Json(body)).into_response())
}

/// [`ok`] for an answer that shows a secret once (`field` of `body`): its
/// idempotency record keeps `null` in its place, so a store holds no secret
/// for a replay (ADR 0043).
fn ok_showing_secret<T: Serialize>(status: StatusCode, body: T, field: &'static str) -> Answer {
    let mut r = (status, Json(body)).into_response();
    r.extensions_mut()
        .insert(crate::idempotency::ShowsSecret(field));
    Ok(r)
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

/// One page of a listing the store answers whole (endpoints, event
/// types): bounded by the account's quotas, paged here.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Items per page, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(max_length = 512)]
    cursor: Option<String>,
}

impl ListQuery {
    /// `limit` checked: `400` outside 1 to 1000.
    fn limit(&self) -> Result<Option<u32>, ApiError> {
        match self.limit {
            Some(n) if !(1..=1000).contains(&n) => Err(ApiError::bad_request(format!(
                "limit must be from 1 to 1000, got {n}"
            ))),
            n => Ok(n),
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
        page_request(self.limit, self.cursor.as_deref())
    }
}

/// Parses a path id; a malformed one cannot exist, so it is `404`.
fn id<T: FromStr>(what: &str, s: &str) -> Result<T, ApiError> {
    s.parse().map_err(|_| ApiError::not_found(what))
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
