//! HTML building: escaping, the page frame and the small pieces pages share.
//! Every value a user controls (event types, payloads, URLs, descriptions,
//! errors, ids) goes through [`esc`] or [`segment`]; nothing else writes it.

use std::fmt::Write as _;

use control_plane_core::{AccountId, Timestamp};

/// `s` as HTML text or attribute value (quoted with `"`).
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` as one URL path segment (percent-encoded beyond the unreserved set).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A time as RFC 3339 (UTC, seconds).
pub(crate) fn time(t: Timestamp) -> String {
    let s = t.to_rfc3339();
    // "2026-11-30T09:43:48.123Z" -> "2026-11-30 09:43:48Z"
    match (s.get(..10), s.get(11..19)) {
        (Some(day), Some(clock)) => format!("{day} {clock}Z"),
        _ => s,
    }
}

/// The account's base path in the dashboard.
pub(crate) fn base(account: &AccountId) -> String {
    format!("/ui/a/{}", segment(account.as_str()))
}

/// Which section of an account a page belongs to (its tab is marked).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tab {
    Overview,
    Endpoints,
    EventTypes,
    Deliveries,
    Dead,
    Tasks,
}

const TABS: [(Tab, &str, &str); 6] = [
    (Tab::Overview, "", "Overview"),
    (Tab::Endpoints, "/endpoints", "Endpoints"),
    (Tab::EventTypes, "/event-types", "Event types"),
    (Tab::Deliveries, "/deliveries", "Deliveries"),
    (Tab::Dead, "/dead", "Dead letters"),
    (Tab::Tasks, "/tasks", "Tasks"),
];

/// A whole page: the frame, the account's tabs (when in an account), a
/// sign-out button when signed in, and `body`.
pub(crate) fn page(
    title: &str,
    account: Option<(&AccountId, Tab)>,
    csrf: Option<&str>,
    body: &str,
) -> String {
    let mut nav = String::new();
    if let Some((account, active)) = account {
        let _ = write!(
            nav,
            "<span class=\"account\">{}</span>",
            esc(account.as_str())
        );
        for (tab, path, label) in TABS {
            let class = if tab == active {
                " class=\"active\""
            } else {
                ""
            };
            let _ = write!(
                nav,
                "<a href=\"{}{path}\"{class}>{label}</a>",
                base(account)
            );
        }
    }
    let signout = csrf
        .map(|c| {
            format!(
                "<form method=\"post\" action=\"/ui/logout\" class=\"signout\">{}\
                 <button type=\"submit\">Sign out</button></form>",
                csrf_field(c)
            )
        })
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · control-plane</title>\
         <link rel=\"stylesheet\" href=\"/ui/app.css\"></head><body>\
         <header><a class=\"brand\" href=\"/ui\">control-plane</a><nav>{nav}</nav>{signout}</header>\
         <main><h1>{title}</h1>{body}</main></body></html>",
        title = esc(title),
    )
}

/// The hidden field every form that changes something carries.
pub(crate) fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// A one-button form posting to `action`.
pub(crate) fn button(action: &str, csrf: &str, label: &str, id: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\">{}\
         <button type=\"submit\" id=\"{}\">{}</button></form>",
        esc(action),
        csrf_field(csrf),
        esc(id),
        esc(label)
    )
}

/// A table from a header row and rows of already-escaped cells.
pub(crate) fn table(id: &str, head: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\" id=\"{}\">{}</p>", esc(id), esc(empty));
    }
    let mut out = format!("<table id=\"{}\"><thead><tr>", esc(id));
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A bar chart of `values` as inline SVG (no script, no inline style, so the
/// page's Content-Security-Policy holds); `label` is its accessible name.
pub(crate) fn bars(label: &str, values: &[u64]) -> String {
    const W: u64 = 6;
    const H: u64 = 40;
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let width = W * u64::try_from(values.len()).unwrap_or(0).max(1);
    let mut out = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"{}\" width=\"{width}\" height=\"{H}\" \
         viewBox=\"0 0 {width} {H}\">",
        esc(label)
    );
    for (i, v) in values.iter().enumerate() {
        let h = (v * H / max).max(u64::from(*v > 0));
        let x = W * u64::try_from(i).unwrap_or(0);
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{h}\"><title>{v}</title></rect>",
            H - h,
            W - 1
        );
    }
    out.push_str("</svg>");
    out
}

/// A link to `href` showing `text`.
pub(crate) fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), esc(text))
}

/// A short notice (after an action).
pub(crate) fn notice(text: &str) -> String {
    format!("<p class=\"notice\" id=\"notice\">{}</p>", esc(text))
}

/// The names of an endpoint's custom headers, never their values, and the
/// token URL and client id of its OAuth2 credentials, never the secret.
pub(crate) fn header_names(e: &control_plane_core::Endpoint) -> String {
    let names: Vec<String> = e.header_names().iter().map(|n| esc(n)).collect();
    let mut out = if names.is_empty() {
        String::new()
    } else {
        format!("<br><small>headers: {}</small>", names.join(", "))
    };
    if let Some(c) = e.oauth2_client() {
        out.push_str(&format!(
            "<br><small>oauth2: client {} at {}</small>",
            esc(&c.client_id),
            esc(&c.token_url)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_user_values_is_text() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(segment("a/b c?"), "a%2Fb%20c%3F");
        assert_eq!(segment("ok-_.~9"), "ok-_.~9");
    }

    #[test]
    fn bars_scale_to_the_largest_value() {
        let svg = bars("x", &[0, 5, 10]);
        assert!(svg.contains("height=\"40\"><title>10"));
        assert!(svg.contains("height=\"20\"><title>5"));
        assert!(svg.contains("height=\"0\"><title>0"));
    }
}
