//! Dashboard sessions, kept by the store so that every replica knows them
//! and signing out ends them everywhere (ADR 0021).

use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::StoreError;

/// Longest session the store accepts: a week.
pub const MAX_SESSION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// A signed-in dashboard session as stored. The browser holds the session
/// id; the store keeps only its hash, so a copy of the table opens nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DashboardSession {
    /// SHA-256 (hex) of the session id in the cookie.
    pub id_hash: String,
    /// SHA-256 (hex) of the token signed in with: the admin token or an
    /// account key, checked again at every request (a revoked key ends it).
    pub token_hash: String,
    /// The session's CSRF token, random, sent with every form.
    pub csrf: String,
    /// When it was created (store time).
    pub created_at: Timestamp,
    /// When it ends (store time).
    pub expires_at: Timestamp,
}

/// What `session_create` stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCreateRequest {
    id_hash: String,
    token_hash: String,
    csrf: String,
    lifetime: Duration,
}

impl SessionCreateRequest {
    /// A session that lasts `lifetime` from its creation.
    ///
    /// # Errors
    /// `InvalidInput` for a hash or CSRF token that is not 32 to 128
    /// lowercase hex digits, or a lifetime of zero or over
    /// [`MAX_SESSION_LIFETIME`].
    pub fn new(
        id_hash: impl Into<String>,
        token_hash: impl Into<String>,
        csrf: impl Into<String>,
        lifetime: Duration,
    ) -> Result<Self, StoreError> {
        let req = SessionCreateRequest {
            id_hash: id_hash.into(),
            token_hash: token_hash.into(),
            csrf: csrf.into(),
            lifetime,
        };
        for (what, v) in [
            ("session id hash", &req.id_hash),
            ("token hash", &req.token_hash),
            ("CSRF token", &req.csrf),
        ] {
            check_hex(what, v)?;
        }
        if lifetime.is_zero() || lifetime > MAX_SESSION_LIFETIME {
            return Err(StoreError::InvalidInput(format!(
                "a session lasts more than nothing and at most {} days, got {lifetime:?}",
                MAX_SESSION_LIFETIME.as_secs() / 86_400
            )));
        }
        Ok(req)
    }

    /// The session as stored when created at `now`.
    pub fn session_at(&self, now: Timestamp) -> DashboardSession {
        DashboardSession {
            id_hash: self.id_hash.clone(),
            token_hash: self.token_hash.clone(),
            csrf: self.csrf.clone(),
            created_at: now,
            expires_at: now.plus(self.lifetime),
        }
    }
}

/// Checks a stored hash or token: 32 to 128 lowercase hex digits.
///
/// # Errors
/// `InvalidInput` naming `what`.
pub fn check_hex(what: &str, v: &str) -> Result<(), StoreError> {
    let hex = v
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !(32..=128).contains(&v.len()) || !hex {
        return Err(StoreError::InvalidInput(format!(
            "{what} must be 32 to 128 lowercase hex digits"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_session_request_checks_its_fields() {
        let ok = SessionCreateRequest::new(HEX, HEX, HEX, Duration::from_secs(60)).unwrap();
        let s = ok.session_at(Timestamp::from_millis(1_000));
        assert_eq!(s.expires_at, Timestamp::from_millis(61_000));
        for bad in [
            "",
            "0123",
            "0123456789ABCDEF0123456789ABCDEF",
            &"a".repeat(129),
        ] {
            assert!(SessionCreateRequest::new(bad, HEX, HEX, Duration::from_secs(1)).is_err());
            assert!(SessionCreateRequest::new(HEX, bad, HEX, Duration::from_secs(1)).is_err());
            assert!(SessionCreateRequest::new(HEX, HEX, bad, Duration::from_secs(1)).is_err());
        }
        assert!(SessionCreateRequest::new(HEX, HEX, HEX, Duration::ZERO).is_err());
        assert!(SessionCreateRequest::new(
            HEX,
            HEX,
            HEX,
            MAX_SESSION_LIFETIME + Duration::from_secs(1)
        )
        .is_err());
    }
}
