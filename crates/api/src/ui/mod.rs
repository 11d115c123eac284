//! The operator's web dashboard at `/ui`: server-rendered HTML over the same
//! port as the API, no script at all.
//!
//! Sign-in takes the admin token or an account key and keeps it in an
//! `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui` (also `Secure` when
//! the browser came over HTTPS); the key reaches what
//! it reaches through the API (an account key only its own account, `404`
//! elsewhere). Every form that changes something carries a CSRF token
//! derived from the session (a hash no other site can compute) and every
//! `POST` must come from this origin. Every answer carries a strict
//! Content-Security-Policy: no script, styles only from `/ui/app.css`.

mod html;
mod pages;

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
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use control_plane_core::AccountId;

use crate::auth::{caller_for_token, Caller};
use crate::error::ApiError;
use crate::ApiState;

const COOKIE: &str = "cp_session";

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
        .route("/ui/a/{account}/deliveries", get(pages::deliveries))
        .route("/ui/a/{account}/deliveries/{id}", get(pages::delivery))
        .route(
            "/ui/a/{account}/deliveries/{id}/replay",
            post(pages::delivery_replay),
        )
        .route("/ui/a/{account}/dead", get(pages::dead))
        .route("/ui/a/{account}/dead/replay", post(pages::dead_replay))
        .route("/ui/a/{account}/tasks", get(pages::tasks))
        .route("/ui/a/{account}/tasks/{id}/retry", post(pages::task_retry))
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

/// A signed-in operator: who they are and the CSRF token of their session.
pub(crate) struct Session {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
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

/// The CSRF token of a session: a hash of its token, so only a page this
/// service rendered for that session holds it.
fn csrf_of(token: &str) -> String {
    let d = Sha256::digest(format!("control-plane dashboard csrf\n{token}").as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The session token from the cookie (hex, so any admin token fits a cookie).
fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .find_map(from_hex)
}

fn to_hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) || s.len() > 512 {
        return None;
    }
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl FromRequestParts<Arc<ApiState>> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/ui/login").into_response();
        let token = session_token(&parts.headers).ok_or_else(to_login)?;
        match caller_for_token(state, &token).await {
            Ok(Some(caller)) => Ok(Session {
                caller,
                csrf: csrf_of(&token),
            }),
            Ok(None) => Err(to_login()),
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
            status, message, ..
        } = self.0;
        let body = format!(
            "<p class=\"error\" id=\"error\">{}</p><p><a href=\"/ui\">Back to the start</a></p>",
            html::esc(&message)
        );
        let title = status.canonical_reason().unwrap_or("Error");
        (status, Html(html::page(title, None, None, &body))).into_response()
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

/// Checks the token and sets the session cookie.
async fn login(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    let token = form.token.trim();
    if token.is_empty() || token.len() > control_plane_core::config::MAX_TOKEN_BYTES {
        return Ok((StatusCode::UNAUTHORIZED, Html(login_page(true))).into_response());
    }
    match caller_for_token(&state, token).await? {
        Some(_) => {
            let mut r = Redirect::to("/ui").into_response();
            if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, Some(token))) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            Ok(r)
        }
        None => Ok((StatusCode::UNAUTHORIZED, Html(login_page(true))).into_response()),
    }
}

#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    pub(crate) csrf: String,
}

/// Clears the session cookie.
async fn logout(
    session: Session,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    session.check_csrf(&form.csrf)?;
    let mut r = Redirect::to("/ui/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, None)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The `Set-Cookie` value of a session holding `token` (`None` clears it).
/// It is `Secure` when the browser reached the service over HTTPS (its
/// `Origin`, or a proxy's `X-Forwarded-Proto`), so that such a session is
/// never sent in clear; over plain HTTP (the local quickstart) a browser
/// would refuse a `Secure` cookie.
fn session_cookie(headers: &HeaderMap, token: Option<&str>) -> String {
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
    match token {
        Some(token) => format!(
            "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict{secure}",
            to_hex(token)
        ),
        None => format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_round_trips_any_token() {
        let token = "odd; token=with spaces,and\"quotes";
        let mut h = HeaderMap::new();
        let v = format!("other=1; {COOKIE}={}; x=y", to_hex(token));
        h.insert(header::COOKIE, HeaderValue::from_str(&v).unwrap());
        assert_eq!(session_token(&h).as_deref(), Some(token));
        h.insert(header::COOKIE, HeaderValue::from_static("cp_session=zz"));
        assert_eq!(session_token(&h), None);
    }

    #[test]
    fn the_session_cookie_is_secure_only_over_https() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        let plain = session_cookie(&h, Some("t"));
        assert!(plain.starts_with(&format!("{COOKIE}={}", to_hex("t"))));
        assert!(!plain.contains("Secure"), "{plain}");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://cp.example"),
        );
        assert!(session_cookie(&h, Some("t")).ends_with("; Secure"));
        h.remove(header::ORIGIN);
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let cleared = session_cookie(&h, None);
        assert!(cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"));
    }

    #[test]
    fn csrf_tokens_differ_by_session() {
        assert_ne!(csrf_of("a"), csrf_of("b"));
        assert_eq!(csrf_of("a"), csrf_of("a"));
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
