//! The portal (ADR 0049): what an account's own customers see through a
//! portal link, at `/portal`. A link (`/portal/{token}`) shows a page
//! whose button redeems it, once, so that a link preview that fetches it
//! burns nothing; the redemption starts a session kept like the
//! operator's (the store keeps its id's hash; its token hash is the
//! link's), in a cookie of its own scoped to `/portal`. Every request of
//! that session finds its link again: a revoked or expired link ends it.
//! A session reaches the link's account, only the link's endpoints when
//! it names some, and no operator page (those read their own cookie).

mod actions;
mod frame;
mod pages;

use std::sync::Arc;

use api::auth::{generate_token, hash_token};
use api::limiter::ClientAddr;
use api::{ApiError, ApiState};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use control_plane_core::{EndpointId, PortalLink, PortalRole, SessionCreateRequest};
use maud::html;

use crate::layout::{answer, portal_page};
use crate::session::{
    check_csrf, renew, same_origin, session_cookie, stored_session, CsrfForm, Posted,
    SignInFailures, ZoneForm, PORTAL, SESSION_IDLE,
};
use crate::{DashboardConfig, UiError};

pub use frame::FrameAncestors;

/// The portal's routes.
pub(crate) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route(
            "/portal",
            get(|| async { Redirect::to("/portal/endpoints") }),
        )
        .route("/portal/logout", post(logout))
        .route("/portal/zone", post(zone))
        .route(
            "/portal/endpoints",
            get(pages::endpoints).post(actions::endpoint_add),
        )
        .route("/portal/endpoints/new", get(actions::endpoint_new))
        .route("/portal/endpoints/{id}", get(pages::endpoint))
        .route("/portal/endpoints/{id}/edit", post(actions::endpoint_edit))
        .route(
            "/portal/endpoints/{id}/{action}",
            post(actions::endpoint_action),
        )
        .route("/portal/event-types", get(pages::event_types))
        .route("/portal/deliveries", get(pages::deliveries))
        .route("/portal/deliveries/{id}", get(pages::delivery))
        .route("/portal/deliveries/{id}/replay", post(actions::replay))
        .route("/portal/attempts", get(pages::attempts))
        .route("/portal/{token}", get(confirm).post(redeem))
}

/// A signed-in portal session: its link, as found at this request, and
/// its CSRF token.
pub(crate) struct PortalSession {
    pub(crate) link: PortalLink,
    pub(crate) csrf: String,
    id_hash: String,
}

impl PortalSession {
    /// `Ok` for a manager's session; `403` for a viewer's.
    pub(crate) fn manager(&self) -> Result<(), UiError> {
        match self.link.role {
            PortalRole::Manager => Ok(()),
            PortalRole::Viewer => Err(UiError(ApiError::forbidden(
                "this portal link lets you view only: ask for a manager's link to change anything",
            ))),
        }
    }

    /// Endpoint `id` of the path when the link shows it; `404` otherwise,
    /// as for an endpoint that does not exist.
    pub(crate) fn endpoint(&self, id: &str) -> Result<EndpointId, UiError> {
        id.parse()
            .ok()
            .filter(|id| self.link.shows(*id))
            .ok_or_else(|| UiError(ApiError::not_found("endpoint")))
    }
}

/// The page of a session that has ended (or never was): `401`, with the
/// session's cookie cleared.
fn ended(headers: &HeaderMap, framed: bool) -> Response {
    let body = html! {
        p.error id="ended" {
            "This portal session has ended: its link was revoked, it expired, or you signed out. \
             Ask for a new link."
        }
    };
    let mut r = (
        StatusCode::UNAUTHORIZED,
        answer(portal_page("Signed out", None, None, &body)),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(headers, PORTAL, None, framed)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// Whether the portal's cookie is to be sent inside another site's frame.
fn framed(parts: &Parts) -> bool {
    parts
        .extensions
        .get::<Arc<DashboardConfig>>()
        .is_some_and(|c| !c.portal_frame_ancestors.is_none())
}

impl FromRequestParts<Arc<ApiState>> for PortalSession {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let framed = framed(parts);
        let (stored, id_hash) = stored_session(&parts.headers, state, PORTAL)
            .await
            .map_err(IntoResponse::into_response)?
            .ok_or_else(|| ended(&parts.headers, framed))?;
        let found = state
            .store()
            .portal_link_find(&stored.token_hash)
            .await
            .map_err(|e| UiError::from(e).into_response())?;
        match found {
            Some(link) => {
                renew(state, &stored, &id_hash, Some(link.expires_at))
                    .await
                    .map_err(IntoResponse::into_response)?;
                Ok(PortalSession {
                    link,
                    csrf: stored.csrf,
                    id_hash,
                })
            }
            // Revoked or expired (or not a portal session at all): it ends.
            None => {
                let _ = state.store().session_end(&id_hash).await;
                Err(ended(&parts.headers, framed))
            }
        }
    }
}

/// An action posted from a portal page: from this site, with the
/// session's CSRF token, checked in that order before the handler runs.
pub(crate) struct PortalAction<F> {
    pub(crate) session: PortalSession,
    pub(crate) form: F,
}

impl<F: Posted> FromRequest<Arc<ApiState>> for PortalAction<F> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<ApiState>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let session = PortalSession::from_request_parts(&mut parts, state).await?;
        let headers = parts.headers.clone();
        let Form(form) = Form::<F>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        same_origin(&headers)
            .and_then(|()| check_csrf(&session.csrf, form.csrf()))
            .map_err(IntoResponse::into_response)?;
        Ok(PortalAction { session, form })
    }
}

/// Keeps the zone the portal's viewer named, as the operator's form does
/// (`crate::session::set_zone`), and goes back to the portal page.
async fn zone(
    headers: HeaderMap,
    PortalAction { form, .. }: PortalAction<ZoneForm>,
) -> Result<Response, UiError> {
    crate::session::zone_set(&headers, &form, "/portal")
}

/// Whether `token` has the shape of a portal link's token: `cpp_` and 64
/// hex digits (anything else is refused without a store read).
fn may_be_link(token: &str) -> bool {
    token
        .strip_prefix("cpp_")
        .is_some_and(|rest| rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The page of a link that opens nothing (`410`).
fn spent() -> UiError {
    UiError(ApiError::new(
        StatusCode::GONE,
        "this portal link was already used, has expired or was revoked: ask for a new one",
    ))
}

/// Refuses a client address past its failed redemptions (`429`), as the
/// operator's sign-in does.
fn limited(failures: &SignInFailures, addr: std::net::IpAddr) -> Result<(), UiError> {
    match failures.0.check(addr, std::time::Instant::now()) {
        Ok(()) => Ok(()),
        Err(wait) => Err(UiError(ApiError::too_many(
            "too many portal links that open nothing from this address: wait a minute",
            wait,
        ))),
    }
}

/// `/portal/{token}`: a page whose button redeems the link. Reading it
/// (a link preview, a mail scanner) changes nothing.
async fn confirm(
    State(s): State<Arc<ApiState>>,
    Extension(failures): Extension<Arc<SignInFailures>>,
    ClientAddr(addr): ClientAddr,
    Path(token): Path<String>,
) -> Result<Response, UiError> {
    limited(&failures, addr)?;
    let found = if may_be_link(&token) {
        s.store().portal_link_find(&hash_token(&token)).await?
    } else {
        None
    };
    let Some(link) = found.filter(|l| l.redeemed_at.is_none()) else {
        failures.0.failed(addr, std::time::Instant::now());
        return Err(spent());
    };
    let body = html! {
        p { "This link opens the webhook portal of " strong { (link.account.as_str()) }
            " as a " strong id="role" { (link.role.as_str()) } ", once." }
        form method="post" action={ "/portal/" (token) } {
            button type="submit" id="open" { "Open the portal" }
        }
    };
    Ok(answer(portal_page("Webhook portal", None, None, &body)))
}

/// Redeems the link of the path, once, and starts its session.
async fn redeem(
    State(s): State<Arc<ApiState>>,
    Extension(failures): Extension<Arc<SignInFailures>>,
    Extension(config): Extension<Arc<DashboardConfig>>,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    limited(&failures, addr)?;
    let token_hash = hash_token(&token);
    let redeemed = if may_be_link(&token) {
        s.store().portal_link_redeem(&token_hash).await?
    } else {
        None
    };
    let Some(link) = redeemed else {
        failures.0.failed(addr, std::time::Instant::now());
        return Err(spent());
    };
    let left = link.expires_at.as_millis() - s.now().as_millis();
    let life = std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0).max(1));
    let id = generate_token("");
    let req = SessionCreateRequest::new(
        hash_token(&id),
        token_hash,
        generate_token(""),
        life.min(SESSION_IDLE),
    )?;
    s.store().session_create(req).await?;
    let framed = !config.portal_frame_ancestors.is_none();
    let mut r = Redirect::to("/portal/endpoints").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, PORTAL, Some(&id), framed)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// Ends the portal session and clears its cookie.
async fn logout(
    State(s): State<Arc<ApiState>>,
    Extension(config): Extension<Arc<DashboardConfig>>,
    headers: HeaderMap,
    PortalAction { session, .. }: PortalAction<CsrfForm>,
) -> Result<Response, UiError> {
    s.store().session_end(&session.id_hash).await?;
    Ok(ended(&headers, !config.portal_frame_ancestors.is_none()))
}
