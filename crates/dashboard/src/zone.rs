//! The viewer's time zone. The pages run no script, so they cannot learn
//! it from the browser: the viewer names it once (an IANA name such as
//! `Europe/Berlin`, in the form at the foot of every operator page), a
//! cookie keeps it, and every absolute time on the pages is written in it
//! (UTC until then). Relative times ("in 4 min") do not depend on it.

use axum::body::Body;
use axum::http::{HeaderMap, Request};
use axum::middleware::Next;
use axum::response::Response;
use control_plane_core::Timestamp;
use jiff::tz::TimeZone;
use maud::{html, Markup};

/// The cookie that keeps the viewer's zone, sent to every page; set by
/// `session::set_zone`.
pub(crate) const COOKIE: &str = "cp_zone";

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
    crate::cookie::values(headers, COOKIE)
        .next()
        .map(|v| v.replace("%2F", "/"))
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

/// The zone named `name` in the time zone database, with its canonical
/// name (what the cookie keeps).
pub(crate) fn named_zone(name: &str) -> Option<(TimeZone, String)> {
    let zone = TimeZone::get(name).ok()?;
    let canonical = zone.iana_name().unwrap_or("UTC").to_string();
    Some((zone, canonical))
}

/// The form at the foot of a page under `home` (`/ui` for the operator's,
/// `/portal` for the portal's) that sets the zone, coming back to the page.
pub(crate) fn form(csrf: &str, home: &str) -> Markup {
    let current = zone().iana_name().unwrap_or("UTC").to_string();
    let back = VIEWER
        .try_with(|v| v.page.clone())
        .unwrap_or_else(|_| home.into());
    html! {
        form.inline.zone method="post" action={ (home) "/zone" } id="zone" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="back" value=(back);
            label for="zone-name" { "Times in" }
            input id="zone-name" name="zone" value=(current) size="18"
                placeholder="Europe/Berlin";
            button type="submit" id="set-zone" { "Set" }
        }
    }
}
