//! The page frame and the small pieces pages share, as maud templates.
//!
//! Every value spliced into a template is escaped by maud unless it is
//! already [`Markup`]; a template cannot put a user's string into a page
//! unescaped, and no code of this crate builds markup any other way
//! (`tests/architecture.rs` checks that this crate never writes
//! maud's pre-escaped wrapper). URL path segments go through [`segment`].

use axum::response::{Html, IntoResponse, Response};
use control_plane_core::{AccountId, Alert, Timestamp};
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::reason::Why;

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `s` as one URL path segment (percent-encoded beyond the unreserved set).
pub(crate) fn segment(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// A time to the second in the viewer's zone (`crate::zone`):
/// `2026-11-30 09:43:48Z` in UTC.
pub(crate) fn time(t: Timestamp) -> String {
    crate::zone::local(t)
}

/// How long ago (or how soon) `t` is from `now`, as a person says it:
/// `now`, `12 s ago`, `in 4 min`, `3 h ago`, `2 d ago`.
pub(crate) fn relative(t: Timestamp, now: Timestamp) -> String {
    let ms = t.as_millis() - now.as_millis();
    let s = ms.unsigned_abs() / 1000;
    let amount = match s {
        0..=4 => return "now".into(),
        5..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    };
    if ms > 0 {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// A time relative to `now` with the absolute time beside it (in the
/// viewer's zone, `crate::zone`) and in its `datetime` (UTC).
pub(crate) fn when(t: Timestamp, now: Timestamp) -> Markup {
    html! {
        span.when {
            time datetime=(t.to_rfc3339()) title=(time(t)) { (relative(t, now)) }
            " " small.abs { (time(t)) }
        }
    }
}

/// An id shown short (the rest clipped by the stylesheet, so that copying
/// it copies it whole), the full id on hover; a link when `href` is given.
pub(crate) fn id_cell(id: &str, href: Option<&str>) -> Markup {
    html! {
        @match href {
            Some(h) => { a.id href=(h) title=(id) { (id) } }
            None => { span.id title=(id) { (id) } }
        }
    }
}

/// A delivery's state: a badge whose colour and weight follow its tone,
/// with the word in it and why beside it (never colour alone).
pub(crate) fn state(why: &Why, now: Timestamp) -> Markup {
    html! {
        span class=(why.tone.class()) { (why.label) }
        @if !why.text.is_empty() || why.until.is_some() {
            " " span.why {
                (why.text)
                @if let Some(t) = why.until { " " (when(t, now)) }
            }
        }
    }
}

/// The dashboard page of endpoint `id` of `account`.
pub(crate) fn endpoint_href(account: &AccountId, id: &str) -> String {
    format!("{}/endpoints/{}", base(account), segment(id))
}

/// The account's base path in the dashboard.
pub(crate) fn base(account: &AccountId) -> String {
    format!("/ui/a/{}", segment(account.as_str()))
}

/// A page as an answer.
pub(crate) fn answer(page: Markup) -> Response {
    Html(page.into_string()).into_response()
}

/// Which section of an account a page belongs to (its tab is marked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tab {
    Overview,
    Endpoints,
    EventTypes,
    Deliveries,
    Attempts,
    Dead,
    Alerts,
    Tasks,
}

impl Tab {
    /// The tab of an account's path below its base (`endpoints/…` is
    /// Endpoints); the overview for anything else.
    pub(crate) fn of_path(rest: &str) -> Tab {
        let first = rest.split('/').next().unwrap_or("");
        TABS.iter()
            .find(|(_, p, _)| !p.is_empty() && p.trim_start_matches('/') == first)
            .map_or(Tab::Overview, |(t, _, _)| *t)
    }
}

const TABS: [(Tab, &str, &str); 8] = [
    (Tab::Overview, "", "Overview"),
    (Tab::Endpoints, "/endpoints", "Endpoints"),
    (Tab::EventTypes, "/event-types", "Event types"),
    (Tab::Deliveries, "/deliveries", "Deliveries"),
    (Tab::Attempts, "/attempts", "Attempts"),
    (Tab::Dead, "/dead", "Dead letters"),
    (Tab::Alerts, "/alerts", "Alerts"),
    (Tab::Tasks, "/tasks", "Tasks"),
];

/// A whole page: the frame, the account's tabs (when in an account), a
/// sign-out button when signed in (`csrf`), and `body`.
pub(crate) fn page(
    title: &str,
    account: Option<(&AccountId, Tab)>,
    csrf: Option<&str>,
    body: &Markup,
) -> Markup {
    page_refreshing(title, account, csrf, body, None)
}

/// [`page`], reloaded by the browser every `refresh` seconds when given
/// (a `meta` refresh: the page runs no script).
pub(crate) fn page_refreshing(
    title: &str,
    account: Option<(&AccountId, Tab)>,
    csrf: Option<&str>,
    body: &Markup,
    refresh: Option<u32>,
) -> Markup {
    let nav = html! {
        @if let Some((account, active)) = account {
            span.account { (account.as_str()) }
            @for (tab, path, label) in TABS {
                a href={ (base(account)) (path) }
                    class=[(tab == active).then_some("active")] { (label) }
            }
        }
    };
    let frame = Frame {
        home: "/ui",
        nav,
        sign_out: csrf.map(|c| ("/ui/logout", c)),
        refresh,
    };
    frame.page(title, body)
}

/// A section of the portal (ADR 0049).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortalTab {
    Endpoints,
    EventTypes,
    Deliveries,
    Attempts,
}

const PORTAL_TABS: [(PortalTab, &str, &str); 4] = [
    (PortalTab::Endpoints, "/portal/endpoints", "Endpoints"),
    (PortalTab::EventTypes, "/portal/event-types", "Event types"),
    (PortalTab::Deliveries, "/portal/deliveries", "Deliveries"),
    (PortalTab::Attempts, "/portal/attempts", "Attempts"),
];

/// A whole page of the portal: the frame, the portal's tabs and a
/// sign-out button when in a session (`csrf`), and `body`. The operator's
/// pages are not linked from it.
pub(crate) fn portal_page(
    title: &str,
    active: Option<PortalTab>,
    csrf: Option<&str>,
    body: &Markup,
) -> Markup {
    let nav = html! {
        @if csrf.is_some() {
            @for (tab, path, label) in PORTAL_TABS {
                a href=(path) class=[(Some(tab) == active).then_some("active")] { (label) }
            }
        }
    };
    let frame = Frame {
        home: "/portal",
        nav,
        sign_out: csrf.map(|c| ("/portal/logout", c)),
        refresh: None,
    };
    frame.page(title, body)
}

/// What frames a page: where the brand leads, the navigation, the sign-out
/// form (its action and the session's CSRF token) and a refresh.
struct Frame<'a> {
    home: &'a str,
    nav: Markup,
    sign_out: Option<(&'a str, &'a str)>,
    refresh: Option<u32>,
}

impl Frame<'_> {
    fn page(&self, title: &str, body: &Markup) -> Markup {
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    meta name="color-scheme" content="light dark";
                    @if let Some(r) = self.refresh {
                        meta http-equiv="refresh" content=(r);
                    }
                    title { (title) " · control-plane" }
                    link rel="stylesheet" href="/ui/app.css";
                }
                body {
                    header {
                        a.brand href=(self.home) { "control-plane" }
                        nav { (self.nav) }
                        @if let Some((action, csrf)) = self.sign_out {
                            form.signout method="post" action=(action) {
                                (csrf_field(csrf))
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                    main {
                        h1 { (title) }
                        (body)
                    }
                    @if let Some((_, csrf)) = self.sign_out {
                        footer { (crate::zone::form(csrf, self.home)) }
                    }
                }
            }
        }
    }
}

/// The hidden field every form that changes something carries.
pub(crate) fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

/// A one-button form posting to `action`.
pub(crate) fn button(action: &str, csrf: &str, label: &str, id: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            (csrf_field(csrf))
            button type="submit" id=(id) { (label) }
        }
    }
}

/// A table from a header row and rows of cells; `empty` stands in for a
/// table without rows. A table wider than the screen scrolls in its own
/// box, never the page.
pub(crate) fn table(id: &str, head: &[&str], rows: &[Vec<Markup>], empty: &str) -> Markup {
    html! {
        @if rows.is_empty() {
            p.empty id=(id) { (empty) }
        } @else {
            div.scroll {
                table id=(id) {
                    thead { tr { @for h in head { th { (h) } } } }
                    tbody {
                        @for row in rows {
                            tr { @for cell in row { td { (cell) } } }
                        }
                    }
                }
            }
        }
    }
}

/// A bar chart of `values` as inline SVG (no script, no inline style, so the
/// page's Content-Security-Policy holds); `label` is its accessible name.
pub(crate) fn bars(label: &str, values: &[u64]) -> Markup {
    const W: u64 = 6;
    const H: u64 = 40;
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let width = W * u64::try_from(values.len()).unwrap_or(0).max(1);
    let bar = |i: usize, v: u64| {
        let h = (v * H / max).max(u64::from(v > 0));
        (W * u64::try_from(i).unwrap_or(0), H - h, h)
    };
    html! {
        svg.chart role="img" aria-label=(label) width=(width) height=(H) preserveAspectRatio="none"
            viewBox={ "0 0 " (width) " " (H) } {
            @for (i, v) in values.iter().enumerate() {
                @let (x, y, h) = bar(i, *v);
                rect x=(x) y=(y) width=(W - 1) height=(h) { title { (v) } }
            }
        }
    }
}

/// Alerts with links to the endpoint and delivery each names.
pub(crate) fn alerts_table(
    account: &AccountId,
    alerts: &[Alert],
    now: Timestamp,
    empty: &str,
) -> Markup {
    let root = base(account);
    let rows: Vec<Vec<Markup>> = alerts
        .iter()
        .map(|a| {
            let endpoint = a.endpoint_id.to_string();
            vec![
                when(a.created_at, now),
                html! { span.nowrap { (a.kind.as_str()) } },
                id_cell(&endpoint, Some(&endpoint_href(account, &endpoint))),
                match a.delivery_id {
                    Some(d) => id_cell(&d.to_string(), Some(&format!("{root}/deliveries/{d}"))),
                    None => html! {},
                },
                html! { (a.message) },
            ]
        })
        .collect();
    table(
        "alerts",
        &["when", "kind", "endpoint", "delivery", "message"],
        &rows,
        empty,
    )
}

/// A link to `href` showing `text`.
pub(crate) fn link(href: &str, text: &str) -> Markup {
    html! { a href=(href) { (text) } }
}

/// A short notice (after an action).
pub(crate) fn notice(text: &str) -> Markup {
    html! { p.notice id="notice" { (text) } }
}

/// The "next page" link of a listing at `path` (`extra` is more of its
/// query string), when there is a next page.
pub(crate) fn next_link(path: &str, extra: &str, next: Option<i64>) -> Markup {
    pager(path, extra, At::default(), 0, next)
}

/// Where a page of a keyset-paginated listing is: its cursor and the
/// cursors of the pages before it (`prev`, comma-separated, oldest first),
/// which the links carry so that "Newer" can go back without a count.
#[derive(Clone, Copy, Default)]
pub(crate) struct At<'a> {
    /// This page's cursor; none on the first page.
    pub(crate) cursor: Option<&'a str>,
    /// The cursors of the pages before it.
    pub(crate) prev: Option<&'a str>,
}

/// The most pages back the links remember.
const PAGES_REMEMBERED: usize = 50;

/// The paging of a listing at `path` (`extra` is more of its query
/// string): which rows this page shows ("51–100"), a link to the newer
/// page when this is not the first, and to the older one when there is
/// one. Pages hold 50 rows.
pub(crate) fn pager(
    path: &str,
    extra: &str,
    at: At<'_>,
    shown: usize,
    next: Option<i64>,
) -> Markup {
    let prevs: Vec<&str> = at
        .prev
        .unwrap_or("")
        .split(',')
        .filter(|c| !c.is_empty())
        .collect();
    let first = (prevs.len() + usize::from(at.cursor.is_some())) * 50 + 1;
    let newer = match (at.cursor, prevs.split_last()) {
        (None, _) => None,
        (Some(_), None) => Some(match extra.strip_prefix('&') {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        }),
        (Some(_), Some((last, rest))) => Some(format!(
            "{path}?cursor={last}&prev={}{extra}",
            rest.join(",")
        )),
    };
    let mut behind: Vec<&str> = prevs.clone();
    behind.extend(at.cursor);
    let skip = behind.len().saturating_sub(PAGES_REMEMBERED);
    let behind = behind.get(skip..).unwrap_or_default().join(",");
    html! {
        @if newer.is_some() || next.is_some() {
            p.pager {
                @if shown > 0 {
                    span.muted id="showing" { "rows " (first) "–" (first + shown - 1) }
                }
                @if let Some(h) = &newer { " " a href=(h) id="newer" { "« Newer" } }
                @if let Some(n) = next {
                    " " a href={ (path) "?cursor=" (n) "&prev=" (behind) (extra) } id="next" { "Older »" }
                }
            }
        }
    }
}

/// JSON, indented, in a `<pre>`; a dash when absent.
pub(crate) fn json_block(v: Option<&serde_json::Value>) -> Markup {
    match v.and_then(|v| serde_json::to_string_pretty(v).ok()) {
        Some(text) => html! { pre { (text) } },
        None => html! { "–" },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn markup_in_user_values_is_text() {
        let cell = link("/x?a=1&b=\"2\"", "<script>alert(1)</script>");
        assert_eq!(
            cell.into_string(),
            "<a href=\"/x?a=1&amp;b=&quot;2&quot;\">&lt;script&gt;alert(1)&lt;/script&gt;</a>"
        );
        let t = table("t", &["<h>"], &[vec![html! { ("<b>") }]], "none").into_string();
        assert!(t.contains("<th>&lt;h&gt;</th>"), "{t}");
        assert!(t.contains("<td>&lt;b&gt;</td>"), "{t}");
        let empty = table("t", &["h"], &[], "<none>").into_string();
        assert_eq!(empty, "<p class=\"empty\" id=\"t\">&lt;none&gt;</p>");
        assert_eq!(segment("a/b c?é"), "a%2Fb%20c%3F%C3%A9");
        assert_eq!(segment("ok-_.~9"), "ok-_.~9");
    }

    #[test]
    fn times_read_relative_to_now() {
        let now = Timestamp::from_millis(10_000_000_000);
        let at = |s: i64| Timestamp::from_millis(now.as_millis() + s * 1000);
        assert_eq!(relative(at(2), now), "now");
        assert_eq!(relative(at(-12), now), "12 s ago");
        assert_eq!(relative(at(240), now), "in 4 min");
        assert_eq!(relative(at(-3 * 3600), now), "3 h ago");
        assert_eq!(relative(at(-2 * 86_400), now), "2 d ago");
        let w = when(at(240), now).into_string();
        assert!(w.contains("in 4 min") && w.contains("datetime=\""), "{w}");
        let id = id_cell("0190b7c4-6a4e", Some("/x")).into_string();
        assert_eq!(
            id,
            "<a class=\"id\" href=\"/x\" title=\"0190b7c4-6a4e\">0190b7c4-6a4e</a>"
        );
        assert_eq!(Tab::of_path("endpoints/x/y"), Tab::Endpoints);
        assert_eq!(Tab::of_path("dead"), Tab::Dead);
        assert_eq!(Tab::of_path("nope"), Tab::Overview);
    }

    #[test]
    fn the_pager_goes_back_and_forth_and_counts_rows() {
        let first = pager("/p", "&state=dead", At::default(), 50, Some(900)).into_string();
        assert!(first.contains("rows 1–50"), "{first}");
        assert!(!first.contains("Newer"), "{first}");
        assert!(
            first.contains("href=\"/p?cursor=900&amp;prev=&amp;state=dead\""),
            "{first}"
        );
        let at = At {
            cursor: Some("900"),
            prev: None,
        };
        let second = pager("/p", "&state=dead", at, 50, Some(800)).into_string();
        assert!(second.contains("rows 51–100"), "{second}");
        assert!(
            second.contains("href=\"/p?state=dead\" id=\"newer\""),
            "{second}"
        );
        assert!(second.contains("cursor=800&amp;prev=900&amp;"), "{second}");
        let at = At {
            cursor: Some("800"),
            prev: Some("900"),
        };
        let third = pager("/p", "", at, 7, None).into_string();
        assert!(
            third.contains("rows 101–107") && !third.contains("Older"),
            "{third}"
        );
        assert!(
            third.contains("href=\"/p?cursor=900&amp;prev=\" id=\"newer\""),
            "{third}"
        );
    }

    #[test]
    fn bars_scale_to_the_largest_value() {
        let svg = bars("x", &[0, 5, 10]).into_string();
        assert!(svg.contains("height=\"40\"><title>10"), "{svg}");
        assert!(svg.contains("height=\"20\"><title>5"), "{svg}");
        assert!(svg.contains("height=\"0\"><title>0"), "{svg}");
        assert!(svg.contains("viewBox=\"0 0 18 40\""), "{svg}");
    }

    #[test]
    fn the_active_tab_is_marked_and_the_sign_out_carries_the_csrf_token() {
        let a = AccountId::new("acme").unwrap();
        let p = page("T<", Some((&a, Tab::Dead)), Some("tok"), &html! {}).into_string();
        assert!(p.contains("<title>T&lt; · control-plane</title>"), "{p}");
        assert!(
            p.contains("<a href=\"/ui/a/acme/dead\" class=\"active\">Dead letters</a>"),
            "{p}"
        );
        assert!(p.contains("<a href=\"/ui/a/acme/tasks\">Tasks</a>"), "{p}");
        assert!(p.contains("name=\"csrf\" value=\"tok\""), "{p}");
        let anonymous = page("T", None, None, &html! {}).into_string();
        assert!(!anonymous.contains("Sign out") && !anonymous.contains("<nav><a"));
    }
}
