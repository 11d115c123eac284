//! Single-flight ticks.

use std::time::Duration;

use crate::{validate_short_text, LeaseToken, StoreResult, Timestamp};

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

/// What [`crate::TickStore::tick_claim`] asks: run tick `name` now unless
/// another holds it or it completed less than `every` ago, holding it for
/// `lease_for`. The name is checked when built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickClaimRequest {
    name: String,
    lease_for: Duration,
    every: Duration,
}

impl TickClaimRequest {
    /// The request.
    ///
    /// # Errors
    /// `InvalidInput` for a name that is empty, over 255 characters or holds
    /// control characters.
    pub fn new(name: impl Into<String>, lease_for: Duration, every: Duration) -> StoreResult<Self> {
        let name = name.into();
        validate_short_text("tick name", &name)?;
        Ok(TickClaimRequest {
            name,
            lease_for,
            every,
        })
    }

    /// The tick's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long a claim holds the tick.
    pub fn lease_for(&self) -> Duration {
        self.lease_for
    }

    /// The least time between two runs.
    pub fn every(&self) -> Duration {
        self.every
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreError;

    #[test]
    fn a_tick_claim_refuses_an_empty_or_oversized_name() {
        let s = Duration::from_secs(1);
        assert!(TickClaimRequest::new("sweep", s, s).is_ok());
        for bad in [String::new(), "x".repeat(256), "a\tb".into()] {
            assert!(matches!(
                TickClaimRequest::new(bad, s, s),
                Err(StoreError::InvalidInput(_))
            ));
        }
    }
}
