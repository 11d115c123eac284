//! Account API keys.

use crate::{AccountId, KeyId, Timestamp};

string_id! {
    /// The hash of an account key, as the store keeps it: 1 to 255
    /// characters, no control character. Built checked ([`KeyHash::new`]), so
    /// an adapter never checks it again.
    pub struct KeyHash;
    short_text "key hash";
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
