//! The operator's web dashboard at `/ui`: server-rendered HTML over the same
//! port as the API, no script at all.
//!
//! Sign-in takes the admin token or an account key and starts a session
//! kept by the store (ADR 0021): the browser gets a random session id in an
//! `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui` that lasts
//! [`SESSION_LIFETIME`] (also `Secure` when the browser came over HTTPS),
//! never the token; the store keeps the id's hash, so signing out ends the
//! session on every replica. Each request checks the token signed in with
//! again, so a revoked key ends its sessions. The session reaches what its
//! token reaches through the API (an account key only its own account,
//! `404` elsewhere). Every form that changes something carries the
//! session's random CSRF token and every `POST` must come from this
//! origin. Failed sign-ins are limited per client address ([`SIGN_IN_FAILURES`]). Every answer
//! carries a strict Content-Security-Policy: no script, styles only from
//! `/ui/app.css`.

mod catalogue;
mod html;
mod pages;
mod recover;
mod tasks;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use control_plane_core::{AccountId, SessionCreateRequest};

use crate::auth::{caller_for_hash, caller_for_token, generate_token, hash_token, Caller};
use crate::error::ApiError;
use crate::limiter::ClientAddr;
use crate::ApiState;

const COOKIE: &str = "cp_session";

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

/// Failed sign-ins allowed per client address and [`SIGN_IN_WINDOW`]; more
/// are answered `429` until the window has room again.
pub const SIGN_IN_FAILURES: usize = 10;

/// The window of [`SIGN_IN_FAILURES`].
pub const SIGN_IN_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The dashboard's routes.
pub(crate) fn router() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/ui", get(pages::home))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/app.css", get(stylesheet))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/a/{account}", get(pages::overview))
        .route("/ui/a/{account}/endpoints", get(pages::endpoints))
        .route(
            "/ui/a/{account}/endpoints/{id}/recover",
            post(recover::recover),
        )
        .route("/ui/a/{account}/event-types", get(catalogue::page))
        .route(
            "/ui/a/{account}/event-types/{name}/send-example",
            post(catalogue::send_example),
        )
        .route("/ui/a/{account}/deliveries", get(pages::deliveries))
        .route("/ui/a/{account}/deliveries/{id}", get(pages::delivery))
        .route(
            "/ui/a/{account}/deliveries/{id}/replay",
            post(pages::delivery_replay),
        )
        .route(
            "/ui/a/{account}/deliveries/{id}/resend",
            post(pages::delivery_resend),
        )
        .route("/ui/a/{account}/dead", get(pages::dead))
        .route("/ui/a/{account}/dead/replay", post(pages::dead_replay))
        .route("/ui/a/{account}/tasks", get(tasks::tasks))
        .route("/ui/a/{account}/tasks/{id}/retry", post(tasks::task_retry))
        .layer(axum::middleware::from_fn(secure_headers))
}

/// Headers on every dashboard answer: the CSP, no framing, no sniffing, no
/// caching of pages that show account data, no referrer leaving the site
/// (`no-referrer` would make browsers send `Origin: null` with our own
/// forms, which [`same_origin`] refuses).
async fn secure_headers(req: Request<Body>, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("app.css"),
    )
}

/// A signed-in operator: who they are, the CSRF token of their session and
/// the hash of its id.
pub(crate) struct Session {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
    id_hash: String,
}

impl Session {
    /// The account an action posted with `headers` and CSRF token `csrf`
    /// may change: from this site, with this session's token, within the
    /// session's reach.
    pub(crate) fn act(
        &self,
        headers: &HeaderMap,
        csrf: &str,
        account: &str,
    ) -> Result<AccountId, UiError> {
        same_origin(headers)?;
        self.check_csrf(csrf)?;
        Ok(self.caller.reach(account)?)
    }

    /// `Ok` when `given` is this session's CSRF token.
    fn check_csrf(&self, given: &str) -> Result<(), UiError> {
        if bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes())) {
            Ok(())
        } else {
            Err(UiError(ApiError::new(
                StatusCode::FORBIDDEN,
                "the form is stale or came from another site: reload the page and try again",
            )))
        }
    }
}

/// The session id from the cookie: 64 lowercase hex digits.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .find(|id| control_plane_core::session::check_hex("session id", id).is_ok())
        .map(str::to_string)
}

impl FromRequestParts<Arc<ApiState>> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/ui/login").into_response();
        let id = session_id(&parts.headers).ok_or_else(to_login)?;
        let id_hash = hash_token(&id);
        let stored = state
            .store
            .session_get(&id_hash)
            .await
            .map_err(|e| UiError::from(e).into_response())?
            .ok_or_else(to_login)?;
        match caller_for_hash(state, &stored.token_hash).await {
            Ok(Some(caller)) => {
                if let Some(until) = renewed_expiry(&stored, state.clock.now()) {
                    state
                        .store
                        .session_extend(&id_hash, until)
                        .await
                        .map_err(|e| UiError::from(e).into_response())?;
                }
                Ok(Session {
                    caller,
                    csrf: stored.csrf,
                    id_hash,
                })
            }
            // The token signed in with is no longer valid (a revoked key,
            // a changed admin token): the session ends with it.
            Ok(None) => {
                let _ = state.store.session_end(&id_hash).await;
                Err(to_login())
            }
            Err(e) => Err(UiError(e).into_response()),
        }
    }
}

/// Refuses a `POST` that a browser says came from another site.
fn same_origin(headers: &HeaderMap) -> Result<(), UiError> {
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

/// An error shown as a page (same status as the API would answer).
pub(crate) struct UiError(pub(crate) ApiError);

impl From<ApiError> for UiError {
    fn from(e: ApiError) -> Self {
        UiError(e)
    }
}

impl From<control_plane_core::StoreError> for UiError {
    fn from(e: control_plane_core::StoreError) -> Self {
        UiError(e.into())
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let ApiError {
            status,
            message,
            retry_after,
            ..
        } = self.0;
        let body = format!(
            "<p class=\"error\" id=\"error\">{}</p><p><a href=\"/ui\">Back to the start</a></p>",
            html::esc(&message)
        );
        let title = status.canonical_reason().unwrap_or("Error");
        let mut r = (status, Html(html::page(title, None, None, &body))).into_response();
        if let Some(wait) = retry_after {
            // The API's header, on the dashboard's page.
            let api = ApiError::too_many("", wait).into_response();
            if let Some(v) = api.headers().get(header::RETRY_AFTER) {
                r.headers_mut().insert(header::RETRY_AFTER, v.clone());
            }
        }
        r
    }
}

async fn login_form() -> Html<String> {
    Html(login_page(false))
}

fn login_page(failed: bool) -> String {
    let note = if failed {
        "<p class=\"error\" id=\"error\">That token is not valid.</p>"
    } else {
        ""
    };
    let body = format!(
        "{note}<form method=\"post\" action=\"/ui/login\" class=\"login\">\
         <label for=\"token\">Admin token or account key</label>\
         <input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"off\" required>\
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form>"
    );
    html::page("Sign in", None, None, &body)
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

/// Checks the token, starts a session and sets its cookie.
async fn login(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    ClientAddr(addr): ClientAddr,
    Form(form): Form<LoginForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    let now = std::time::Instant::now();
    if let Err(wait) = state.sign_in_failures.check(addr, now) {
        return Err(UiError(ApiError::too_many(
            "too many failed sign-ins: wait a minute and try again",
            wait,
        )));
    }
    let token = form.token.trim();
    let caller = if token.is_empty() || token.len() > crate::auth::MAX_TOKEN_BYTES {
        None
    } else {
        caller_for_token(&state, token).await?
    };
    if caller.is_none() {
        state.sign_in_failures.failed(addr, now);
        return Ok((StatusCode::UNAUTHORIZED, Html(login_page(true))).into_response());
    }
    let id = generate_token("");
    let req = SessionCreateRequest::new(
        hash_token(&id),
        hash_token(token),
        generate_token(""),
        SESSION_IDLE,
    )?;
    state.store.session_create(req).await?;
    let mut r = Redirect::to("/ui").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, Some(&id))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    pub(crate) csrf: String,
}

/// Ends the session in the store and clears its cookie.
async fn logout(
    State(state): State<Arc<ApiState>>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    session.check_csrf(&form.csrf)?;
    state.store.session_end(&session.id_hash).await?;
    let mut r = Redirect::to("/ui/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, None)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The `Set-Cookie` value of the session `id` (`None` clears it).
/// It is `Secure` when the browser reached the service over HTTPS (its
/// `Origin`, or a proxy's `X-Forwarded-Proto`), so that such a session is
/// never sent in clear; over plain HTTP (the local quickstart) a browser
/// would refuse a `Secure` cookie.
fn session_cookie(headers: &HeaderMap, id: Option<&str>) -> String {
    let https = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https") || v.starts_with("https://"))
    };
    let secure =
        if https(header::ORIGIN) || https(header::HeaderName::from_static("x-forwarded-proto")) {
            "; Secure"
        } else {
            ""
        };
    match id {
        Some(id) => format!(
            "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            SESSION_LIFETIME.as_secs()
        ),
        None => format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_session_cookie_holds_an_id_never_a_token() {
        let mut h = HeaderMap::new();
        let v = format!("other=1; {COOKIE}={ID}; x=y");
        h.insert(header::COOKIE, HeaderValue::from_str(&v).unwrap());
        assert_eq!(session_id(&h).as_deref(), Some(ID));
        // What the old cookie held (the hex of a token) and junk are refused.
        for bad in ["cp_session=zz", "cp_session=6370615f61", "cp_session="] {
            h.insert(header::COOKIE, HeaderValue::from_static(bad));
            assert_eq!(session_id(&h), None, "{bad}");
        }
    }

    #[test]
    fn the_session_cookie_is_secure_only_over_https() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        let plain = session_cookie(&h, Some(ID));
        assert!(plain.starts_with(&format!("{COOKIE}={ID}")));
        assert!(
            plain.contains(&format!("Max-Age={}", SESSION_LIFETIME.as_secs())),
            "{plain}"
        );
        assert!(!plain.contains("Secure"), "{plain}");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://cp.example"),
        );
        assert!(session_cookie(&h, Some(ID)).ends_with("; Secure"));
        h.remove(header::ORIGIN);
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let cleared = session_cookie(&h, None);
        assert!(cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"));
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
