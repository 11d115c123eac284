//! Request idempotency records.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::{validate_short_text, AccountId, KeyId, LeaseToken, StoreResult};

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
    /// How long the record lives once completed: the request's ttl.
    pub keep_for: Duration,
}

/// Whose idempotency records a scope holds, so that a key's records go
/// when it is revoked and an account's when it is erased (ADR 0043). The
/// HTTP layer scopes each record by the caller it authenticated: an account
/// key by its account and key id, the admin by the account of the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdempotencyOwner<'a> {
    /// An account key.
    Key(&'a AccountId, KeyId),
    /// The admin token, on a route of this account.
    AdminOf(&'a AccountId),
    /// The admin token, on a route of no account.
    Admin,
}

impl IdempotencyOwner<'_> {
    /// The scope of this owner's records.
    pub fn scope(&self) -> String {
        match self {
            IdempotencyOwner::Key(account, key) => format!("account:{account}:key:{key}"),
            IdempotencyOwner::AdminOf(account) => format!("account:{account}:admin"),
            IdempotencyOwner::Admin => "admin".to_string(),
        }
    }
}

/// The prefix every scope of `account`'s records starts with (see
/// [`IdempotencyOwner::scope`]); account names hold no `:`, so no other
/// account's scope starts with it.
pub fn idempotency_account_prefix(account: &AccountId) -> String {
    format!("account:{account}:")
}

/// Checks an idempotency key: 1 to 255 characters, no control
/// characters. The one rule of every key: a publish's, the API's
/// `Idempotency-Key` header and the store's records.
///
/// # Errors
/// `InvalidInput` saying what a key may be.
pub fn validate_idempotency_key(key: &str) -> StoreResult<()> {
    validate_short_text("idempotency key", key)
}

/// What [`crate::IdempotencyStore::idempotency_begin`] asks: take `key` of
/// `scope` for the request hashing to `request_hash`, for `ttl`. Checked
/// when built, so a store never sees an empty or oversized key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyBeginRequest {
    scope: String,
    key: String,
    request_hash: String,
    ttl: Duration,
    lease: Duration,
}

impl IdempotencyBeginRequest {
    /// The request.
    ///
    /// # Errors
    /// `InvalidInput` for a scope or key that is empty, over 255 characters
    /// or holds control characters.
    pub fn new(
        scope: impl Into<String>,
        key: impl Into<String>,
        request_hash: impl Into<String>,
        ttl: Duration,
    ) -> StoreResult<Self> {
        let (scope, key) = (scope.into(), key.into());
        validate_short_text("idempotency scope", &scope)?;
        validate_idempotency_key(&key)?;
        Ok(IdempotencyBeginRequest {
            scope,
            key,
            request_hash: request_hash.into(),
            ttl,
            lease: ttl,
        })
    }

    /// Holds the key `in_progress` for at most `lease` (at most the ttl):
    /// a request whose handler never finishes (a crash, a client that gave
    /// up) frees its key once the lease passes, and a completed record
    /// lives the whole ttl from its completion.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.min(self.ttl);
        self
    }

    /// How long the key is held before the request completes.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The scope the key is unique in (for example the account and route).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The caller's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The hash of the request that takes the key.
    pub fn request_hash(&self) -> &str {
        &self.request_hash
    }

    /// How long the record lives once completed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

#[cfg(test)]
mod begin_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::StoreError;

    #[test]
    fn a_begin_request_refuses_an_empty_or_oversized_key_or_scope() {
        let ttl = Duration::from_secs(60);
        let ok = IdempotencyBeginRequest::new("a:/events", "k", "h", ttl).unwrap();
        assert_eq!(
            (ok.scope(), ok.key(), ok.request_hash()),
            ("a:/events", "k", "h")
        );
        for (scope, key) in [("", "k"), ("s", ""), ("s", &"k".repeat(256)), ("s", "a\nb")] {
            assert!(
                matches!(
                    IdempotencyBeginRequest::new(scope, key, "h", ttl),
                    Err(StoreError::InvalidInput(_))
                ),
                "{scope:?} {key:?}"
            );
        }
    }
}
