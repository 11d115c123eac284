//! The page frame and the small pieces pages share, as maud templates.
//!
//! Every value spliced into a template is escaped by maud unless it is
//! already [`Markup`]; a template cannot put a user's string into a page
//! unescaped, and no code of this crate builds markup any other way
//! (`tests/architecture.rs` checks that this crate never writes
//! maud's pre-escaped wrapper). URL path segments go through [`segment`].

use axum::response::{Html, IntoResponse, Response};
use control_plane_core::{AccountId, Timestamp};
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

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

/// A time as `2026-11-30 09:43:48Z` (UTC, seconds).
pub(crate) fn time(t: Timestamp) -> String {
    let s = t.to_rfc3339();
    match (s.get(..10), s.get(11..19)) {
        (Some(day), Some(clock)) => format!("{day} {clock}Z"),
        _ => s,
    }
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
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tab {
    Overview,
    Endpoints,
    EventTypes,
    Deliveries,
    Attempts,
    Dead,
    Tasks,
}

const TABS: [(Tab, &str, &str); 7] = [
    (Tab::Overview, "", "Overview"),
    (Tab::Endpoints, "/endpoints", "Endpoints"),
    (Tab::EventTypes, "/event-types", "Event types"),
    (Tab::Deliveries, "/deliveries", "Deliveries"),
    (Tab::Attempts, "/attempts", "Attempts"),
    (Tab::Dead, "/dead", "Dead letters"),
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
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · control-plane" }
                link rel="stylesheet" href="/ui/app.css";
            }
            body {
                header {
                    a.brand href="/ui" { "control-plane" }
                    nav {
                        @if let Some((account, active)) = account {
                            span.account { (account.as_str()) }
                            @for (tab, path, label) in TABS {
                                a href={ (base(account)) (path) }
                                    class=[(tab == active).then_some("active")] { (label) }
                            }
                        }
                    }
                    @if let Some(csrf) = csrf {
                        form.signout method="post" action="/ui/logout" {
                            (csrf_field(csrf))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
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
/// table without rows.
pub(crate) fn table(id: &str, head: &[&str], rows: &[Vec<Markup>], empty: &str) -> Markup {
    html! {
        @if rows.is_empty() {
            p.empty id=(id) { (empty) }
        } @else {
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
        svg.chart role="img" aria-label=(label) width=(width) height=(H)
            viewBox={ "0 0 " (width) " " (H) } {
            @for (i, v) in values.iter().enumerate() {
                @let (x, y, h) = bar(i, *v);
                rect x=(x) y=(y) width=(W - 1) height=(h) { title { (v) } }
            }
        }
    }
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
    html! {
        @if let Some(n) = next {
            p { (link(&format!("{path}?cursor={n}{extra}"), "Next page")) }
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
