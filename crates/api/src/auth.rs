//! Bearer tokens: the admin token reaches every account; an account key,
//! stored as its SHA-256 hash, reaches only its own account.

use std::net::IpAddr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use base64::Engine;
use control_plane_core::{AccountId, AccountKey, IdempotencyOwner, KeyId, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::limiter::FailureLimiter;
use crate::ApiState;

/// The longest bearer token the API reads (header and dashboard login); a
/// configured admin token must fit.
pub const MAX_TOKEN_BYTES: usize = 256;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The admin token.
    Admin,
    /// A key of this account.
    Account(AccountId),
}

impl Caller {
    /// The account named in the path, when the caller may reach it; `404`
    /// otherwise (an account learns nothing about others).
    ///
    /// # Errors
    /// `404` for another account's path, `422` for a malformed account name.
    pub fn reach(&self, account: &str) -> Result<AccountId, ApiError> {
        let wanted = AccountId::new(account).map_err(|_| ApiError::not_found("account"))?;
        match self {
            Caller::Admin => Ok(wanted),
            Caller::Account(own) if *own == wanted => Ok(wanted),
            Caller::Account(_) => Err(ApiError::not_found("account")),
        }
    }

    /// `Ok` for the admin only; `404` for an account key.
    ///
    /// # Errors
    /// `404` for anyone but the admin.
    pub fn admin_only(&self) -> Result<(), ApiError> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Account(_) => Err(ApiError::not_found("route")),
        }
    }
}

/// The stored form of a token: hex SHA-256. Tokens carry 244 random bits, so
/// an unsalted fast hash is enough to make a stolen table useless.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random token with `prefix` (`cpa_` admin, `cpk_` account key).
pub fn generate_token(prefix: &str) -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}{a}{b}")
}

/// A new endpoint signing secret: `whsec_` and 24 random bytes in base64.
pub fn generate_secret() -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    let mut bytes = Vec::with_capacity(24);
    bytes.extend_from_slice(&a.as_bytes()[..12]);
    bytes.extend_from_slice(&b.as_bytes()[..12]);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Checks a caller-given signing secret of `scheme`: core's one rule
/// ([`control_plane_core::validate_signing_secret`]), and the scheme.
///
/// # Errors
/// `422` saying what is accepted.
pub fn validate_secret(secret: &str, scheme: SignatureScheme) -> Result<(), ApiError> {
    match control_plane_core::validate_signing_secret(secret)? {
        given if given == scheme => Ok(()),
        _ => Err(ApiError::invalid(format!(
            "the endpoint signs with {}: its secret starts with {}",
            scheme.as_str(),
            scheme.prefix()
        ))),
    }
}

/// A new signing secret of `scheme`.
///
/// # Errors
/// `503` when the system gives no random bytes for an Ed25519 key.
pub fn new_secret(scheme: SignatureScheme) -> Result<String, ApiError> {
    match scheme {
        SignatureScheme::Hmac => Ok(generate_secret()),
        SignatureScheme::Ed25519 => Ok(control_plane_core::generate_ed25519_secret()?),
    }
}

/// Who sent a request, as its bearer token says: found once, by
/// [`authenticate`], before anything else of the request is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Authenticated {
    /// The caller.
    pub(crate) caller: Caller,
    /// The account key's id; `None` for the admin.
    pub(crate) key: Option<KeyId>,
}

impl Authenticated {
    /// The scope of this caller's idempotency records on a route of
    /// `account` (the path's, if any); `None` where the caller may not act,
    /// so that such a request writes no record (ADR 0043).
    pub(crate) fn idempotency_scope(&self, account: Option<&str>) -> Option<String> {
        let account = account.map(AccountId::new).transpose().ok()?;
        let owner = match (&self.caller, self.key, &account) {
            (Caller::Admin, _, Some(a)) => IdempotencyOwner::AdminOf(a),
            (Caller::Admin, _, None) => IdempotencyOwner::Admin,
            (Caller::Account(own), Some(key), Some(a)) if own == a => {
                IdempotencyOwner::Key(own, key)
            }
            _ => return None,
        };
        Some(owner.scope())
    }
}

/// Whether a request to `path` needs a bearer token: the API's routes but
/// its OpenAPI document, and `/metrics`. (`/healthz`, `/readyz` and the
/// dashboard, which signs in on its own, do not.)
fn needs_token(path: &str) -> bool {
    (path.starts_with("/v1/") && path != "/v1/openapi.json") || path == "/metrics"
}

/// The middleware that authenticates every request that needs a token
/// before its body is read, its idempotency record is written or its
/// handler runs: an anonymous client (no token, a junk token, a revoked
/// key) is answered `401` (or `429`) having cost only the limiter and at
/// most one indexed read (DESIGN 3.11). The caller found is kept in the
/// request for [`Caller`]'s extractor and the idempotency layer.
pub(crate) async fn authenticate(
    axum::extract::State(state): axum::extract::State<Arc<ApiState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !needs_token(req.uri().path()) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    match authenticate_parts(&parts, &state).await {
        Ok(who) => {
            parts.extensions.insert(who);
            next.run(axum::extract::Request::from_parts(parts, body))
                .await
        }
        Err(e) => {
            // The body is left unread: the connection is not reused.
            let mut r = e.into_response();
            r.headers_mut().insert(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            r
        }
    }
}

/// Who the request's `Authorization: Bearer` token is; `401` or `429`.
async fn authenticate_parts(parts: &Parts, state: &ApiState) -> Result<Authenticated, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("an Authorization: Bearer <token> header is required"))?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES)
        .ok_or_else(|| unauthorized("the Authorization header must be \"Bearer <token>\""))?;
    let addr = crate::limiter::client_address(parts);
    match identify(state, &state.bearer_failures, addr, token).await? {
        Ok(who) => Ok(who),
        Err(Refused::Unknown) => Err(unauthorized("the token is not valid")),
        Err(Refused::TooMany(wait)) => Err(ApiError::too_many(
            "too many requests with invalid tokens from this address: wait and try again",
            wait,
        )),
    }
}

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        // Found by `authenticate` before the body was read; a router
        // without that layer (a test's) authenticates here.
        if let Some(who) = parts.extensions.get::<Authenticated>() {
            return Ok(who.caller.clone());
        }
        Ok(authenticate_parts(parts, state).await?.caller)
    }
}

/// Requests with an unknown bearer token allowed per client address and
/// [`BEARER_WINDOW`]; past them the address's unknown tokens are answered
/// `429` until the window has room, and its valid ones still pass (see
/// [`caller_limited`]).
pub const BEARER_FAILURES: usize = 30;

/// The window of [`BEARER_FAILURES`].
pub const BEARER_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The caller whose token hashes to `hash` (see [`hash_token`]), if any: the
/// admin, or the account of a stored, unrevoked key.
///
/// # Errors
/// When the store cannot be asked.
pub async fn caller_for_hash(state: &ApiState, hash: &str) -> Result<Option<Caller>, ApiError> {
    if is_admin_hash(state, hash) {
        return Ok(Some(Caller::Admin));
    }
    account_for_hash(state, hash).await
}

/// Whether `hash` is the admin token's, compared in constant time.
fn is_admin_hash(state: &ApiState, hash: &str) -> bool {
    bool::from(hash.as_bytes().ct_eq(state.admin_hash.as_bytes()))
}

/// The account of the stored, unrevoked key whose hash is `hash`, if any.
async fn account_for_hash(state: &ApiState, hash: &str) -> Result<Option<Caller>, ApiError> {
    Ok(key_for_hash(state, hash)
        .await?
        .map(|key| Caller::Account(key.account)))
}

/// The stored, unrevoked key whose hash is `hash`, if any.
async fn key_for_hash(state: &ApiState, hash: &str) -> Result<Option<AccountKey>, ApiError> {
    Ok(state.store.account_key_find(hash).await?)
}

/// Whether `token` has the shape [`generate_token`] gives every account
/// key: `cpk_` and 64 hex digits.
fn may_be_account_key(token: &str) -> bool {
    token
        .strip_prefix("cpk_")
        .is_some_and(|rest| rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Why [`caller_limited`] found nobody for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Neither the admin token nor a key: counted as a failure of its
    /// address.
    Unknown,
    /// Not a valid token, from an address past its failures: to be
    /// answered `429`, to retry after this long.
    TooMany(std::time::Duration),
}

/// Who `token` is, counted as a failure of `addr` in `failures` when it is
/// nobody: what the API's bearer tokens and the dashboard's sign-in share.
///
/// A valid token is never refused for what others behind the same address
/// (a proxy, a NAT) did. The admin token is compared first and costs no
/// store read; an account key is looked up (one indexed store read) even
/// from an address past its failures. What such an address loses is the
/// lookup of anything else: a token that cannot be an account key (see
/// `may_be_account_key`) is refused at once, so a flood of junk costs no
/// store read. A flood of key-shaped guesses costs one read each, as
/// requests with a valid key do, and cannot find a key of 244 random bits.
/// An empty token, or one over [`MAX_TOKEN_BYTES`], is nobody.
///
/// # Errors
/// When the store cannot be asked.
pub async fn caller_limited(
    state: &ApiState,
    failures: &FailureLimiter,
    addr: IpAddr,
    token: &str,
) -> Result<Result<Caller, Refused>, ApiError> {
    Ok(identify(state, failures, addr, token)
        .await?
        .map(|who| who.caller))
}

/// [`caller_limited`], with the key's id.
async fn identify(
    state: &ApiState,
    failures: &FailureLimiter,
    addr: IpAddr,
    token: &str,
) -> Result<Result<Authenticated, Refused>, ApiError> {
    let now = std::time::Instant::now();
    let limited = failures.check(addr, now).err();
    if !token.is_empty() && token.len() <= MAX_TOKEN_BYTES {
        let hash = hash_token(token);
        if is_admin_hash(state, &hash) {
            return Ok(Ok(Authenticated {
                caller: Caller::Admin,
                key: None,
            }));
        }
        if limited.is_none() || may_be_account_key(token) {
            if let Some(key) = key_for_hash(state, &hash).await? {
                return Ok(Ok(Authenticated {
                    caller: Caller::Account(key.account),
                    key: Some(key.id),
                }));
            }
        }
    }
    Ok(Err(match limited {
        Some(wait) => Refused::TooMany(wait),
        None => {
            failures.failed(addr, now);
            Refused::Unknown
        }
    }))
}

/// The account a request may act on: the `{account}` of the path, checked
/// against the caller before anything else of the request (its body
/// included) is looked at, so another account's routes all answer `404`.
#[derive(Clone, Debug)]
pub struct Scope(pub AccountId);

/// The caller and the `{account}` of the path.
async fn caller_and_account(
    parts: &mut Parts,
    state: &Arc<ApiState>,
) -> Result<(Caller, String), ApiError> {
    let caller = Caller::from_request_parts(parts, state).await?;
    let params =
        axum::extract::Path::<std::collections::HashMap<String, String>>::from_request_parts(
            parts, state,
        )
        .await
        .map_err(|_| ApiError::not_found("account"))?;
    let account = params
        .get("account")
        .cloned()
        .ok_or_else(|| ApiError::not_found("account"))?;
    Ok((caller, account))
}

impl FromRequestParts<Arc<ApiState>> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let (caller, account) = caller_and_account(parts, state).await?;
        caller.reach(&account).map(Scope)
    }
}

/// An admin-only route's account: `404` for anyone but the admin.
#[derive(Clone, Debug)]
pub struct AdminScope(pub AccountId);

impl FromRequestParts<Arc<ApiState>> for AdminScope {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let (caller, account) = caller_and_account(parts, state).await?;
        caller.admin_only()?;
        caller.reach(&account).map(AdminScope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generated_account_key_may_be_a_key_and_junk_may_not() {
        for _ in 0..100 {
            let key = generate_token("cpk_");
            assert!(may_be_account_key(&key), "{key}");
            assert!(!may_be_account_key(&key[..key.len() - 1]), "{key}");
        }
        for junk in [
            "",
            "cpk_",
            "cpk_wrong",
            "cpa_test_admin",
            &generate_token("cpa_"),
        ] {
            assert!(!may_be_account_key(junk), "{junk}");
        }
    }
}
