//! Request idempotency records.

use serde::{Deserialize, Serialize};

use crate::*;

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
