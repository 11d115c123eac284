//! Endpoints: create, read, change, delete, rotate, enable and disable,
//! their stats, and their recovery.

use control_plane_core::{ClientCredentials, ClientTls};
use control_plane_core::{EndpointKey, SignatureScheme, Transform};

use crate::views::RetrySettings;

use super::{
    double, id, ok, ok_showing_secret, query, unix_seconds, AccountPath, Answer, ApiError,
    ApiState, BTreeMap, Caller, Deserialize, Duration, EndpointCreateRequest, EndpointDeleted,
    EndpointDetail, EndpointId, EndpointStats, EndpointUpdateRequest, EndpointView,
    EndpointWithSecret, ErrorBody, EventFilter, ItemPath, Json, ListQuery, Listing, OptionalJson,
    Path, Query, Recovery, Scope, Secret, Shared, State, StatusCode, TaskView, Timestamp, ToSchema,
    Value,
};

/// How an endpoint's requests are signed (Standard Webhooks).
#[derive(Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SignatureBody {
    /// `v1`: HMAC-SHA256 under a shared `whsec_` secret.
    Hmac,
    /// `v1a`: Ed25519; the endpoint's `whsk_` key signs, receivers verify
    /// with its `public_key` (`whpk_`).
    Ed25519,
}

impl From<SignatureBody> for SignatureScheme {
    fn from(b: SignatureBody) -> Self {
        match b {
            SignatureBody::Hmac => SignatureScheme::Hmac,
            SignatureBody::Ed25519 => SignatureScheme::Ed25519,
        }
    }
}

/// How an endpoint gets its deliveries.
#[derive(Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum KindBody {
    /// Sent to its `url` (the default).
    #[default]
    Push,
    /// Read by its consumer from `GET …/endpoints/{id}/poll`; no `url`
    /// (docs/http-api.md, "Poll endpoints").
    Poll,
}

/// A new endpoint.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointCreateBody {
    /// `push` (the default): deliveries go to `url`; `poll`: no `url`, its
    /// consumer reads them (settings that shape sending are refused).
    #[serde(default)]
    kind: KindBody,
    /// Where the deliveries go, required for `push`: an `http(s)://` URL,
    /// or a broker's (`amqp(s)://…?exchange=E&routing_key=K`,
    /// `nats://…?subject=S` with no wildcard and not starting with `$`,
    /// `redis(s)://…[/db]?stream=K&maxlen=N` with at most one database
    /// number as the path; docs/http-api.md, "Destinations").
    url: Option<String>,
    /// Event types it receives; empty or absent means every type.
    #[serde(default)]
    event_types: Vec<String>,
    /// A filter on the event's type and payload, such as
    /// `{"data.amount": {"$gte": 100}}` (docs/http-api.md, "Endpoint filters");
    /// absent means every event of its types.
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// A jq program applied to each delivery's JSON body before it is
    /// signed, such as `{id: .data.id, kind: .type}`; `null` from it drops
    /// the delivery (docs/http-api.md, "Transformations"). At most 16 KiB;
    /// a program that does not compile is refused with its error.
    #[schema(max_length = 16384)]
    transform: Option<String>,
    /// Headers sent with every request, such as `{"x-api-key": "..."}` or
    /// `{"authorization": "Bearer ..."}`: sealed at rest, never shown again
    /// (the answers list their names only).
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// OAuth2 client credentials: an access token is fetched from
    /// `token_url` and sent as `Authorization: Bearer` (docs/http-api.md, "OAuth2").
    /// Sealed at rest; the client secret is never shown again.
    oauth2: Option<OAuth2Body>,
    /// A client certificate and its key, presented when the dispatcher
    /// connects (mutual TLS; `https` endpoints only; docs/http-api.md,
    /// "Client certificates"). The key is sealed at rest and never shown
    /// again; answers show the certificate's subject, issuer, validity and
    /// fingerprint.
    client_tls: Option<ClientTlsBody>,
    /// `whsec_` and the base64 of 24 to 64 bytes (hmac), or `whsk_` and
    /// the base64 of a 32-byte Ed25519 seed (ed25519); generated when absent.
    secret: Option<String>,
    /// How requests are signed, fixed for the endpoint's life: `hmac`
    /// (`v1`, the default) or `ed25519` (`v1a`); absent, the given secret's
    /// prefix says.
    signature: Option<SignatureBody>,
    /// One delivery in flight at a time, in publish order.
    #[serde(default)]
    ordered: bool,
    /// Requests per second at most, across every worker.
    rate_limit_per_s: Option<u32>,
    /// Deliveries in flight at most; absent means the service default.
    max_in_flight: Option<u32>,
    /// Its own retry schedule and attempt limit; absent means the service's
    /// (`CONTROLPLANE_RETRY_SCHEDULE`).
    retry: Option<RetrySettings>,
    description: Option<String>,
}

/// OAuth2 client credentials of an endpoint (RFC 6749, section 4.4).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuth2Body {
    /// The token endpoint, `http` or `https`.
    token_url: String,
    client_id: String,
    /// Write-only: never shown in an answer.
    client_secret: String,
    /// The `scope` asked for.
    scope: Option<String>,
    /// The `audience` asked for (an extension some servers need).
    audience: Option<String>,
}

impl From<OAuth2Body> for ClientCredentials {
    fn from(b: OAuth2Body) -> Self {
        ClientCredentials {
            token_url: b.token_url,
            client_id: b.client_id,
            client_secret: b.client_secret,
            scope: b.scope,
            audience: b.audience,
        }
    }
}

/// A client certificate and its private key (mutual TLS).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientTlsBody {
    /// The certificate, PEM (`-----BEGIN CERTIFICATE-----`): its own first,
    /// then any intermediates; at most 32 KiB.
    certificate: String,
    /// Write-only: the certificate's private key, PEM and not encrypted
    /// (PKCS#8, PKCS#1 RSA or SEC1 EC; RSA, ECDSA P-256/P-384 or Ed25519);
    /// at most 16 KiB. Never shown in an answer.
    key: String,
}

impl From<ClientTlsBody> for ClientTls {
    fn from(b: ClientTlsBody) -> Self {
        ClientTls {
            certificate: b.certificate,
            key: b.key,
        }
    }
}

/// `403` when an account key asks for a `max_in_flight` above the service
/// default: a larger share of every worker's send slots is the operator's
/// call (ADR 0019).
pub(super) fn cap_allowed(
    s: &ApiState,
    caller: &Caller,
    max_in_flight: Option<u32>,
) -> Result<(), ApiError> {
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
        (status = 403, description = "An account key asked for a max_in_flight above the service default, or the account holds its quota of endpoints", body = ErrorBody),
    ),
)]
pub(crate) async fn endpoint_create(
    State(s): Shared,
    Scope(account): Scope,
    caller: Caller,
    Json(body): Json<EndpointCreateBody>,
) -> Answer {
    cap_allowed(&s, &caller, body.max_in_flight)?;
    let scheme = body.signature.map_or_else(
        || SignatureScheme::of(body.secret.as_deref().unwrap_or_default()),
        SignatureScheme::from,
    );
    let secret = query::given_or_new_secret(body.secret, scheme)?;
    let secret_given = Secret::new(secret.clone());
    let mut req = match (body.kind, body.url) {
        (KindBody::Push, Some(url)) => EndpointCreateRequest::new(account, url, secret_given),
        (KindBody::Poll, None) => EndpointCreateRequest::poll(account, secret_given),
        (KindBody::Push, None) => {
            return Err(ApiError::invalid(
                "url is required (or kind \"poll\" for an endpoint its consumer reads)",
            ))
        }
        (KindBody::Poll, Some(_)) => {
            return Err(ApiError::invalid(
                "a poll endpoint has no url: its consumer reads GET …/endpoints/{id}/poll",
            ))
        }
    };
    req.event_types = body.event_types;
    req.filter = body.filter.map(EventFilter::parse).transpose()?;
    req.transform = match body.transform {
        Some(text) => Some(transform_of(text).await?),
        None => None,
    };
    req.headers = body.headers;
    req.oauth2 = body.oauth2.map(ClientCredentials::from);
    req.client_tls = body.client_tls.map(ClientTls::from);
    req.ordered = body.ordered;
    req.rate_limit_per_s = body.rate_limit_per_s;
    req.max_in_flight = body.max_in_flight;
    req.retry = body.retry.map(RetrySettings::checked).transpose()?;
    req.description = body.description;
    let e = query::create_endpoint(&s, req).await?;
    ok_showing_secret(
        StatusCode::CREATED,
        EndpointWithSecret::new(&e, secret, false),
        "secret",
    )
}

/// Lists the account's endpoints, oldest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints",
    tag = "endpoints",
    params(AccountPath, ListQuery),
    responses((status = 200, description = "One page of endpoints", body = Listing<EndpointView>)),
)]
pub(crate) async fn endpoint_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<ListQuery>,
) -> Answer {
    let all = s.store.endpoint_list(&account).await?;
    // Creation time (zero-padded) then id: the store's order, as text.
    let key =
        |e: &control_plane_core::Endpoint| format!("{:020}_{}", e.created_at.as_millis(), e.id);
    let page = Listing::<EndpointView>::page(&all, key, q.limit()?, q.cursor.as_deref());
    ok(StatusCode::OK, page)
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
    /// A new destination URL (as at create).
    url: Option<String>,
    event_types: Option<Vec<String>>,
    /// A new filter; `null` removes it.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<Object>)]
    filter: Option<Option<Value>>,
    /// A new jq program; `null` removes it.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<String>, max_length = 16384)]
    transform: Option<Option<String>>,
    /// New headers, replacing all of them; `{}` removes them.
    headers: Option<BTreeMap<String, String>>,
    /// New OAuth2 client credentials, replacing them; `null` removes them.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<OAuth2Body>)]
    oauth2: Option<Option<OAuth2Body>>,
    /// A new client certificate and key, replacing them; `null` removes
    /// them.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<ClientTlsBody>)]
    client_tls: Option<Option<ClientTlsBody>>,
    ordered: Option<bool>,
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<u32>)]
    rate_limit_per_s: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<u32>)]
    max_in_flight: Option<Option<u32>>,
    /// A new retry schedule and attempt limit, replacing both; `null`
    /// returns to the service's. Deliveries already made keep their attempt
    /// limit until they are replayed; the schedule applies from their next
    /// failure.
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<RetrySettings>)]
    retry: Option<Option<RetrySettings>>,
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
        (status = 403, description = "An account key asked for a max_in_flight above the service default, or the account holds its quota of endpoints", body = ErrorBody),
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
        transform: match body.transform {
            Some(Some(text)) => Some(Some(transform_of(text).await?)),
            Some(None) => Some(None),
            None => None,
        },
        headers: body.headers,
        oauth2: body.oauth2.map(|o| o.map(ClientCredentials::from)),
        client_tls: body.client_tls.map(|c| c.map(ClientTls::from)),
        ordered: body.ordered,
        rate_limit_per_s: body.rate_limit_per_s,
        max_in_flight: body.max_in_flight,
        retry: body
            .retry
            .map(|r| r.map(RetrySettings::checked).transpose())
            .transpose()?,
        description: body.description,
    };
    let e = s
        .store
        .endpoint_update(EndpointKey::new(&account, id("endpoint", &p.id)?), req)
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
    /// Send again the deliveries that succeeded too (the whole window);
    /// by default only the dead ones are resent and the missing ones created.
    #[serde(default)]
    include_delivered: bool,
}

/// Recovers an endpoint: every event of the window it is subscribed to
/// (by its event types and filter) that did not reach it is delivered to it
/// again, once: dead deliveries are resent under their ids, missing ones
/// created, delivered ones left unless `include_delivered` is true. It runs as a
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
    let mut recovery = Recovery::new(endpoint, since, until)?;
    if body.include_delivered {
        recovery = recovery.including_delivered();
    }
    let task = query::queue_recovery(&s.store, account, recovery).await?;
    ok(StatusCode::ACCEPTED, TaskView::from(&task))
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
    /// Of the endpoint's scheme: `whsec_` and the base64 of 24 to 64 bytes
    /// (hmac), or `whsk_` and the base64 of a 32-byte seed (ed25519).
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
    // A rotation keeps the endpoint's scheme.
    let (e, secret) = query::rotate_secret(
        &s,
        EndpointKey::new(&account, endpoint),
        body.and_then(|b| b.secret),
    )
    .await?;
    ok_showing_secret(
        StatusCode::OK,
        EndpointWithSecret::new(&e, secret, true),
        "secret",
    )
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
            EndpointKey::new(&account, id("endpoint", &p.id)?),
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
    // Checked by the store (`Enablement::into_row`): 422 when it is refused.
    let reason = body.and_then(|b| b.reason);
    let e = s
        .store
        .endpoint_set_enabled(
            EndpointKey::new(&account, endpoint),
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
    let last_hour = s
        .store
        .attempt_stats(EndpointKey::new(&account, endpoint), hour)
        .await?;
    let last_day = s
        .store
        .attempt_stats(EndpointKey::new(&account, endpoint), day)
        .await?;
    ok(
        StatusCode::OK,
        EndpointStats {
            last_hour: (&last_hour).into(),
            last_day: (&last_day).into(),
        },
    )
}

/// `text` checked as a jq program ([`Transform::parse`]) off the runtime's
/// workers, two at a time: compiling is CPU work, on a thread of its own
/// with a large stack.
async fn transform_of(text: String) -> Result<Transform, ApiError> {
    static CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    let _turn = CHECKS.acquire().await.map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "transform: programs cannot be checked now; try again",
        )
    })?;
    tokio::task::spawn_blocking(move || Transform::parse(&text))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("transform check: {e}"),
            )
        })?
        .map_err(ApiError::from)
}
