//! The operator's web dashboard at `/ui`: server-rendered HTML, no script
//! at all, served beside the API (`api::router(.., dashboard::router())`)
//! on the same state.
//!
//! Each page reads through the API's query layer (`api::query`) and renders
//! what it got with a typed template (maud, `src/layout.rs`): a value a user
//! controls is escaped wherever a template puts it.
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
//! origin. Failed sign-ins are limited per client address
//! ([`SIGN_IN_FAILURES`]). Every answer carries a strict
//! Content-Security-Policy: no script, styles only from `/ui/app.css`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod alerts;
mod attempts;
mod catalogue;
mod cookie;
mod dead;
mod deliveries;
mod endpoint;
mod layout;
mod links;
mod pages;
mod portal;
mod reason;
mod recover;
mod session;
mod tasks;
mod zone;

use std::sync::Arc;

use api::{ApiError, ApiState};
use axum::body::Body;
use axum::http::{header, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use maud::html;

pub use portal::FrameAncestors;
pub use session::{SESSION_IDLE, SESSION_LIFETIME, SIGN_IN_FAILURES, SIGN_IN_WINDOW};

/// How the dashboard and the portal run.
#[derive(Clone, Debug, Default)]
pub struct DashboardConfig {
    /// Which sites may frame the portal's pages
    /// (`CONTROLPLANE_PORTAL_FRAME_ANCESTORS`); none by default. The
    /// operator's pages are never framed.
    pub portal_frame_ancestors: FrameAncestors,
}

/// The dashboard's routes (and the portal's), to serve beside the API's
/// (`api::router`), with the defaults.
pub fn router() -> Router<Arc<ApiState>> {
    router_with(DashboardConfig::default())
}

/// [`router`] with `config`.
pub fn router_with(config: DashboardConfig) -> Router<Arc<ApiState>> {
    let config = Arc::new(config);
    Router::new()
        .route("/ui", get(pages::home))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/app.css", get(stylesheet))
        .route("/ui/login", get(session::login_form).post(session::login))
        .route("/ui/logout", post(session::logout))
        .route("/ui/zone", post(session::set_zone))
        .route("/ui/a/{account}", get(pages::overview))
        .route("/ui/a/{account}/endpoints", get(pages::endpoints))
        .route("/ui/a/{account}/endpoints/{id}", get(endpoint::page_of))
        .route(
            "/ui/a/{account}/endpoints/{id}/recover",
            post(recover::recover),
        )
        .route(
            "/ui/a/{account}/endpoints/{id}/enable",
            post(endpoint::enable),
        )
        .route(
            "/ui/a/{account}/endpoints/{id}/disable",
            post(endpoint::disable),
        )
        .route(
            "/ui/a/{account}/endpoints/{id}/rotate-secret",
            post(endpoint::rotate),
        )
        .route(
            "/ui/a/{account}/endpoints/{id}/send-example",
            post(endpoint::send_example),
        )
        .route("/ui/a/{account}/event-types", get(catalogue::page))
        .route(
            "/ui/a/{account}/event-types/{name}/send-example",
            post(catalogue::send_example),
        )
        .route("/ui/a/{account}/deliveries", get(deliveries::deliveries))
        .route("/ui/a/{account}/deliveries/{id}", get(deliveries::delivery))
        .route(
            "/ui/a/{account}/deliveries/{id}/{action}",
            post(deliveries::delivery_action),
        )
        .route("/ui/a/{account}/attempts", get(attempts::page))
        .route("/ui/a/{account}/alerts", get(alerts::page))
        .route("/ui/a/{account}/dead", get(dead::dead))
        .route("/ui/a/{account}/dead/replay", post(dead::dead_replay))
        .route("/ui/a/{account}/portal-links", get(links::page))
        .route(
            "/ui/a/{account}/portal-links/{id}/revoke",
            post(links::revoke),
        )
        .route("/ui/a/{account}/tasks", get(tasks::tasks))
        .route("/ui/a/{account}/tasks/{id}/retry", post(tasks::task_retry))
        .route("/ui/a/{account}/{*rest}", get(not_found))
        .merge(portal::routes())
        .layer(Extension(Arc::new(session::SignInFailures::new())))
        .layer(Extension(config.clone()))
        .layer(axum::middleware::from_fn(error_nav))
        .layer(axum::middleware::from_fn(zone::in_viewers_zone))
        .layer(axum::middleware::from_fn_with_state(config, secure_headers))
}

/// Headers on every dashboard answer: the CSP, no framing (the portal's
/// pages by the sites of `CONTROLPLANE_PORTAL_FRAME_ANCESTORS` only), no
/// sniffing, no caching of pages that show account data, no referrer
/// leaving the site (`no-referrer` would make browsers send `Origin: null`
/// with our own forms, which the same-origin check refuses).
async fn secure_headers(
    axum::extract::State(config): axum::extract::State<Arc<DashboardConfig>>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let framed =
        req.uri().path().starts_with("/portal") && !config.portal_frame_ancestors.is_none();
    let mut r = next.run(req).await;
    let ancestors = if framed {
        config.portal_frame_ancestors.as_str()
    } else {
        "'none'"
    };
    let csp = format!(
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
         frame-ancestors {ancestors}; base-uri 'none'"
    );
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    // X-Frame-Options names no site: it goes where the CSP lets sites frame.
    if !framed {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
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

/// A path of an account that names no page: a page with a way back, not a
/// bare error.
async fn not_found() -> Response {
    UiError(ApiError::not_found("page")).into_response()
}

/// An error page's title and message, kept on its answer so that
/// [`error_nav`] can frame it with the account's tabs.
#[derive(Clone)]
struct ErrorNote {
    title: String,
    message: String,
}

/// Frames an error page of an account's path (`/ui/a/{account}/...`) with
/// that account's tabs, so that a bad filter or a typo leads back to a
/// page with navigation. The tabs are links only: they show nothing of the
/// account, whose pages still check the session's reach.
async fn error_nav(req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    let Some(note) = r.extensions().get::<ErrorNote>().cloned() else {
        return r;
    };
    if path.starts_with("/portal") {
        // The portal's errors lead back to the portal, never to /ui.
        let (mut parts, _) = r.into_parts();
        let body = layout::portal_page(
            &note.title,
            None,
            None,
            &error_body(&note.message, "/portal"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(body.into_string()));
    }
    let Some(rest) = path.strip_prefix("/ui/a/") else {
        return r;
    };
    let (name, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    let Ok(account) = control_plane_core::AccountId::new(name.as_ref()) else {
        return r;
    };
    let (mut parts, _) = r.into_parts();
    let body = layout::page(
        &note.title,
        Some((&account, layout::Tab::of_path(tail))),
        None,
        &error_body(&note.message, &layout::base(&account)),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.into_string()))
}

/// The body of an error page: the message and a way back.
fn error_body(message: &str, back: &str) -> maud::Markup {
    html! {
        p.error id="error" { (message) }
        p { a href=(back) id="back" { "Back to the start" } }
    }
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("app.css"),
    )
}

/// What a page handler answers.
type Page = Result<Response, UiError>;

/// The dashboard's handlers' state: the API's.
pub(crate) type Shared = axum::extract::State<Arc<ApiState>>;

/// A redirect to `to` (after an action).
pub(crate) fn to(to: &str) -> Page {
    Ok(Redirect::to(to).into_response())
}

/// The `{id}` of an item's path (its `{account}` is checked by
/// `AccountPage` or `Action`).
#[derive(serde::Deserialize)]
pub(crate) struct ItemPath {
    pub(crate) id: String,
}

/// An error shown as a page (with the status the API would answer).
struct UiError(ApiError);

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
        let body = error_body(&message, "/ui");
        let title = status.canonical_reason().unwrap_or("Error");
        let mut r = (
            status,
            layout::answer(layout::page(title, None, None, &body)),
        )
            .into_response();
        r.extensions_mut().insert(ErrorNote {
            title: title.to_string(),
            message,
        });
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
