//! The JSON shapes of the API's answers, as types: the same types serialize
//! the answers and describe them in the OpenAPI document, so the two cannot
//! drift. Secrets appear only where a route says so (endpoint creation and
//! rotation).

use control_plane_core::Ed25519Key;
use control_plane_core::SignatureScheme;
use control_plane_core::{
    Alert, AttemptRecord, AttemptStats, Circuit, Delivery, DeliveryId, Endpoint, EndpointId,
    EndpointRetry, Event, EventFilter, EventId, EventType, Page, Task, Timestamp, UsageRow,
};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

pub(crate) fn time(t: Timestamp) -> String {
    t.to_rfc3339()
}

/// An endpoint, without its secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointView {
    #[schema(value_type = uuid::Uuid)]
    id: EndpointId,
    account: String,
    /// `push`: deliveries go to `url`; `poll`: its consumer reads them
    /// (`GET …/endpoints/{id}/poll`).
    #[schema(pattern = "^(push|poll)$")]
    kind: &'static str,
    /// Where deliveries go; `null` for a poll endpoint.
    url: Option<String>,
    /// Event types it receives; empty means every type.
    event_types: Vec<String>,
    /// Its filter on the event's type and payload, if any.
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// Its jq program, applied to each body before it is signed, if any.
    transform: Option<String>,
    /// The names of its custom headers (their values are never shown).
    header_names: Vec<String>,
    /// Its OAuth2 client credentials without the secret, if it has them.
    oauth2: Option<OAuth2View>,
    /// Its client certificate (mutual TLS), if it has one: never the key.
    client_tls: Option<ClientTlsView>,
    enabled: bool,
    /// Why it was disabled (by an operator or by the circuit's policy).
    disabled_reason: Option<String>,
    /// One delivery in flight at a time, in publish order.
    ordered: bool,
    /// Requests per second at most, across every worker.
    rate_limit_per_s: Option<u32>,
    /// Deliveries in flight at most; unset means the service default.
    max_in_flight: Option<u32>,
    /// Its own retry schedule and attempt limit; unset means the service's.
    retry: Option<RetrySettings>,
    /// How its requests are signed: `hmac` (`v1`) or `ed25519` (`v1a`).
    #[schema(pattern = "^(hmac|ed25519)$")]
    signature: &'static str,
    /// For `ed25519`: the public key (`whpk_` and base64) receivers verify
    /// the `v1a` signatures with; it changes with every rotation.
    public_key: Option<String>,
    description: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
}

/// An endpoint's own retry schedule and attempt limit.
#[derive(Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetrySettings {
    /// Seconds to wait before each retry (1 to 50 delays, each 1 to
    /// 604,800): after failed attempt n comes `schedule[n-1]`, and the last
    /// delay repeats.
    pub(crate) schedule: Vec<u64>,
    /// Attempts a delivery gets before it is dead (1 to 100); when absent,
    /// one more than the schedule has delays. Always shown.
    pub(crate) max_attempts: Option<u32>,
}

impl RetrySettings {
    /// The checked setting.
    pub(crate) fn checked(self) -> Result<EndpointRetry, control_plane_core::StoreError> {
        let schedule = self
            .schedule
            .into_iter()
            .map(std::time::Duration::from_secs)
            .collect();
        EndpointRetry::new(schedule, self.max_attempts)
    }
}

impl From<&EndpointRetry> for RetrySettings {
    fn from(r: &EndpointRetry) -> Self {
        RetrySettings {
            schedule: r
                .schedule()
                .iter()
                .map(std::time::Duration::as_secs)
                .collect(),
            max_attempts: Some(r.max_attempts()),
        }
    }
}

/// An endpoint's OAuth2 client credentials as shown: never the secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct OAuth2View {
    token_url: String,
    client_id: String,
    scope: Option<String>,
    audience: Option<String>,
}

/// An endpoint's client certificate as shown: never the key.
#[derive(Serialize, ToSchema)]
pub(crate) struct ClientTlsView {
    /// The certificate's subject, e.g. `CN=orders, O=Acme`.
    subject: String,
    /// Who issued it.
    issuer: String,
    #[schema(format = DateTime)]
    not_before: String,
    /// When it expires: replace it before then.
    #[schema(format = DateTime)]
    not_after: String,
    /// SHA-256 of the certificate (DER), lower-case hex.
    fingerprint_sha256: String,
}

impl From<control_plane_core::CertificateSummary> for ClientTlsView {
    fn from(s: control_plane_core::CertificateSummary) -> Self {
        ClientTlsView {
            subject: s.subject,
            issuer: s.issuer,
            not_before: time(s.not_before),
            not_after: time(s.not_after),
            fingerprint_sha256: s.fingerprint_sha256,
        }
    }
}

impl From<&Endpoint> for EndpointView {
    fn from(e: &Endpoint) -> Self {
        EndpointView {
            id: e.id,
            account: e.account.as_str().to_string(),
            kind: e.kind(),
            url: (!e.is_poll()).then(|| e.url.clone()),
            event_types: e.event_types.clone(),
            filter: e.filter.as_ref().map(EventFilter::to_json),
            transform: e.transform.as_ref().map(|t| t.as_str().to_string()),
            header_names: e.header_names(),
            oauth2: e.oauth2_client().map(|c| OAuth2View {
                token_url: c.token_url,
                client_id: c.client_id,
                scope: c.scope,
                audience: c.audience,
            }),
            client_tls: e
                .client_tls()
                .and_then(|c| c.summary().ok())
                .map(ClientTlsView::from),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            ordered: e.ordered,
            rate_limit_per_s: e.rate_limit_per_s,
            max_in_flight: e.max_in_flight,
            retry: e.retry.as_ref().map(RetrySettings::from),
            signature: SignatureScheme::of(e.secrets.current.expose()).as_str(),
            public_key: Ed25519Key::from_secret(e.secrets.current.expose()).map(|k| k.public_key()),
            description: e.description.clone(),
            created_at: time(e.created_at),
            updated_at: time(e.updated_at),
        }
    }
}

/// An endpoint with the signing secret the caller just set or was given:
/// the only answers that carry a secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointWithSecret {
    #[serde(flatten)]
    endpoint: EndpointView,
    /// `whsec_` and the base64 of the key that signs from now on.
    secret: String,
    /// After a rotation: until when the previous secret also signs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    previous_secret_expires_at: Option<String>,
}

impl EndpointWithSecret {
    pub(crate) fn new(e: &Endpoint, secret: String, rotated: bool) -> Self {
        EndpointWithSecret {
            endpoint: e.into(),
            secret,
            previous_secret_expires_at: if rotated {
                e.secrets.previous_expires_at.map(time)
            } else {
                None
            },
        }
    }
}

/// The circuit breaker's state for one endpoint.
#[derive(Serialize, ToSchema)]
pub(crate) struct CircuitView {
    /// `closed`, `open` or `half_open`.
    mode: String,
    consecutive_failures: u32,
    #[schema(format = DateTime)]
    open_until: Option<String>,
}

/// An endpoint and its circuit.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointDetail {
    #[serde(flatten)]
    endpoint: EndpointView,
    circuit: CircuitView,
}

impl EndpointDetail {
    pub(crate) fn new(e: &Endpoint, c: &Circuit) -> Self {
        EndpointDetail {
            endpoint: e.into(),
            circuit: CircuitView {
                mode: c.mode.as_str().to_string(),
                consecutive_failures: c.consecutive_failures,
                open_until: c.open_until.map(time),
            },
        }
    }
}

/// What deleting an endpoint did.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointDeleted {
    pub(crate) deleted: bool,
    /// Its deliveries not yet delivered, now dead (replayable elsewhere).
    pub(crate) deliveries_parked_as_dead: u64,
}

/// Attempt counts by result.
#[derive(Serialize, ToSchema)]
pub(crate) struct AttemptCounts {
    delivered: u64,
    failed: u64,
    lease_expired: u64,
}

/// Attempts of one time window.
#[derive(Serialize, ToSchema)]
pub(crate) struct StatsWindow {
    attempts: AttemptCounts,
    /// Delivered over all attempts; `null` without attempts.
    success_rate: Option<f64>,
    /// Median response time, in milliseconds: the upper bound of the latency
    /// bucket holding the nearest rank (at most 25 % above it).
    p50_latency_ms: Option<u64>,
    /// 95th percentile response time, in milliseconds, by the same rule.
    p95_latency_ms: Option<u64>,
}

impl From<&AttemptStats> for StatsWindow {
    fn from(s: &AttemptStats) -> Self {
        StatsWindow {
            attempts: AttemptCounts {
                delivered: s.delivered,
                failed: s.failed,
                lease_expired: s.lease_expired,
            },
            success_rate: s.success_rate(),
            p50_latency_ms: s.p50_latency_ms,
            p95_latency_ms: s.p95_latency_ms,
        }
    }
}

/// An endpoint's attempts in the last hour and the last day.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointStats {
    pub(crate) last_hour: StatsWindow,
    pub(crate) last_day: StatsWindow,
}

/// An event with the exact body its deliveries send.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventView {
    #[schema(value_type = uuid::Uuid)]
    id: EventId,
    account: String,
    #[serde(rename = "type")]
    event_type: String,
    /// The request body every delivery of this event sends.
    body: String,
    idempotency_key: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    /// Sent by `send-example` to one endpoint; never delivered to another.
    example: bool,
}

impl From<&Event> for EventView {
    fn from(e: &Event) -> Self {
        EventView {
            id: e.id,
            account: e.account.as_str().to_string(),
            event_type: e.event_type.clone(),
            body: e.body.clone(),
            idempotency_key: e.idempotency_key.clone(),
            created_at: time(e.created_at),
            example: e.example,
        }
    }
}

/// A registered event type.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventTypeView {
    name: String,
    description: String,
    /// The JSON Schema its payloads must match, if any.
    schema: Option<Value>,
    /// An example payload, if any.
    example: Option<Value>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
}

impl From<&EventType> for EventTypeView {
    fn from(t: &EventType) -> Self {
        EventTypeView {
            name: t.name.clone(),
            description: t.description.clone(),
            schema: t.schema.clone(),
            example: t.example.clone(),
            created_at: time(t.created_at),
            updated_at: time(t.updated_at),
        }
    }
}

/// What publishing did.
#[derive(Serialize, ToSchema)]
pub(crate) struct Published {
    #[schema(value_type = uuid::Uuid)]
    pub(crate) id: EventId,
    /// The deliveries created, one per subscribed endpoint.
    #[schema(value_type = Vec<uuid::Uuid>)]
    pub(crate) deliveries: Vec<DeliveryId>,
    /// The Idempotency-Key was seen before: nothing new was created.
    pub(crate) duplicate: bool,
}

impl From<control_plane_core::Published> for Published {
    fn from(p: control_plane_core::Published) -> Self {
        Published {
            id: p.event.id,
            deliveries: p.deliveries,
            duplicate: !p.created,
        }
    }
}

/// One delivery of an event to an endpoint.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryView {
    #[schema(value_type = uuid::Uuid)]
    id: DeliveryId,
    #[schema(value_type = uuid::Uuid)]
    endpoint_id: EndpointId,
    #[schema(value_type = uuid::Uuid)]
    event_id: EventId,
    /// `pending`, `leased`, `delivered` or `dead`.
    state: String,
    attempts: u32,
    max_attempts: u32,
    #[schema(format = DateTime)]
    due_at: String,
    last_error: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
}

impl From<&Delivery> for DeliveryView {
    fn from(d: &Delivery) -> Self {
        DeliveryView {
            id: d.id,
            endpoint_id: d.endpoint_id,
            event_id: d.event_id,
            state: d.state.as_str().to_string(),
            attempts: d.attempts,
            max_attempts: d.max_attempts,
            due_at: time(d.due_at),
            last_error: d.last_error.clone(),
            created_at: time(d.created_at),
            updated_at: time(d.updated_at),
        }
    }
}

/// One attempt of a delivery.
#[derive(Serialize, ToSchema)]
pub(crate) struct AttemptView {
    attempt: u32,
    /// `delivered`, `failed` or `lease_expired`.
    result: String,
    status_code: Option<u16>,
    error: Option<String>,
    latency_ms: u64,
    /// The start of the answer's body (`CONTROLPLANE_RESPONSE_BODY_BYTES`).
    response_body: Option<String>,
    will_retry: bool,
    #[schema(format = DateTime)]
    next_attempt_at: Option<String>,
    #[schema(format = DateTime)]
    recorded_at: String,
}

impl From<&AttemptRecord> for AttemptView {
    fn from(a: &AttemptRecord) -> Self {
        AttemptView {
            attempt: a.attempt,
            result: a.result.as_str().to_string(),
            status_code: a.status_code,
            error: a.error.clone(),
            latency_ms: a.latency_ms,
            response_body: a.response_body.clone(),
            will_retry: a.will_retry,
            next_attempt_at: a.next_attempt_at.map(time),
            recorded_at: time(a.recorded_at),
        }
    }
}

/// One attempt of the attempt log, with where it belongs.
#[derive(Serialize, ToSchema)]
pub(crate) struct AttemptLogView {
    /// Its position in the log (newest first in a search).
    id: i64,
    #[schema(value_type = uuid::Uuid)]
    delivery_id: DeliveryId,
    #[schema(value_type = uuid::Uuid)]
    endpoint_id: EndpointId,
    #[serde(flatten)]
    attempt: AttemptView,
}

impl From<&AttemptRecord> for AttemptLogView {
    fn from(a: &AttemptRecord) -> Self {
        AttemptLogView {
            id: a.id,
            delivery_id: a.delivery_id,
            endpoint_id: a.endpoint_id,
            attempt: AttemptView::from(a),
        }
    }
}

/// A delivery and its attempt log, oldest attempt first.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryDetail {
    #[serde(flatten)]
    delivery: DeliveryView,
    attempt_log: Vec<AttemptView>,
}

impl DeliveryDetail {
    pub(crate) fn new(d: &Delivery, attempts: &[AttemptRecord]) -> Self {
        DeliveryDetail {
            delivery: d.into(),
            attempt_log: attempts.iter().map(AttemptView::from).collect(),
        }
    }
}

/// How many dead deliveries a bulk replay made pending again.
#[derive(Serialize, ToSchema)]
pub(crate) struct Replayed {
    pub(crate) replayed: u64,
}

/// A workflow task.
#[derive(Serialize, ToSchema)]
pub(crate) struct TaskView {
    id: String,
    kind: String,
    payload: Value,
    /// `pending`, `leased`, `completed` or `dead_lettered`.
    state: String,
    attempts: u32,
    max_attempts: u32,
    #[schema(format = DateTime)]
    run_at: String,
    last_error: Option<String>,
    result: Option<Value>,
    /// What the handler last reported while it ran (a recovery: its counts
    /// so far and its page cursor), kept after it ends; null when none.
    progress: Option<Value>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
}

impl From<&Task> for TaskView {
    fn from(t: &Task) -> Self {
        TaskView {
            id: t.id.as_str().to_string(),
            kind: t.kind.clone(),
            payload: t.payload.clone(),
            state: t.state.as_str().to_string(),
            attempts: t.attempts,
            max_attempts: t.max_attempts,
            run_at: time(t.run_at),
            last_error: t.last_error.clone(),
            result: t.result.clone(),
            progress: t.progress.clone(),
            created_at: time(t.created_at),
            updated_at: time(t.updated_at),
        }
    }
}

/// One usage counter of one hour.
#[derive(Serialize, ToSchema)]
pub(crate) struct UsageView {
    /// `events_published`, `attempts` or `bytes_sent`.
    metric: String,
    #[schema(format = DateTime)]
    window_start: String,
    amount: u64,
}

impl From<&UsageRow> for UsageView {
    fn from(r: &UsageRow) -> Self {
        UsageView {
            metric: r.metric.as_str().to_string(),
            window_start: time(r.window_start),
            amount: r.amount,
        }
    }
}

/// Usage counters of a time range.
#[derive(Serialize, ToSchema)]
pub(crate) struct UsageList {
    pub(crate) items: Vec<UsageView>,
}

/// An operational alert (circuit opened, endpoint disabled, ...).
#[derive(Serialize, ToSchema)]
pub(crate) struct AlertView {
    id: i64,
    kind: String,
    #[schema(value_type = uuid::Uuid)]
    endpoint_id: EndpointId,
    #[schema(value_type = Option<uuid::Uuid>)]
    delivery_id: Option<DeliveryId>,
    message: String,
    #[schema(format = DateTime)]
    created_at: String,
}

impl From<&Alert> for AlertView {
    fn from(a: &Alert) -> Self {
        AlertView {
            id: a.id,
            kind: a.kind.as_str().to_string(),
            endpoint_id: a.endpoint_id,
            delivery_id: a.delivery_id,
            message: a.message.clone(),
            created_at: time(a.created_at),
        }
    }
}

/// One page of a listing, newest or oldest first as the route says.
#[derive(Serialize, ToSchema)]
pub(crate) struct Listing<T: ToSchema> {
    items: Vec<T>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    next_cursor: Option<String>,
}

impl<T: ToSchema> Listing<T> {
    /// One page of `all`, which is in `key` order: the `limit` items after
    /// the key `cursor` (from the start without one), and the key of the
    /// last one as the next cursor when more follow. For the listings the
    /// store answers whole, bounded by the account's quotas.
    pub(crate) fn page<U>(
        all: &[U],
        key: impl Fn(&U) -> String,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Self
    where
        for<'a> T: From<&'a U>,
    {
        let limit = usize::try_from(limit.unwrap_or(100)).unwrap_or(usize::MAX);
        let mut rest = all
            .iter()
            .filter(|u| cursor.is_none_or(|c| key(u).as_str() > c));
        let items: Vec<&U> = rest.by_ref().take(limit).collect();
        let more = rest.next().is_some();
        Listing {
            next_cursor: items.last().filter(|_| more).map(|u| key(u)),
            items: items.into_iter().map(T::from).collect(),
        }
    }

    pub(crate) fn of<U>(p: &Page<U>) -> Self
    where
        for<'a> T: From<&'a U>,
    {
        Listing {
            items: p.items.iter().map(T::from).collect(),
            next_cursor: p.next.map(|n| n.to_string()),
        }
    }
}

/// A new account key: the only answer that shows the key.
#[derive(Serialize, ToSchema)]
pub(crate) struct KeyCreated {
    #[schema(value_type = uuid::Uuid)]
    pub(crate) id: control_plane_core::KeyId,
    pub(crate) account: String,
    /// The bearer token; stored only as its hash, never shown again.
    pub(crate) key: String,
    #[schema(format = DateTime)]
    pub(crate) created_at: String,
}

/// A live dashboard session (admin only).
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionView {
    /// The SHA-256 (hex) of the session id: names the session without being
    /// a cookie that opens it.
    pub(crate) id: String,
    /// Who signed in: `admin`, the account of the key, or `null` when that
    /// token is no longer valid (the session ends at its next use).
    pub(crate) signed_in_as: Option<String>,
    #[schema(format = DateTime)]
    pub(crate) created_at: String,
    /// When it ends unless used again (idle), never later than 12 hours
    /// after sign-in.
    #[schema(format = DateTime)]
    pub(crate) expires_at: String,
}

/// The live dashboard sessions, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionList {
    pub(crate) items: Vec<SessionView>,
}

/// An erasure begun: what was shut at once, and the task that removes the rest.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErasureStarted {
    /// Account keys revoked.
    pub(crate) keys_revoked: u64,
    /// Dashboard sessions signed in with those keys, ended.
    pub(crate) sessions_ended: u64,
    /// Endpoints disabled: nothing more is sent.
    pub(crate) endpoints_disabled: u64,
    /// The erasure task (kind `control-plane.erase`): its `progress` and
    /// `result` say how many rows are gone and whether it is done.
    pub(crate) task: TaskView,
}
