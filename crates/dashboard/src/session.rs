//! Dashboard sessions (ADR 0021): sign-in with a token, the session
//! cookie, the CSRF token of every form, same-origin checks and sign-out.

use std::collections::HashMap;
use std::sync::Arc;

use api::auth::{caller_for_hash, caller_limited, generate_token, hash_token, Caller, Refused};
use api::limiter::{ClientAddr, FailureLimiter};
use api::{ApiError, ApiState};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use control_plane_core::{AccountId, SessionCreateRequest};
use maud::html;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::layout::{answer, page};
use crate::UiError;

/// A session cookie: its name and the path it is sent to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cookie {
    name: &'static str,
    path: &'static str,
}

/// The operator's session cookie, sent to `/ui` only.
pub(crate) const OPERATOR: Cookie = Cookie {
    name: "cp_session",
    path: "/ui",
};

/// A portal session's cookie, sent to `/portal` only (ADR 0049).
pub(crate) const PORTAL: Cookie = Cookie {
    name: "cp_portal",
    path: "/portal",
};

/// How long a dashboard session lasts from its sign-in, at most.
pub const SESSION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// A session not used for this long ends: each use moves its expiry this far
/// ahead (at most once a minute), never past [`SESSION_LIFETIME`].
pub const SESSION_IDLE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The expiry a session used at `now` gets, when that moves it by more than
/// a minute: `now` + [`SESSION_IDLE`], capped at [`SESSION_LIFETIME`] after
/// its sign-in.
fn renewed_expiry(
    s: &control_plane_core::DashboardSession,
    now: control_plane_core::Timestamp,
) -> Option<control_plane_core::Timestamp> {
    let idle = now.plus(SESSION_IDLE).as_millis();
    let until = idle.min(s.created_at.plus(SESSION_LIFETIME).as_millis());
    (until > s.expires_at.as_millis() + 60_000)
        .then_some(control_plane_core::Timestamp::from_millis(until))
}

/// Failed sign-ins allowed per client address and [`SIGN_IN_WINDOW`]; past
/// them the address's invalid tokens are answered `429` until the window
/// has room again, and valid ones still sign in.
pub const SIGN_IN_FAILURES: usize = 10;

/// The window of [`SIGN_IN_FAILURES`].
pub const SIGN_IN_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The failed sign-ins of each client address (the dashboard's own, beside
/// the API's limit on bearer tokens).
pub(crate) struct SignInFailures(pub(crate) FailureLimiter);

impl SignInFailures {
    pub(crate) fn new() -> Self {
        SignInFailures(FailureLimiter::new(SIGN_IN_FAILURES, SIGN_IN_WINDOW))
    }
}

/// A signed-in operator: who they are, the CSRF token of their session and
/// the hash of its id.
pub(crate) struct Session {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
    id_hash: String,
}

impl Session {
    /// `Ok` when `given` is this session's CSRF token.
    fn check_csrf(&self, given: &str) -> Result<(), UiError> {
        check_csrf(&self.csrf, given)
    }
}

/// `Ok` when `given` is the session's CSRF token `csrf`.
pub(crate) fn check_csrf(csrf: &str, given: &str) -> Result<(), UiError> {
    if bool::from(given.as_bytes().ct_eq(csrf.as_bytes())) {
        Ok(())
    } else {
        Err(UiError(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form is stale or came from another site: reload the page and try again",
        )))
    }
}

/// A page of one account: the signed-in session, and the `{account}` of
/// the path once the session's reach allows it (`404` otherwise, as the
/// API answers).
pub(crate) struct AccountPage {
    pub(crate) session: Session,
    pub(crate) account: AccountId,
}

/// An action posted from a page of one account: from this site, with the
/// session's CSRF token, within the session's reach, checked in that order
/// before the handler runs; `form` is what was posted.
pub(crate) struct Action<F> {
    pub(crate) account: AccountId,
    pub(crate) form: F,
}

/// A posted form: it carries the session's CSRF token.
pub(crate) trait Posted: DeserializeOwned + Send {
    /// The CSRF token the form carried.
    fn csrf(&self) -> &str;
}

/// The `{account}` of the path.
async fn path_account(parts: &mut Parts, state: &Arc<ApiState>) -> Result<String, Response> {
    let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
        .await
        .map_err(|_| UiError(ApiError::not_found("account")).into_response())?;
    params
        .get("account")
        .cloned()
        .ok_or_else(|| UiError(ApiError::not_found("account")).into_response())
}

impl FromRequestParts<Arc<ApiState>> for AccountPage {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let session = Session::from_request_parts(parts, state).await?;
        let wanted = path_account(parts, state).await?;
        let account = session
            .caller
            .reach(&wanted)
            .map_err(|e| UiError(e).into_response())?;
        Ok(AccountPage { session, account })
    }
}

impl<F: Posted> FromRequest<Arc<ApiState>> for Action<F> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<ApiState>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let session = Session::from_request_parts(&mut parts, state).await?;
        let wanted = path_account(&mut parts, state).await?;
        let headers = parts.headers.clone();
        let Form(form) = Form::<F>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        let checked = same_origin(&headers)
            .and_then(|()| session.check_csrf(form.csrf()))
            .and_then(|()| Ok(session.caller.reach(&wanted)?));
        match checked {
            Ok(account) => Ok(Action { account, form }),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// The session id from `cookie`: 64 lowercase hex digits.
fn session_id(headers: &HeaderMap, cookie: Cookie) -> Option<String> {
    crate::cookie::values(headers, cookie.name)
        .find(|id| control_plane_core::check_hex("session id", id).is_ok())
        .map(str::to_string)
}

/// The live stored session of `cookie` and the hash of its id; `None`
/// without a cookie or a live session.
pub(crate) async fn stored_session(
    headers: &HeaderMap,
    state: &ApiState,
    cookie: Cookie,
) -> Result<Option<(control_plane_core::DashboardSession, String)>, UiError> {
    let Some(id) = session_id(headers, cookie) else {
        return Ok(None);
    };
    let id_hash = hash_token(&id);
    Ok(state
        .store()
        .session_get(&id_hash)
        .await?
        .map(|s| (s, id_hash)))
}

/// Moves a session's expiry on as it is used ([`SESSION_IDLE`]), never past
/// `cap` (a portal link's end) nor [`SESSION_LIFETIME`].
pub(crate) async fn renew(
    state: &ApiState,
    stored: &control_plane_core::DashboardSession,
    id_hash: &str,
    cap: Option<control_plane_core::Timestamp>,
) -> Result<(), UiError> {
    if let Some(until) = renewed_expiry(stored, state.now()) {
        let until = cap.map_or(until, |c| until.min(c));
        if until > stored.expires_at {
            state.store().session_extend(id_hash, until).await?;
        }
    }
    Ok(())
}

impl FromRequestParts<Arc<ApiState>> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/ui/login").into_response();
        let (stored, id_hash) = stored_session(&parts.headers, state, OPERATOR)
            .await
            .map_err(IntoResponse::into_response)?
            .ok_or_else(to_login)?;
        match caller_for_hash(state, &stored.token_hash).await {
            Ok(Some(caller)) => {
                renew(state, &stored, &id_hash, None)
                    .await
                    .map_err(IntoResponse::into_response)?;
                Ok(Session {
                    caller,
                    csrf: stored.csrf,
                    id_hash,
                })
            }
            // The token signed in with is no longer valid (a revoked key,
            // a changed admin token): the session ends with it.
            Ok(None) => {
                let _ = state.store().session_end(&id_hash).await;
                Err(to_login())
            }
            Err(e) => Err(UiError(e).into_response()),
        }
    }
}

/// Refuses a `POST` that a browser says came from another site.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), UiError> {
    let forbidden = || {
        UiError(ApiError::new(
            StatusCode::FORBIDDEN,
            "cross-site form submissions are refused",
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(forbidden());
        }
    }
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let origin = origin.to_str().unwrap_or_default();
        let origin_host = origin.split_once("://").map_or("", |(_, h)| h);
        if origin_host.as_bytes() != host.as_bytes() {
            return Err(forbidden());
        }
    }
    Ok(())
}

pub(crate) async fn login_form() -> Response {
    answer(login_page(false))
}

fn login_page(failed: bool) -> maud::Markup {
    let body = html! {
        @if failed {
            p.error id="error" { "That token is not valid." }
        }
        form.login method="post" action="/ui/login" {
            label for="token" { "Admin token or account key" }
            input type="password" id="token" name="token" autocomplete="off" required;
            button type="submit" id="sign-in" { "Sign in" }
        }
    };
    page("Sign in", None, None, &body)
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

/// Checks the token, starts a session and sets its cookie.
pub(crate) async fn login(
    State(state): State<Arc<ApiState>>,
    Extension(failures): Extension<Arc<SignInFailures>>,
    headers: HeaderMap,
    ClientAddr(addr): ClientAddr,
    Form(form): Form<LoginForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    let token = form.token.trim();
    // A valid token signs in even from an address past its failures.
    match caller_limited(&state, &failures.0, addr, token).await? {
        Ok(_) => {}
        Err(Refused::Unknown) => {
            return Ok((StatusCode::UNAUTHORIZED, answer(login_page(true))).into_response());
        }
        Err(Refused::TooMany(wait)) => {
            return Err(UiError(ApiError::too_many(
                "too many failed sign-ins: wait a minute and try again",
                wait,
            )));
        }
    }
    let id = generate_token("");
    let req = SessionCreateRequest::new(
        hash_token(&id),
        hash_token(token),
        generate_token(""),
        SESSION_IDLE,
    )?;
    state.store().session_create(req).await?;
    let mut r = Redirect::to("/ui").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, OPERATOR, Some(&id), false)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// A form that posts nothing but its CSRF token.
#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    pub(crate) csrf: String,
}

impl Posted for CsrfForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Ends the session in the store and clears its cookie.
pub(crate) async fn logout(
    State(state): State<Arc<ApiState>>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    session.check_csrf(&form.csrf)?;
    state.store().session_end(&session.id_hash).await?;
    let mut r = Redirect::to("/ui/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, OPERATOR, None, false)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The `Set-Cookie` value of the session `id` of `cookie` (`None` clears
/// it). It is `Secure` when the browser reached the service over HTTPS
/// (its `Origin`, or a proxy's `X-Forwarded-Proto`), so that such a
/// session is never sent in clear; over plain HTTP (the local quickstart)
/// a browser would refuse a `Secure` cookie. A `framed` cookie (a portal
/// that another site may frame) is `SameSite=None; Secure`, so that the
/// browser sends it inside that site's frame; forms still carry the CSRF
/// token and must come from this origin.
pub(crate) fn session_cookie(
    headers: &HeaderMap,
    cookie: Cookie,
    id: Option<&str>,
    framed: bool,
) -> String {
    let secure = if framed || crate::cookie::over_https(headers) {
        "; Secure"
    } else {
        ""
    };
    let site = if framed { "None" } else { "Strict" };
    let Cookie { name, path } = cookie;
    let age = if id.is_some() {
        SESSION_LIFETIME.as_secs()
    } else {
        0
    };
    let id = id.unwrap_or_default();
    format!("{name}={id}; Path={path}; HttpOnly; SameSite={site}; Max-Age={age}{secure}")
}

/// The form that names the viewer's time zone (`crate::zone`).
#[derive(Deserialize)]
pub(crate) struct ZoneForm {
    csrf: String,
    zone: String,
    back: String,
}

impl Posted for ZoneForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Keeps the zone the viewer named (a name of the time zone database, or
/// `UTC`) in a cookie and goes back to the operator page the form was on.
pub(crate) async fn set_zone(
    session: Session,
    headers: HeaderMap,
    Form(form): Form<ZoneForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    session.check_csrf(&form.csrf)?;
    zone_set(&headers, &form, "/ui")
}

/// The answer to a zone form checked by its caller: the cookie, and back
/// to the page the form was on when it is under `home` (`/ui`, `/portal`),
/// never another site.
pub(crate) fn zone_set(
    headers: &HeaderMap,
    form: &ZoneForm,
    home: &str,
) -> Result<Response, UiError> {
    let name = form.zone.trim();
    let (_, canonical) = crate::zone::named_zone(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "time zone: {name:?} is not a name of the time zone database (like Europe/Berlin, \
             America/New_York or UTC)"
        ))
    })?;
    let back = Some(form.back.as_str())
        .filter(|b| b.starts_with(home) && b.len() <= 2048)
        .filter(|b| b.bytes().all(|c| c.is_ascii_graphic()))
        .unwrap_or(home);
    let mut r = Redirect::to(back).into_response();
    let secure = if crate::cookie::over_https(headers) {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{}={}; Path=/; Max-Age=31536000; SameSite=Lax{secure}",
        crate::zone::COOKIE,
        canonical.replace('/', "%2F")
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_session_cookie_holds_an_id_never_a_token() {
        let mut h = HeaderMap::new();
        let v = format!("other=1; cp_session={ID}; x=y");
        h.insert(header::COOKIE, HeaderValue::from_str(&v).unwrap());
        assert_eq!(session_id(&h, OPERATOR).as_deref(), Some(ID));
        assert_eq!(
            session_id(&h, PORTAL),
            None,
            "each door reads its own cookie"
        );
        // What the old cookie held (the hex of a token) and junk are refused.
        for bad in ["cp_session=zz", "cp_session=6370615f61", "cp_session="] {
            h.insert(header::COOKIE, HeaderValue::from_static(bad));
            assert_eq!(session_id(&h, OPERATOR), None, "{bad}");
        }
    }

    #[test]
    fn the_session_cookie_is_secure_only_over_https() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        let plain = session_cookie(&h, OPERATOR, Some(ID), false);
        assert!(plain.starts_with(&format!("cp_session={ID}; Path=/ui;")));
        assert!(
            plain.contains(&format!("Max-Age={}", SESSION_LIFETIME.as_secs())),
            "{plain}"
        );
        assert!(!plain.contains("Secure"), "{plain}");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://cp.example"),
        );
        assert!(session_cookie(&h, OPERATOR, Some(ID), false).ends_with("; Secure"));
        h.remove(header::ORIGIN);
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let cleared = session_cookie(&h, OPERATOR, None, false);
        assert!(cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"));
        h.remove("x-forwarded-proto");
        let framed = session_cookie(&h, PORTAL, Some(ID), true);
        assert!(
            framed.starts_with(&format!("cp_portal={ID}; Path=/portal;"))
                && framed.contains("SameSite=None")
                && framed.ends_with("; Secure"),
            "{framed}"
        );
    }

    #[test]
    fn a_used_session_moves_its_expiry_up_to_its_lifetime() {
        use control_plane_core::{DashboardSession, Timestamp};
        let t0 = Timestamp::from_millis(1_000_000);
        let s = DashboardSession {
            id_hash: ID.into(),
            token_hash: ID.into(),
            csrf: ID.into(),
            created_at: t0,
            expires_at: t0.plus(SESSION_IDLE),
        };
        assert_eq!(renewed_expiry(&s, t0), None, "just signed in");
        assert_eq!(
            renewed_expiry(&s, t0.plus(std::time::Duration::from_secs(30))),
            None,
            "within a minute"
        );
        let later = t0.plus(std::time::Duration::from_secs(600));
        assert_eq!(renewed_expiry(&s, later), Some(later.plus(SESSION_IDLE)));
        let near_end = t0.plus(SESSION_LIFETIME - std::time::Duration::from_secs(600));
        let s = DashboardSession {
            expires_at: near_end,
            ..s
        };
        assert_eq!(
            renewed_expiry(&s, near_end),
            Some(t0.plus(SESSION_LIFETIME)),
            "capped at the lifetime"
        );
        let s = DashboardSession {
            expires_at: t0.plus(SESSION_LIFETIME),
            ..s
        };
        assert_eq!(renewed_expiry(&s, near_end), None, "already at its cap");
    }

    #[test]
    fn posts_from_another_site_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(same_origin(&h).is_err());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&h).is_err());
    }
}
