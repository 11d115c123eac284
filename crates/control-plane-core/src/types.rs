//! Domain types shared by the port, the adapters and the dispatcher.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Timestamp;
use crate::error::StoreError;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random identifier.
            pub fn new() -> Self {
                $name(Uuid::new_v4())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = StoreError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map($name).map_err(|_| {
                    StoreError::InvalidInput(format!(
                        "{} must be a UUID, got {s:?}",
                        stringify!($name)
                    ))
                })
            }
        }
    };
}

uuid_id!(
    /// Identifies an endpoint.
    EndpointId
);
uuid_id!(
    /// Identifies an event.
    EventId
);
uuid_id!(
    /// Identifies a delivery; it is also the `webhook-id`, stable across retries.
    DeliveryId
);
uuid_id!(
    /// A lease token, fresh at every claim. Every write after a claim is fenced by it.
    LeaseToken
);
uuid_id!(
    /// Identifies an account API key.
    KeyId
);

/// An account (tenant) name: 1 to 64 characters of `A-Z a-z 0-9 _ -`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AccountId(String);

impl AccountId {
    /// Validates `s` as an account name.
    pub fn new(s: impl Into<String>) -> Result<Self, StoreError> {
        let s = s.into();
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(AccountId(s))
        } else {
            Err(StoreError::InvalidInput(format!(
                "account must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got {s:?}"
            )))
        }
    }

    /// A name written in this crate's code, known to be valid.
    pub(crate) fn known(s: &'static str) -> Self {
        AccountId(s.to_string())
    }

    /// The account name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for AccountId {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        AccountId::new(s)
    }
}

impl From<AccountId> for String {
    fn from(a: AccountId) -> String {
        a.0
    }
}

/// A secret value (signing secret, password). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The secrets an endpoint's requests are signed with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningSecrets {
    /// The secret every request is signed with.
    pub current: Secret,
    /// During a rotation, the previous secret, which also signs until `previous_expires_at`.
    pub previous: Option<Secret>,
    /// When the previous secret stops signing.
    pub previous_expires_at: Option<Timestamp>,
}

impl SigningSecrets {
    /// The secrets that sign a request sent at `now`: the current one, and the
    /// previous one while its grace period lasts.
    pub fn signing_at(&self, now: Timestamp) -> Vec<&Secret> {
        let mut v = vec![&self.current];
        if let (Some(p), Some(until)) = (&self.previous, self.previous_expires_at) {
            if now < until {
                v.push(p);
            }
        }
        v
    }
}

/// A webhook destination owned by one account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Identifier.
    pub id: EndpointId,
    /// Owning account.
    pub account: AccountId,
    /// Destination URL.
    pub url: String,
    /// Signing secrets.
    pub secrets: SigningSecrets,
    /// Event types this endpoint receives; empty means every type.
    pub event_types: Vec<String>,
    /// Whether deliveries are claimed. A disabled endpoint's deliveries are held.
    pub enabled: bool,
    /// Why the endpoint was disabled, when it is.
    pub disabled_reason: Option<String>,
    /// Requests per second the dispatcher may send, if limited; enforced by
    /// the store at claim across every replica (bursts of up to one second).
    pub rate_limit_per_s: Option<u32>,
    /// Deliveries in flight at once across every replica; `None` means the
    /// service default (`StoreOptions::endpoint_concurrency`).
    pub max_in_flight: Option<u32>,
    /// Ordered mode: one delivery in flight, lowest sequence first.
    pub ordered: bool,
    /// Free text for operators.
    pub description: Option<String>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

impl Endpoint {
    /// Whether an event of `event_type` is delivered to this endpoint.
    pub fn accepts(&self, event_type: &str) -> bool {
        self.event_types.is_empty() || self.event_types.iter().any(|t| t == event_type || t == "*")
    }
}

/// Where an event of `event_type` fans out: the ids, in order, of the live
/// endpoints that accept it. An operational event (an [`crate::AlertKind`]
/// name) goes only to endpoints that name its type explicitly, and never to
/// the endpoint it is `about`, so a failing endpoint is not told about itself
/// and catch-all endpoints receive only the events their owners publish.
pub fn fan_out(
    endpoints: &[Endpoint],
    event_type: &str,
    about: Option<EndpointId>,
) -> Vec<EndpointId> {
    let operational = crate::ops::AlertKind::from_event_type(event_type).is_some();
    let mut ids: Vec<EndpointId> = endpoints
        .iter()
        .filter(|e| Some(e.id) != about)
        .filter(|e| {
            if operational {
                e.event_types.iter().any(|t| t == event_type)
            } else {
                e.accepts(event_type)
            }
        })
        .map(|e| e.id)
        .collect();
    ids.sort();
    ids
}

/// What [`crate::EndpointStore::endpoint_set_enabled`] makes of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enablement {
    /// Its held deliveries are claimed again.
    Enabled,
    /// Its deliveries are held (not dropped); `reason` is shown to operators.
    Disabled {
        /// Why, for operators.
        reason: Option<String>,
    },
}

impl Enablement {
    /// `(enabled, disabled_reason)`, as the endpoint's row keeps them.
    pub fn into_row(self) -> (bool, Option<String>) {
        match self {
            Enablement::Enabled => (true, None),
            Enablement::Disabled { reason } => (false, reason),
        }
    }
}

/// Creates an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointCreateRequest {
    /// Owning account.
    pub account: AccountId,
    /// Destination URL (`http` or `https`).
    pub url: String,
    /// Signing secret, `whsec_` + base64.
    pub secret: Secret,
    /// Event types received; empty means every type.
    pub event_types: Vec<String>,
    /// Ordered mode.
    pub ordered: bool,
    /// Optional rate limit, requests per second (1 to 100,000).
    pub rate_limit_per_s: Option<u32>,
    /// Optional in-flight cap (1 to 10,000); unset means the service default.
    pub max_in_flight: Option<u32>,
    /// Optional description.
    pub description: Option<String>,
}

impl EndpointCreateRequest {
    /// A request with defaults: every event type, unordered, no limit.
    pub fn new(account: AccountId, url: impl Into<String>, secret: Secret) -> Self {
        EndpointCreateRequest {
            account,
            url: url.into(),
            secret,
            event_types: Vec::new(),
            ordered: false,
            rate_limit_per_s: None,
            max_in_flight: None,
            description: None,
        }
    }

    /// Checks what every adapter must check before storing the endpoint.
    ///
    /// # Errors
    /// `InvalidInput` for a bad URL or a limit out of range.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_endpoint_url(&self.url)?;
        validate_flow_limits(self.rate_limit_per_s, self.max_in_flight)
    }
}

/// Changes to an endpoint; `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct EndpointUpdateRequest {
    /// New URL.
    pub url: Option<String>,
    /// New event-type filter.
    pub event_types: Option<Vec<String>>,
    /// New ordered mode.
    pub ordered: Option<bool>,
    /// New rate limit (`Some(None)` removes it).
    pub rate_limit_per_s: Option<Option<u32>>,
    /// New in-flight cap (`Some(None)` returns to the service default).
    pub max_in_flight: Option<Option<u32>>,
    /// New description (`Some(None)` removes it).
    pub description: Option<Option<String>>,
}

impl EndpointUpdateRequest {
    /// Applies the given fields to `e`, validating a new URL.
    ///
    /// # Errors
    /// `InvalidInput` for a URL that is not absolute `http(s)`; `e` is then unchanged.
    pub fn apply_to(self, e: &mut Endpoint) -> Result<(), StoreError> {
        if let Some(url) = &self.url {
            validate_endpoint_url(url)?;
        }
        validate_flow_limits(
            self.rate_limit_per_s.flatten(),
            self.max_in_flight.flatten(),
        )?;
        if let Some(url) = self.url {
            e.url = url;
        }
        if let Some(types) = self.event_types {
            e.event_types = types;
        }
        if let Some(o) = self.ordered {
            e.ordered = o;
        }
        if let Some(r) = self.rate_limit_per_s {
            e.rate_limit_per_s = r;
        }
        if let Some(m) = self.max_in_flight {
            e.max_in_flight = m;
        }
        if let Some(d) = self.description {
            e.description = d;
        }
        Ok(())
    }
}

/// Checks an endpoint's rate limit and in-flight cap.
///
/// # Errors
/// `InvalidInput` naming the field when one is zero or too large.
pub fn validate_flow_limits(
    rate_limit_per_s: Option<u32>,
    max_in_flight: Option<u32>,
) -> Result<(), StoreError> {
    use crate::flow::{MAX_IN_FLIGHT_LIMIT, MAX_RATE_LIMIT_PER_S};
    if let Some(r) = rate_limit_per_s {
        if r == 0 || r > MAX_RATE_LIMIT_PER_S {
            return Err(StoreError::InvalidInput(format!(
                "rate_limit_per_s must be from 1 to {MAX_RATE_LIMIT_PER_S} requests per second (omit it for no limit; disable the endpoint to stop sending), got {r}"
            )));
        }
    }
    if let Some(m) = max_in_flight {
        if m == 0 || m > MAX_IN_FLIGHT_LIMIT {
            return Err(StoreError::InvalidInput(format!(
                "max_in_flight must be from 1 to {MAX_IN_FLIGHT_LIMIT} (omit it for the service default), got {m}"
            )));
        }
    }
    Ok(())
}

/// Checks a URL the way every adapter must before storing it.
pub fn validate_endpoint_url(url: &str) -> Result<(), StoreError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') && url.len() <= 2048 && !url.chars().any(char::is_whitespace) => Ok(()),
        _ => Err(StoreError::InvalidInput(format!(
            "endpoint url must be an absolute http:// or https:// URL of at most 2048 characters without spaces, got {url:?}"
        ))),
    }
}

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
    /// Publication time.
    pub created_at: Timestamp,
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
}

impl PublishRequest {
    /// Validates the event type and key.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.event_type.is_empty() || self.event_type.len() > 255 {
            return Err(StoreError::InvalidInput(format!(
                "event type must be 1 to 255 characters, got {} characters",
                self.event_type.len()
            )));
        }
        if let Some(k) = &self.idempotency_key {
            if k.is_empty() || k.len() > 255 {
                return Err(StoreError::InvalidInput(
                    "idempotency key must be 1 to 255 characters".into(),
                ));
            }
        }
        Ok(())
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

/// The lifecycle state of a delivery.
///
/// `pending` → `leased` (claim) → `delivered` | `pending` (retry, release,
/// lease expiry) | `dead` (attempts exhausted, give up, endpoint removed).
/// `dead` → `pending` by replay. The claimer moves `pending` to `leased`; the
/// lease holder moves `leased` on; the next claim sweeps expired leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting until `due_at`.
    Pending,
    /// Held by a live lease.
    Leased,
    /// Accepted by the receiver. Final.
    Delivered,
    /// Given up; kept, listable and replayable.
    Dead,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Leased => "leased",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    /// Whether nothing more happens to the delivery without a replay.
    pub fn is_final(self) -> bool {
        matches!(self, DeliveryState::Delivered | DeliveryState::Dead)
    }
}

impl FromStr for DeliveryState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(DeliveryState::Pending),
            "leased" => Ok(DeliveryState::Leased),
            "delivered" => Ok(DeliveryState::Delivered),
            "dead" => Ok(DeliveryState::Dead),
            _ => Err(StoreError::InvalidInput(format!(
                "delivery state must be pending, leased, delivered or dead, got {s:?}"
            ))),
        }
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
    /// The fencing token.
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
    /// True when this attempt is the half-open circuit's single probe.
    pub probe: bool,
}

/// Asks for due deliveries.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// Who claims (for operators; ownership is the token).
    pub worker: String,
    /// At most this many deliveries (1 to 1000).
    pub limit: u32,
    /// Lease length.
    pub lease_for: std::time::Duration,
}

impl ClaimRequest {
    /// `InvalidInput` for a limit outside 1 to 1000 or a zero lease.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_limit(self.limit)?;
        validate_lease(self.lease_for)
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

/// Why an attempt ended, in the attempt log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptResult {
    /// Accepted by the receiver.
    Delivered,
    /// Failed (any status or error).
    Failed,
    /// The worker's lease expired before it reported.
    LeaseExpired,
}

impl AttemptResult {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Delivered => "delivered",
            AttemptResult::Failed => "failed",
            AttemptResult::LeaseExpired => "lease_expired",
        }
    }
}

impl FromStr for AttemptResult {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "delivered" => Ok(AttemptResult::Delivered),
            "failed" => Ok(AttemptResult::Failed),
            "lease_expired" => Ok(AttemptResult::LeaseExpired),
            _ => Err(StoreError::Backend(format!("unknown attempt result {s:?}"))),
        }
    }
}

/// One row of the append-only attempt log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// Log position, strictly increasing in append order.
    pub id: i64,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// Owning account.
    pub account: AccountId,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// How it ended.
    pub result: AttemptResult,
    /// HTTP status, if any.
    pub status_code: Option<u16>,
    /// Error text, if any.
    pub error: Option<String>,
    /// Latency.
    pub latency_ms: u64,
    /// Whether another attempt follows.
    pub will_retry: bool,
    /// When the next attempt is due, if one follows.
    pub next_attempt_at: Option<Timestamp>,
    /// When it was recorded.
    pub recorded_at: Timestamp,
}

/// Keyset pagination: at most `limit` items after `after` (exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    /// 1 to 1000.
    pub limit: u32,
    /// The `next` of the previous page.
    pub after: Option<i64>,
}

impl PageRequest {
    /// The first page of `limit` items.
    pub fn first(limit: u32) -> Self {
        PageRequest { limit, after: None }
    }

    /// Validates the limit.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_limit(self.limit)
    }
}

/// Checks a page or claim limit.
pub fn validate_limit(limit: u32) -> Result<(), StoreError> {
    if (1..=1000).contains(&limit) {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "limit must be between 1 and 1000, got {limit}"
        )))
    }
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next: Option<i64>,
}

impl<T> Page<T> {
    /// A page from up to `limit + 1` rows read in listing order: an extra
    /// row only says that another page follows, and `next` is then the key of
    /// the last row kept.
    pub fn from_overfetch(mut items: Vec<T>, limit: u32, key: impl Fn(&T) -> i64) -> Self {
        let next = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(key)
        } else {
            None
        };
        Page { items, next }
    }

    /// The same page with every item mapped.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next: self.next,
        }
    }
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
    /// The page.
    pub page: PageRequest,
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

    #[test]
    fn account_names_are_validated() {
        assert!(AccountId::new("acme_1-x").is_ok());
        assert!(AccountId::new("").is_err());
        assert!(AccountId::new("a b").is_err());
        assert!(AccountId::new("x".repeat(65)).is_err());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let s = Secret::new("whsec_c2VjcmV0");
        assert!(!format!("{s:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn urls_must_be_absolute_http() {
        assert!(validate_endpoint_url("https://example.com/hook").is_ok());
        assert!(validate_endpoint_url("http://127.0.0.1:9000").is_ok());
        assert!(validate_endpoint_url("ftp://x").is_err());
        assert!(validate_endpoint_url("https://").is_err());
        assert!(validate_endpoint_url("https://a b").is_err());
    }

    #[test]
    fn previous_secret_signs_only_during_grace() {
        let s = SigningSecrets {
            current: Secret::new("a"),
            previous: Some(Secret::new("b")),
            previous_expires_at: Some(Timestamp::from_millis(100)),
        };
        assert_eq!(s.signing_at(Timestamp::from_millis(99)).len(), 2);
        assert_eq!(s.signing_at(Timestamp::from_millis(100)).len(), 1);
    }

    #[test]
    fn body_is_type_timestamp_data() {
        let r = PublishRequest {
            account: AccountId::new("a").unwrap(),
            event_type: "invoice.paid".into(),
            payload: serde_json::json!({"n": 1}),
            idempotency_key: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&r.body(Timestamp::from_millis(0))).unwrap();
        assert_eq!(v["type"], "invoice.paid");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["data"]["n"], 1);
    }
}
