//! Single-flight ticks.

use crate::*;

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
