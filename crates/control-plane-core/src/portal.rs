//! Portal links (ADR 0049): a one-time sign-in that an account gives one of
//! its own customers, to a consumer view of the account or of some of its
//! endpoints. The store keeps only the hash of the link's token.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::session::check_hex;
use crate::types::{AccountId, EndpointId, PortalLinkId};

/// Longest a portal link lasts: a week.
pub const MAX_PORTAL_LINK_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most endpoints one portal link may name.
pub const MAX_PORTAL_LINK_ENDPOINTS: usize = 50;

/// The most links [`crate::PortalStore::portal_link_list`] answers.
pub const MAX_PORTAL_LINKS_LISTED: i64 = 1000;

/// What a portal session may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortalRole {
    /// Sees its endpoints, their deliveries and attempts, the event types.
    Viewer,
    /// A viewer that may also add, edit, disable and delete endpoints,
    /// rotate a secret, replay and recover.
    Manager,
}

impl PortalRole {
    /// `viewer` or `manager`.
    pub fn as_str(self) -> &'static str {
        match self {
            PortalRole::Viewer => "viewer",
            PortalRole::Manager => "manager",
        }
    }
}

impl fmt::Display for PortalRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PortalRole {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(PortalRole::Viewer),
            "manager" => Ok(PortalRole::Manager),
            _ => Err(StoreError::InvalidInput(format!(
                "a portal role is viewer or manager, got {s:?}"
            ))),
        }
    }
}

/// A portal link as stored (never its token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalLink {
    /// Identifies the link (for its revocation).
    pub id: PortalLinkId,
    /// The account it opens.
    pub account: AccountId,
    /// What its sessions may do.
    pub role: PortalRole,
    /// The endpoints it shows; empty: every endpoint of the account.
    pub endpoints: Vec<EndpointId>,
    /// When it was created (store time).
    pub created_at: Timestamp,
    /// When it ends, and every session it opened with it.
    pub expires_at: Timestamp,
    /// When it was redeemed, if it was: it opens nothing more.
    pub redeemed_at: Option<Timestamp>,
    /// When it was revoked, if it was: its sessions end.
    pub revoked_at: Option<Timestamp>,
}

impl PortalLink {
    /// Whether endpoint `id` is within the link's reach.
    pub fn shows(&self, id: EndpointId) -> bool {
        self.endpoints.is_empty() || self.endpoints.contains(&id)
    }

    /// Whether the link still holds at `now`: not revoked, not expired.
    pub fn live_at(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at > now
    }
}

/// The endpoints of a link as one stored text: their ids, comma-separated
/// (empty for every endpoint).
pub fn portal_endpoints_text(endpoints: &[EndpointId]) -> String {
    endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The endpoints of a link from their stored text.
///
/// # Errors
/// `InvalidInput` for an id that is not a UUID.
pub fn portal_endpoints_parse(text: &str) -> Result<Vec<EndpointId>, StoreError> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

/// What `portal_link_create` stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalLinkCreateRequest {
    account: AccountId,
    token_hash: String,
    role: PortalRole,
    endpoints: Vec<EndpointId>,
    lifetime: Duration,
}

impl PortalLinkCreateRequest {
    /// A link of `account` whose token hashes to `token_hash`, for `role`,
    /// showing `endpoints` (none: all of them), that lasts `lifetime`.
    ///
    /// # Errors
    /// `InvalidInput` for a hash that is not 32 to 128 lowercase hex digits,
    /// more than [`MAX_PORTAL_LINK_ENDPOINTS`] endpoints, or a lifetime of
    /// zero or over [`MAX_PORTAL_LINK_LIFETIME`].
    pub fn new(
        account: AccountId,
        token_hash: impl Into<String>,
        role: PortalRole,
        mut endpoints: Vec<EndpointId>,
        lifetime: Duration,
    ) -> Result<Self, StoreError> {
        let token_hash = token_hash.into();
        check_hex("token hash", &token_hash)?;
        endpoints.sort_unstable();
        endpoints.dedup();
        if endpoints.len() > MAX_PORTAL_LINK_ENDPOINTS {
            return Err(StoreError::InvalidInput(format!(
                "a portal link names at most {MAX_PORTAL_LINK_ENDPOINTS} endpoints, got {}",
                endpoints.len()
            )));
        }
        if lifetime.is_zero() || lifetime > MAX_PORTAL_LINK_LIFETIME {
            return Err(StoreError::InvalidInput(format!(
                "a portal link lasts more than nothing and at most {} days, got {lifetime:?}",
                MAX_PORTAL_LINK_LIFETIME.as_secs() / 86_400
            )));
        }
        Ok(PortalLinkCreateRequest {
            account,
            token_hash,
            role,
            endpoints,
            lifetime,
        })
    }

    /// The hash of the link's token.
    pub fn token_hash(&self) -> &str {
        &self.token_hash
    }

    /// The link as stored when created at `now`.
    pub fn link_at(&self, now: Timestamp) -> PortalLink {
        PortalLink {
            id: PortalLinkId::new(),
            account: self.account.clone(),
            role: self.role,
            endpoints: self.endpoints.clone(),
            created_at: now,
            expires_at: now.plus(self.lifetime),
            redeemed_at: None,
            revoked_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_portal_link_request_checks_its_fields() {
        let a = AccountId::new("acme").unwrap();
        let day = Duration::from_secs(86_400);
        let e = EndpointId::new();
        let ok = PortalLinkCreateRequest::new(a.clone(), HEX, PortalRole::Viewer, vec![e, e], day)
            .unwrap();
        let link = ok.link_at(Timestamp::from_millis(1_000));
        assert_eq!(link.endpoints, vec![e], "named once");
        assert_eq!(link.expires_at, Timestamp::from_millis(1_000 + 86_400_000));
        assert!(link.shows(e) && !link.shows(EndpointId::new()));
        assert!(link.live_at(Timestamp::from_millis(2_000)));
        assert!(!link.live_at(link.expires_at));
        let new = |hash: &str, n: usize, life: Duration| {
            let many = (0..n).map(|_| EndpointId::new()).collect();
            PortalLinkCreateRequest::new(a.clone(), hash, PortalRole::Manager, many, life)
        };
        assert!(new(HEX, MAX_PORTAL_LINK_ENDPOINTS, MAX_PORTAL_LINK_LIFETIME).is_ok());
        assert!(new("XYZ", 0, day).is_err());
        assert!(new(HEX, MAX_PORTAL_LINK_ENDPOINTS + 1, day).is_err());
        assert!(new(HEX, 0, Duration::ZERO).is_err());
        assert!(new(HEX, 0, MAX_PORTAL_LINK_LIFETIME + Duration::from_secs(1)).is_err());
        assert_eq!(
            "manager".parse::<PortalRole>().unwrap(),
            PortalRole::Manager
        );
        assert!("admin".parse::<PortalRole>().is_err());
        let ids = vec![EndpointId::new(), EndpointId::new()];
        assert_eq!(
            portal_endpoints_parse(&portal_endpoints_text(&ids)).unwrap(),
            ids
        );
        assert!(portal_endpoints_parse("").unwrap().is_empty());
    }
}
