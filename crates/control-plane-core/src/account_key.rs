//! Account API keys.

use crate::*;

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
