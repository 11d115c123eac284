//! Identifiers, account names, paging and the small checks every area shares.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::StoreError;
use crate::Timestamp;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh identifier, time-ordered (UUIDv7): ids written at
            /// high rates land at the right edge of their indexes (ADR 0020).
            pub fn new() -> Self {
                $name(Uuid::now_v7())
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
uuid_id!(
    /// Identifies a portal link.
    PortalLinkId
);

string_id! {
    /// An account (tenant) name: 1 to 64 characters of `A-Z a-z 0-9 _ -`.
    pub struct AccountId;
}

/// The label under which per-account metrics count every account beyond
/// their bound (the API's queue-depth gauges, the dispatcher's attempt
/// counters): one name across the `/metrics` page. It is not a valid account
/// name (parentheses), so no real account is ever counted under it by name.
pub const OTHER_ACCOUNTS: &str = "(other)";

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
}

/// Keyset pagination: at most `limit` items after `after` (exclusive).
/// Built checked ([`PageRequest::new`]), so a store never sees a limit
/// outside 1 to 1000.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    limit: u32,
    after: Option<i64>,
}

impl PageRequest {
    /// Up to `limit` items after `after` (the `next` of the previous page).
    ///
    /// # Errors
    /// `InvalidInput` for a limit outside 1 to 1000.
    pub fn new(limit: u32, after: Option<i64>) -> Result<Self, StoreError> {
        validate_limit(limit)?;
        Ok(PageRequest { limit, after })
    }

    /// The first page of `limit` items, `limit` brought into 1 to 1000.
    pub fn first(limit: u32) -> Self {
        PageRequest {
            limit: limit.clamp(1, 1000),
            after: None,
        }
    }

    /// Items per page, 1 to 1000.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The `next` of the previous page; `None` for the first.
    pub fn after(&self) -> Option<i64> {
        self.after
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

/// Checks a name, scope, key, tick name or batch id: 1 to 255 bytes, no
/// control character (PostgreSQL cannot store NUL in text, and no adapter
/// may accept what another refuses).
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
    if v.chars().any(char::is_control) {
        return Err(StoreError::InvalidInput(format!(
            "{what} must not contain control characters, got {v:?}"
        )));
    }
    Ok(())
}

/// Checks free text (a description): any length and line breaks, but no
/// NUL character, which PostgreSQL cannot store in text.
///
/// # Errors
/// `InvalidInput` naming `what`.
pub fn validate_free_text(what: &str, v: &str) -> Result<(), StoreError> {
    if v.contains('\0') {
        return Err(StoreError::InvalidInput(format!(
            "{what} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// Checks every string and key of a JSON value with [`validate_free_text`]:
/// JSON can carry `\u0000`, which some stores cannot hold.
pub fn validate_json_text(what: &str, v: &serde_json::Value) -> Result<(), StoreError> {
    match v {
        serde_json::Value::String(s) => validate_free_text(what, s),
        serde_json::Value::Array(items) => {
            items.iter().try_for_each(|i| validate_json_text(what, i))
        }
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            validate_free_text(what, k)?;
            validate_json_text(what, v)
        }),
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_of_other_accounts_is_no_account_name() {
        assert!(AccountId::new(OTHER_ACCOUNTS).is_err());
        assert!(AccountId::new("_other").is_ok());
    }

    #[test]
    fn account_names_are_validated() {
        assert!(AccountId::new("acme_1-x").is_ok());
        assert!(AccountId::new("").is_err());
        assert!(AccountId::new("a b").is_err());
        assert!(AccountId::new("x".repeat(65)).is_err());
    }
}

/// An endpoint of an account: how the port's endpoint-scoped methods name
/// it. The account scopes every read and write: the endpoint of another
/// account is `NotFound`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointKey<'a> {
    /// The account.
    pub account: &'a AccountId,
    /// The endpoint.
    pub id: EndpointId,
}

impl<'a> EndpointKey<'a> {
    /// Endpoint `id` of `account`.
    pub fn new(account: &'a AccountId, id: EndpointId) -> Self {
        EndpointKey { account, id }
    }
}

/// A span of time `[from, to)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeRange {
    /// The first instant in it.
    pub from: Timestamp,
    /// The first instant after it.
    pub to: Timestamp,
}
