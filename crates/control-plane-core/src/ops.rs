//! Types of request idempotency, ticks, usage, alerts and maintenance.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::types::{AccountId, DeliveryId, EndpointId, KeyId, LeaseToken, PublishRequest};

/// Checks a scope, key, tick name or batch id: 1 to 255 bytes.
///
/// # Errors
/// `InvalidInput` naming `what`.
pub fn validate_short_text(what: &str, v: &str) -> Result<(), StoreError> {
    if v.is_empty() || v.len() > 255 {
        return Err(StoreError::InvalidInput(format!(
            "{what} must be 1 to 255 characters, got {} characters",
            v.len()
        )));
    }
    Ok(())
}

/// The answer of a write fenced by a token: one row changed, or the token
/// no longer owns it.
///
/// # Errors
/// `LeaseLost` when `rows` is not 1.
pub fn fenced(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// A response stored for replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: String,
}

/// What `idempotency_begin` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// This caller owns the key now; finish with `complete` or `abandon`.
    Started(IdempotencyToken),
    /// Another request with this key is running.
    InProgress,
    /// The same request already completed; here is its response.
    Replay(StoredResponse),
    /// The key was used for a different request.
    Mismatch,
}

/// A live idempotency record as an adapter reads it back: enough to decide
/// what a second request with the same key gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// The hash of the request that took the key.
    pub request_hash: String,
    /// `in_progress` or `completed`.
    pub state: String,
    /// The stored status, once completed.
    pub status: Option<i64>,
    /// The stored body, once completed.
    pub body: Option<String>,
}

impl IdempotencyRecord {
    /// What a request hashing to `request_hash` gets while this record
    /// lives: `Mismatch` for another request, `Replay` of the stored response
    /// once completed, `InProgress` before.
    pub fn verdict(self, request_hash: &str) -> IdempotencyBegin {
        if self.request_hash != request_hash {
            IdempotencyBegin::Mismatch
        } else if self.state == "completed" {
            IdempotencyBegin::Replay(StoredResponse {
                status: self
                    .status
                    .and_then(|s| u16::try_from(s).ok())
                    .unwrap_or(200),
                body: self.body.unwrap_or_default(),
            })
        } else {
            IdempotencyBegin::InProgress
        }
    }
}

/// Ownership of an idempotency key while its request runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyToken {
    /// Scope (e.g. account and route).
    pub scope: String,
    /// The key.
    pub key: String,
    /// Fencing token.
    pub token: LeaseToken,
}

/// Single-flight ownership of a tick.
#[derive(Clone, Debug, PartialEq)]
pub struct TickLease {
    /// Tick name.
    pub name: String,
    /// Fencing token.
    pub token: LeaseToken,
    /// State stored by the last completion.
    pub state: Option<serde_json::Value>,
    /// Expiry of this claim.
    pub expires_at: Timestamp,
}

/// A usage metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageMetric {
    /// Events published.
    EventsPublished,
    /// Delivery attempts made.
    Attempts,
    /// Request bytes sent.
    BytesSent,
}

impl UsageMetric {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageMetric::EventsPublished => "events_published",
            UsageMetric::Attempts => "attempts",
            UsageMetric::BytesSent => "bytes_sent",
        }
    }
}

impl FromStr for UsageMetric {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "events_published" => Ok(UsageMetric::EventsPublished),
            "attempts" => Ok(UsageMetric::Attempts),
            "bytes_sent" => Ok(UsageMetric::BytesSent),
            _ => Err(StoreError::InvalidInput(format!(
                "usage metric must be events_published, attempts or bytes_sent, got {s:?}"
            ))),
        }
    }
}

/// Usage is counted in windows of this length (one hour).
pub const USAGE_WINDOW: Duration = Duration::from_secs(3600);

/// The start of the usage window holding `t`.
pub fn usage_window(t: Timestamp) -> Timestamp {
    let w = USAGE_WINDOW.as_millis() as i64;
    Timestamp::from_millis(t.as_millis().div_euclid(w) * w)
}

/// One counter increment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageEntry {
    /// Account.
    pub account: AccountId,
    /// Metric.
    pub metric: UsageMetric,
    /// When it happened.
    pub at: Timestamp,
    /// How much.
    pub amount: u64,
}

/// A batch of increments, recorded once whatever the number of retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageBatch {
    /// Idempotency id, 1 to 255 characters.
    pub batch_id: String,
    /// The increments.
    pub entries: Vec<UsageEntry>,
}

impl UsageBatch {
    /// The batch summed per (account, metric, window start), so that
    /// recording it writes each counter row once.
    pub fn totals(&self) -> Vec<(AccountId, UsageMetric, Timestamp, i64)> {
        let mut sums: std::collections::BTreeMap<(AccountId, UsageMetric, Timestamp), i64> =
            std::collections::BTreeMap::new();
        for e in &self.entries {
            let amount = i64::try_from(e.amount).unwrap_or(i64::MAX);
            let sum = sums
                .entry((e.account.clone(), e.metric, usage_window(e.at)))
                .or_default();
            *sum = sum.saturating_add(amount);
        }
        sums.into_iter()
            .map(|((a, m, w), n)| (a, m, w, n))
            .collect()
    }
}

/// One window's total of one metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRow {
    /// Metric.
    pub metric: UsageMetric,
    /// Window start.
    pub window_start: Timestamp,
    /// Total.
    pub amount: u64,
}

/// The kind of an operational alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AlertKind {
    /// An endpoint was disabled by the store (410, failing window).
    #[serde(rename = "endpoint.disabled")]
    EndpointDisabled,
    /// A delivery went dead.
    #[serde(rename = "delivery.dead")]
    DeliveryDead,
    /// A circuit opened.
    #[serde(rename = "circuit.opened")]
    CircuitOpened,
    /// A circuit closed.
    #[serde(rename = "circuit.closed")]
    CircuitClosed,
}

impl AlertKind {
    /// The event type name, e.g. `circuit.opened`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::EndpointDisabled => "endpoint.disabled",
            AlertKind::DeliveryDead => "delivery.dead",
            AlertKind::CircuitOpened => "circuit.opened",
            AlertKind::CircuitClosed => "circuit.closed",
        }
    }
}

impl AlertKind {
    /// Every kind.
    pub const ALL: [AlertKind; 4] = [
        AlertKind::EndpointDisabled,
        AlertKind::DeliveryDead,
        AlertKind::CircuitOpened,
        AlertKind::CircuitClosed,
    ];

    /// The kind whose event type is `event_type`, if it is one.
    pub fn from_event_type(event_type: &str) -> Option<AlertKind> {
        AlertKind::ALL
            .into_iter()
            .find(|k| k.as_str() == event_type)
    }
}

/// The event that publishes an alert to the account's endpoints (see
/// [`crate::fan_out`] for who receives it). Its payload names the endpoint,
/// the delivery when there is one, and the message.
pub fn alert_event(
    account: &AccountId,
    kind: AlertKind,
    endpoint: EndpointId,
    delivery: Option<DeliveryId>,
    message: &str,
) -> PublishRequest {
    PublishRequest {
        account: account.clone(),
        event_type: kind.as_str().to_string(),
        payload: serde_json::json!({
            "endpoint_id": endpoint.to_string(),
            "delivery_id": delivery.map(|d| d.to_string()),
            "message": message,
        }),
        idempotency_key: None,
    }
}

/// An account API key as stored: only the hash of the key is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountKey {
    /// Identifies the key (for revocation).
    pub id: KeyId,
    /// The account it reaches.
    pub account: AccountId,
    /// When it was created.
    pub created_at: Timestamp,
}

impl FromStr for AlertKind {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "endpoint.disabled" => Ok(AlertKind::EndpointDisabled),
            "delivery.dead" => Ok(AlertKind::DeliveryDead),
            "circuit.opened" => Ok(AlertKind::CircuitOpened),
            "circuit.closed" => Ok(AlertKind::CircuitClosed),
            _ => Err(StoreError::Backend(format!("unknown alert kind {s:?}"))),
        }
    }
}

/// An operational event, recorded in the transaction that caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// Position, increasing.
    pub id: i64,
    /// Account.
    pub account: AccountId,
    /// Kind.
    pub kind: AlertKind,
    /// The endpoint concerned.
    pub endpoint_id: EndpointId,
    /// The delivery concerned, if any.
    pub delivery_id: Option<DeliveryId>,
    /// Human-readable detail.
    pub message: String,
    /// When.
    pub created_at: Timestamp,
}

/// Rows removed by one maintenance batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Delivered deliveries older than the retention.
    pub deliveries: u64,
    /// Attempt-log rows older than the retention.
    pub attempts: u64,
    /// Expired idempotency records.
    pub idempotency_records: u64,
}

impl PurgeReport {
    /// Total rows removed.
    pub fn total(&self) -> u64 {
        self.deliveries + self.attempts + self.idempotency_records
    }
}
