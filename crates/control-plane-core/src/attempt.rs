//! The attempt log.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::*;

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
