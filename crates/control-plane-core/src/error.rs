//! The one public error of the port.

use std::fmt;

/// What went wrong in a store call.
///
/// Callers branch on the contract variants (`LeaseLost`, `NotFound`, `Conflict`,
/// `InvalidInput`); `Unavailable` and `Busy` are transient and
/// [`StoreError::is_retryable`] says so. Adapters map their own errors into this
/// enum in one place each; no driver error type crosses the port.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease token is stale or unknown: another worker owns the row now, or
    /// the lease expired and was swept. Nothing was changed; drop the work.
    #[error("lease lost: the lease token is stale or unknown, nothing was changed")]
    LeaseLost,
    /// The addressed record does not exist (or belongs to another account).
    #[error("{what} {id} not found")]
    NotFound {
        /// The kind of record, e.g. `endpoint`.
        what: &'static str,
        /// The identifier that was looked up.
        id: String,
    },
    /// The request contradicts stored state, e.g. replaying a delivery that is
    /// not dead, or reusing a task id with a different payload.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The request itself is malformed; the message says what is accepted.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A create would take its account past the quota the request carries;
    /// nothing was written. Counted in the create's own transaction, so
    /// that creates racing in any number of processes cannot pass it
    /// together.
    #[error("over quota: the account would hold {holds} {what}, over its quota of {quota}")]
    OverQuota {
        /// What is counted, e.g. `endpoints`.
        what: &'static str,
        /// What the account would hold with this create.
        holds: u64,
        /// The quota.
        quota: u64,
    },
    /// The backend cannot be reached or is shutting down; retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A transient concurrency failure (serialization failure, deadlock);
    /// retrying the same call is safe.
    #[error("store busy, retry: {0}")]
    Busy(String),
    /// Any other backend failure. Not retryable without a change.
    #[error("store backend error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether the same call may succeed if simply retried later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Busy(_))
    }

    /// True for the answers a contract gives about one item (`LeaseLost`,
    /// `NotFound`, `Conflict`, `InvalidInput`, `OverQuota`), as opposed to
    /// failures of the backend; batch operations report the former per item.
    pub fn is_contract_answer(&self) -> bool {
        matches!(
            self,
            StoreError::LeaseLost
                | StoreError::NotFound { .. }
                | StoreError::Conflict(_)
                | StoreError::InvalidInput(_)
                | StoreError::OverQuota { .. }
        )
    }

    /// `Ok` when an account holding `holds` of `what` (counted by the
    /// store in the create's transaction) may make one more under `quota`;
    /// [`StoreError::OverQuota`] otherwise.
    pub fn within_quota(what: &'static str, holds: i64, quota: u32) -> StoreResult<()> {
        let holds = u64::try_from(holds).unwrap_or(0);
        if holds >= u64::from(quota) {
            return Err(StoreError::OverQuota {
                what,
                holds: holds + 1,
                quota: quota.into(),
            });
        }
        Ok(())
    }

    /// Shorthand for [`StoreError::NotFound`].
    pub fn not_found(what: &'static str, id: impl fmt::Display) -> Self {
        StoreError::NotFound {
            what,
            id: id.to_string(),
        }
    }
}

/// Result alias used throughout the port.
pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_errors_are_retryable() {
        assert!(StoreError::Unavailable("down".into()).is_retryable());
        assert!(StoreError::Busy("40001".into()).is_retryable());
        assert!(!StoreError::LeaseLost.is_retryable());
        assert!(!StoreError::Conflict("x".into()).is_retryable());
        assert!(!StoreError::Backend("x".into()).is_retryable());
        assert!(!StoreError::not_found("endpoint", "e1").is_retryable());
    }
}
