//! Events, deliveries, leases and outcomes.

use crate::{
    validate_limit, AccountId, DeliveryId, EndpointId, EventId, LeaseToken, PageRequest, Secret,
    SigningSecrets, StoreError, Timestamp, TraceParent,
};

/// A published event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Identifier.
    pub id: EventId,
    /// Owning account.
    pub account: AccountId,
    /// Event type, e.g. `invoice.paid`.
    pub event_type: String,
    /// The exact body every attempt sends: `{"type","timestamp","data"}`.
    pub body: String,
    /// The idempotency key it was published with.
    pub idempotency_key: Option<String>,
    /// The W3C trace context it was published in, sent on every delivery.
    pub traceparent: Option<TraceParent>,
    /// Publication time.
    pub created_at: Timestamp,
    /// An example sent to one endpoint ("send example"): it never goes to
    /// any other endpoint, a recovery included.
    pub example: bool,
}

/// Publishes one event.
#[derive(Clone, Debug)]
pub struct PublishRequest {
    /// Owning account.
    pub account: AccountId,
    /// Event type, 1 to 255 characters.
    pub event_type: String,
    /// The payload, sent as `data`.
    pub payload: serde_json::Value,
    /// With a key, publishing again returns the first event and creates nothing.
    pub idempotency_key: Option<String>,
    /// The trace context of the publish, stored with the event and sent as
    /// the `traceparent` header of its deliveries.
    pub traceparent: Option<TraceParent>,
}

impl PublishRequest {
    /// An event with no idempotency key.
    pub fn new(
        account: AccountId,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        PublishRequest {
            account,
            event_type: event_type.into(),
            payload,
            idempotency_key: None,
            traceparent: None,
        }
    }

    /// The exact webhook body for this event published at `at`.
    pub fn body(&self, at: Timestamp) -> String {
        serde_json::json!({
            "type": self.event_type,
            "timestamp": at.to_rfc3339(),
            "data": self.payload,
        })
        .to_string()
    }

    /// `InvalidInput` unless `first`, the event this request's idempotency
    /// key already names, was published with this request's type and
    /// payload. A key is bound to its request (as in the IETF
    /// Idempotency-Key draft): the same request again answers with the first
    /// event; another request under the same key is refused, and the
    /// publish (its whole batch) stores nothing.
    pub fn check_repeat_of(&self, first: &Event) -> Result<(), StoreError> {
        let data = serde_json::from_str::<serde_json::Value>(&first.body)
            .ok()
            .and_then(|mut body| body.get_mut("data").map(serde_json::Value::take));
        if first.event_type == self.event_type && data.as_ref() == Some(&self.payload) {
            return Ok(());
        }
        Err(StoreError::InvalidInput(format!(
            "the Idempotency-Key {:?} was already used for another request (event {}, type {:?}); \
             send the same type and payload to get that event back, or use a new key",
            self.idempotency_key.as_deref().unwrap_or_default(),
            first.id,
            first.event_type
        )))
    }

    /// The new event this request stores when published at `at` (a fresh id
    /// and the webhook body of [`PublishRequest::body`]).
    pub fn event_at(&self, at: Timestamp) -> Event {
        Event {
            id: EventId::new(),
            account: self.account.clone(),
            event_type: self.event_type.clone(),
            body: self.body(at),
            idempotency_key: self.idempotency_key.clone(),
            traceparent: self.traceparent.clone(),
            created_at: at,
            example: false,
        }
    }
}

impl crate::Check for PublishRequest {
    /// Validates the event type (see [`crate::validate_type_name`]:
    /// the types of operational events are the store's own, and `*` is for
    /// subscriptions) and the key (see [`crate::validate_idempotency_key`]).
    fn check(&self) -> Result<(), StoreError> {
        crate::validate_type_name(&self.event_type)?;
        if let Some(k) = &self.idempotency_key {
            crate::validate_idempotency_key(k)?;
        }
        Ok(())
    }
}

/// What a publish did.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The event (the first one, for a repeated idempotency key).
    pub event: Event,
    /// The deliveries of the event, ordered by endpoint id.
    pub deliveries: Vec<DeliveryId>,
    /// False when an earlier publish with the same key was returned.
    pub created: bool,
}

named_enum! {
    /// The lifecycle state of a delivery.
    ///
    /// `pending` → `leased` (claim) → `delivered` | `pending` (retry, release,
    /// lease expiry) | `dead` (attempts exhausted, give up, endpoint removed).
    /// `dead` → `pending` by replay. The claimer moves `pending` to `leased`; the
    /// lease holder moves `leased` on; the next claim sweeps expired leases.
    pub enum DeliveryState ("delivery state") {
        /// Waiting until `due_at`.
        Pending = "pending",
        /// Held by a live lease.
        Leased = "leased",
        /// Accepted by the receiver. Final.
        Delivered = "delivered",
        /// Given up; kept, listable and replayable.
        Dead = "dead",
    }
}

impl DeliveryState {
    /// Whether nothing more happens to the delivery without a replay.
    pub fn is_final(self) -> bool {
        matches!(self, DeliveryState::Delivered | DeliveryState::Dead)
    }
}

/// Which finished deliveries go back to the queue: a replay takes a dead
/// one, a resend any finished one (delivered or dead). Either way the
/// delivery keeps its id (the `webhook-id`), sequence number and attempt log,
/// and gets a fresh attempt budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// [`crate::DeliveryStore::delivery_replay`]: dead ones.
    Replay,
    /// [`crate::DeliveryStore::delivery_resend`]: delivered or dead ones.
    Resend,
}

impl Requeue {
    /// The states it takes back.
    pub fn states(self) -> &'static [DeliveryState] {
        match self {
            Requeue::Replay => &[DeliveryState::Dead],
            Requeue::Resend => &[DeliveryState::Dead, DeliveryState::Delivered],
        }
    }

    /// The `Conflict` for a delivery it does not take back: one in `state`
    /// (`None`: one whose endpoint was removed).
    pub fn refused(self, id: DeliveryId, state: Option<DeliveryState>) -> StoreError {
        let (verb, which) = match self {
            Requeue::Replay => ("replayed", "only dead deliveries"),
            Requeue::Resend => ("resent", "only delivered or dead deliveries"),
        };
        StoreError::Conflict(match state {
            Some(s) => format!("delivery {id} is {}; {which} can be {verb}", s.as_str()),
            None => format!("delivery {id} cannot be {verb}: its endpoint was removed"),
        })
    }
}

/// One event to one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Identifier and `webhook-id`.
    pub id: DeliveryId,
    /// Owning account.
    pub account: AccountId,
    /// Destination.
    pub endpoint_id: EndpointId,
    /// The event delivered.
    pub event_id: EventId,
    /// Sequence number, strictly increasing per endpoint.
    pub seq: i64,
    /// State.
    pub state: DeliveryState,
    /// Attempts started so far (incremented at claim).
    pub attempts: u32,
    /// Attempts allowed before the delivery is dead.
    pub max_attempts: u32,
    /// When it is next due.
    pub due_at: Timestamp,
    /// When the current lease expires, while leased.
    pub lease_expires_at: Option<Timestamp>,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

/// Proof of a claim: the token fences every later write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The leased delivery.
    pub delivery_id: DeliveryId,
    /// The fencing token. The deliveries of one claim may share it (the
    /// embedded store leases a claim's batch with one token): a write is
    /// fenced by the delivery and the token together.
    pub token: LeaseToken,
    /// The attempt this lease runs.
    pub attempt: u32,
    /// When the lease expires unless extended.
    pub expires_at: Timestamp,
}

/// A claimed delivery with everything needed to send it.
#[derive(Clone, Debug)]
pub struct ClaimedDelivery {
    /// The lease to record the outcome with.
    pub lease: Lease,
    /// The delivery (state `leased`).
    pub delivery: Delivery,
    /// The event type.
    pub event_type: String,
    /// The exact body to send.
    pub body: String,
    /// Destination URL.
    pub url: String,
    /// Signing secrets.
    pub secrets: SigningSecrets,
    /// The endpoint's custom headers (the JSON object of
    /// [`crate::custom_headers_text`]), opened like `secrets`.
    pub headers: Option<Secret>,
    /// The endpoint's OAuth2 client credentials (the JSON text of
    /// [`crate::ClientCredentials`]), opened like `secrets`.
    pub oauth2: Option<Secret>,
    /// The endpoint's client certificate and key (the JSON text of
    /// [`crate::ClientTls`]), opened like `secrets`.
    pub client_tls: Option<Secret>,
    /// The endpoint's own retry schedule, when it has one (the dispatcher
    /// uses the service's otherwise).
    pub retry: Option<crate::backoff::EndpointRetry>,
    /// The endpoint's jq program, applied to `body` before it is signed
    /// (ADR 0050).
    pub transform: Option<crate::Transform>,
    /// True when this attempt is the half-open circuit's single probe.
    pub probe: bool,
    /// The event's trace context (see [`crate::TraceParent`]).
    pub traceparent: Option<TraceParent>,
}

/// Asks for due deliveries. Built checked ([`ClaimRequest::new`]), so a
/// store never sees a limit outside 1 to 1000, a zero lease or an oversized
/// throttle.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    worker: String,
    limit: u32,
    lease_for: std::time::Duration,
    throttle: crate::flow::Throttle,
}

impl ClaimRequest {
    /// Up to `limit` deliveries for `worker`, leased for `lease_for`, with
    /// no endpoint throttled.
    ///
    /// # Errors
    /// `InvalidInput` for a limit outside 1 to 1000 or a zero lease.
    pub fn new(
        worker: impl Into<String>,
        limit: u32,
        lease_for: std::time::Duration,
    ) -> Result<Self, StoreError> {
        validate_limit(limit)?;
        validate_lease(lease_for)?;
        Ok(ClaimRequest {
            worker: worker.into(),
            limit,
            lease_for,
            throttle: crate::flow::Throttle::default(),
        })
    }

    /// The same claim under the claimer's `throttle`: its lowered caps for
    /// endpoints it found slow or failing, and how many of them this claim
    /// may hand out in all (ADR 0019).
    ///
    /// # Errors
    /// `InvalidInput` for a throttle listing more than
    /// [`crate::flow::MAX_THROTTLED`] endpoints.
    pub fn throttled(self, throttle: crate::flow::Throttle) -> Result<Self, StoreError> {
        throttle.validate()?;
        Ok(ClaimRequest { throttle, ..self })
    }

    /// Who claims (for operators; ownership is the token).
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// At most this many deliveries.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// How long each lease runs.
    pub fn lease_for(&self) -> std::time::Duration {
        self.lease_for
    }

    /// The claimer's throttle.
    pub fn throttle(&self) -> &crate::flow::Throttle {
        &self.throttle
    }
}

/// Checks a lease length: longer than zero.
pub fn validate_lease(lease_for: std::time::Duration) -> Result<(), StoreError> {
    if lease_for.is_zero() {
        return Err(StoreError::InvalidInput(
            "lease_for must be longer than zero".into(),
        ));
    }
    Ok(())
}

/// What one attempt observed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AttemptReport {
    /// HTTP status, when a response arrived.
    pub status_code: Option<u16>,
    /// Error text, when the attempt failed.
    pub error: Option<String>,
    /// Time from send to response or failure.
    pub latency_ms: u64,
    /// The first bytes of the answer's body (as text, invalid UTF-8
    /// replaced), up to the dispatcher's `CONTROLPLANE_RESPONSE_BODY_BYTES`;
    /// `None` when it kept none.
    pub response_body: Option<String>,
}

/// The result of an attempt, one variant per legal transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The receiver accepted it: `delivered`.
    Delivered(AttemptReport),
    /// A retryable failure: `pending` due at `at`, or `dead` when attempts are exhausted.
    Retry {
        /// When to try again.
        at: Timestamp,
        /// What the attempt observed.
        report: AttemptReport,
    },
    /// A failure not worth retrying: `dead`.
    GiveUp(AttemptReport),
    /// `410 Gone`: the endpoint is disabled and the delivery is held (`pending`)
    /// until it is enabled again, or `dead` when attempts are exhausted.
    Gone(AttemptReport),
}

impl DeliveryOutcome {
    /// The attempt's report.
    pub fn report(&self) -> &AttemptReport {
        match self {
            DeliveryOutcome::Delivered(r)
            | DeliveryOutcome::GiveUp(r)
            | DeliveryOutcome::Gone(r)
            | DeliveryOutcome::Retry { report: r, .. } => r,
        }
    }

    /// A short stable name, stored to recognise a repeated outcome.
    pub fn kind(&self) -> &'static str {
        match self {
            DeliveryOutcome::Delivered(_) => "delivered",
            DeliveryOutcome::Retry { .. } => "retry",
            DeliveryOutcome::GiveUp(_) => "give_up",
            DeliveryOutcome::Gone(_) => "gone",
        }
    }

    /// Whether the attempt succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, DeliveryOutcome::Delivered(_))
    }
}

/// What recording an outcome did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutcomeRecorded {
    /// The delivery's state afterwards.
    pub state: DeliveryState,
    /// True when this exact outcome had already been recorded; nothing changed.
    pub duplicate: bool,
}

/// Filters a delivery listing (newest first, by sequence).
#[derive(Clone, Debug)]
pub struct DeliveryListRequest {
    /// The account.
    pub account: AccountId,
    /// Only this state.
    pub state: Option<DeliveryState>,
    /// Only this endpoint.
    pub endpoint_id: Option<EndpointId>,
    /// Only this event.
    pub event_id: Option<EventId>,
    /// Only deliveries of events of this type.
    pub event_type: Option<String>,
    /// Only deliveries created at or after this time.
    pub since: Option<Timestamp>,
    /// Only deliveries created before this time.
    pub until: Option<Timestamp>,
    /// The page.
    pub page: PageRequest,
}

impl DeliveryListRequest {
    /// Every delivery of `account`, one page.
    pub fn all(account: AccountId, page: PageRequest) -> Self {
        DeliveryListRequest {
            account,
            state: None,
            endpoint_id: None,
            event_id: None,
            event_type: None,
            since: None,
            until: None,
            page,
        }
    }

    /// Whether the request filters by event type or creation time, which
    /// only the general listing of the adapters reads (the fast paths by
    /// state do not carry those columns).
    pub fn by_type_or_time(&self) -> bool {
        self.event_type.is_some() || self.since.is_some() || self.until.is_some()
    }
}

/// Filters an event listing (newest first).
#[derive(Clone, Debug)]
pub struct EventListRequest {
    /// The account.
    pub account: AccountId,
    /// Only this type.
    pub event_type: Option<String>,
    /// Only events published at or after this time.
    pub since: Option<Timestamp>,
    /// Only events published before this time.
    pub until: Option<Timestamp>,
    /// The page; its cursor is a publication time in milliseconds.
    pub page: PageRequest,
}

/// Where a newest-first page keyed by time ends.
#[derive(Debug, PartialEq, Eq)]
pub enum TimeCut<T> {
    /// Every row fitted: the last page.
    Last(Vec<T>),
    /// More may follow. `newer` holds the rows after `boundary`; the page
    /// is those plus every row at `boundary` (fetched whole, so that rows of
    /// one millisecond never straddle two pages), and the next page, when
    /// an older row exists, starts before `boundary`.
    More {
        /// The rows strictly after the boundary.
        newer: Vec<T>,
        /// The time of the page's last row, in milliseconds.
        boundary: i64,
    },
}

/// Cuts `rows` (newest first, at most `limit + 1` of them) into a page.
pub fn cut_by_time<T>(mut rows: Vec<T>, limit: u32, at: impl Fn(&T) -> i64) -> TimeCut<T> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() <= limit {
        return TimeCut::Last(rows);
    }
    let Some(boundary) = rows.get(limit.saturating_sub(1)).map(&at) else {
        return TimeCut::Last(rows);
    };
    rows.retain(|r| at(r) > boundary);
    TimeCut::More {
        newer: rows,
        boundary,
    }
}

/// Which dead deliveries of an account a bulk replay revives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayFilter {
    /// The account.
    pub account: AccountId,
    /// Only this endpoint's.
    pub endpoint_id: Option<EndpointId>,
    /// Only those that died at or after this time.
    pub dead_since: Option<Timestamp>,
    /// Only those that died before this time.
    pub dead_until: Option<Timestamp>,
}

impl ReplayFilter {
    /// Every dead delivery of `account`.
    pub fn all(account: AccountId) -> Self {
        ReplayFilter {
            account,
            endpoint_id: None,
            dead_since: None,
            dead_until: None,
        }
    }
}

/// Result of an insert-wins enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The delivery of `(endpoint, event)`.
    pub delivery_id: DeliveryId,
    /// True only for the caller whose insert created it.
    pub won: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlertKind, CircuitMode};

    #[test]
    fn named_values_round_trip_through_their_names_and_serde() {
        for s in DeliveryState::ALL {
            assert_eq!(s.as_str().parse::<DeliveryState>().unwrap(), *s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for k in AlertKind::ALL {
            assert_eq!(AlertKind::from_event_type(k.as_str()), Some(*k));
        }
        assert_eq!(
            serde_json::to_value(CircuitMode::HalfOpen).unwrap(),
            "half_open"
        );
        let err = "sent".parse::<DeliveryState>().unwrap_err();
        assert_eq!(
            err,
            StoreError::InvalidInput(
                "delivery state must be one of pending, leased, delivered, dead, got \"sent\""
                    .into()
            )
        );
        assert_eq!(AlertKind::from_event_type("invoice.paid"), None);
    }

    #[test]
    fn body_is_type_timestamp_data() {
        let r = PublishRequest {
            account: AccountId::new("a").unwrap(),
            event_type: "invoice.paid".into(),
            payload: serde_json::json!({"n": 1}),
            idempotency_key: None,
            traceparent: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&r.body(Timestamp::from_millis(0))).unwrap();
        assert_eq!(v["type"], "invoice.paid");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["data"]["n"], 1);
    }
}
