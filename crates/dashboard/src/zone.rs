//! The viewer's time zone. The pages run no script, so they cannot learn
//! it from the browser: the viewer names it once (an IANA name such as
//! `Europe/Berlin`, in the form at the foot of every operator page), a
//! cookie keeps it, and every absolute time on the pages is written in it
//! (UTC until then). Relative times ("in 4 min") do not depend on it.

use std::sync::Arc;

use api::{ApiError, ApiState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use control_plane_core::Timestamp;
use jiff::tz::TimeZone;
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::csrf_field;
use crate::session::{check_csrf, same_origin, Session};
use crate::UiError;

/// The cookie that keeps the viewer's zone, sent to every page.
const COOKIE: &str = "cp_zone";

/// The request being answered: the viewer's zone, and the page (path and
/// query) the zone form comes back to.
#[derive(Clone)]
struct Viewer {
    zone: TimeZone,
    page: String,
}

tokio::task_local! {
    static VIEWER: Viewer;
}

/// Answers the request in the zone its cookie names (UTC without one, or
/// with a name the time zone database does not know).
pub(crate) async fn in_viewers_zone(req: Request<Body>, next: Next) -> Response {
    let zone = named(req.headers())
        .and_then(|name| TimeZone::get(&name).ok())
        .unwrap_or(TimeZone::UTC);
    let page = req
        .uri()
        .path_and_query()
        .map_or("/ui", |p| p.as_str())
        .to_string();
    VIEWER.scope(Viewer { zone, page }, next.run(req)).await
}

/// The viewer's zone, UTC outside a request.
fn zone() -> TimeZone {
    VIEWER.try_with(|v| v.zone.clone()).unwrap_or(TimeZone::UTC)
}

/// The zone name the request's cookie holds.
fn named(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .map(|v| v.replace("%2F", "/"))
        .next()
}

/// `t` in the viewer's zone: `2026-11-30 09:43:48Z` in UTC,
/// `2026-11-30 10:43:48 CET` elsewhere.
pub(crate) fn local(t: Timestamp) -> String {
    let utc = || {
        let s = t.to_rfc3339();
        match (s.get(..10), s.get(11..19)) {
            (Some(day), Some(clock)) => format!("{day} {clock}Z"),
            _ => s,
        }
    };
    let zone = zone();
    if zone.iana_name() == Some("UTC") {
        return utc();
    }
    match jiff::Timestamp::from_millisecond(t.as_millis()) {
        Ok(at) => at
            .to_zoned(zone)
            .strftime("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        Err(_) => utc(),
    }
}

/// The form at the foot of an operator page that sets the zone, coming
/// back to the page.
pub(crate) fn form(csrf: &str) -> Markup {
    let current = zone().iana_name().unwrap_or("UTC").to_string();
    let back = VIEWER
        .try_with(|v| v.page.clone())
        .unwrap_or_else(|_| "/ui".into());
    html! {
        form.inline.zone method="post" action="/ui/zone" id="zone" {
            (csrf_field(csrf))
            input type="hidden" name="back" value=(back);
            label for="zone-name" { "Times in" }
            input id="zone-name" name="zone" value=(current) size="18"
                placeholder="Europe/Berlin";
            button type="submit" id="set-zone" { "Set" }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct ZoneForm {
    csrf: String,
    zone: String,
    back: String,
}

/// Keeps the zone the viewer named (a name of the time zone database, or
/// `UTC`) and goes back to the page the form was on.
pub(crate) async fn set(
    State(_): State<Arc<ApiState>>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<ZoneForm>,
) -> Result<Response, UiError> {
    same_origin(&headers)?;
    check_csrf(&session.csrf, &form.csrf)?;
    let name = form.zone.trim();
    let zone = TimeZone::get(name).map_err(|_| {
        ApiError::bad_request(format!(
            "time zone: {name:?} is not a name of the time zone database (like Europe/Berlin, \
             America/New_York or UTC)"
        ))
    })?;
    let name = zone.iana_name().unwrap_or("UTC");
    // Back to an operator page only: never to another site.
    let back = if form.back.starts_with("/ui") && !form.back.starts_with("//") {
        form.back.as_str()
    } else {
        "/ui"
    };
    let mut r = Redirect::to(back).into_response();
    let cookie = format!(
        "{COOKIE}={}; Path=/; Max-Age=31536000; SameSite=Lax",
        name.replace('/', "%2F")
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}
