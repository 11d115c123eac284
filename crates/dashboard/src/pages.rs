//! The account's pages: the account list, the overview and the endpoints
//! list; `show`, the frame of every account page. Each handler resolves the session's reach
//! to the account in the path first (as the API does, so an account key
//! gets `404` for every page of another account), reads through
//! `api::query`, and renders with a template of this file.

use api::auth::Caller;
use api::query::{self, Count, EndpointHealth, Overview, StateCounts};
use api::ApiError;
use axum::extract::{Query, State};
use control_plane_core::{AccountId, CircuitMode, DeliveryState, Endpoint, Timestamp};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{
    alerts_table, answer, bars, base, button, endpoint_href, id_cell, link, page, page_refreshing,
    state, table, when, Tab,
};
use crate::reason::endpoint_state;
use crate::session::{AccountPage, Session};
use crate::{to, Page, Shared};

/// A page of an account, in its frame.
pub(crate) fn show(
    title: &str,
    account: &AccountId,
    tab: Tab,
    session: &Session,
    body: &Markup,
) -> Page {
    Ok(answer(page(
        title,
        Some((account, tab)),
        Some(&session.csrf),
        body,
    )))
}

#[derive(Deserialize)]
pub(crate) struct HomeQuery {
    account: Option<String>,
}

/// An account key goes to its account; the admin picks one.
pub(crate) async fn home(State(s): Shared, session: Session, Query(q): Query<HomeQuery>) -> Page {
    let account = match (&session.caller, q.account) {
        (Caller::Account(own), _) => own.clone(),
        (Caller::Admin, Some(a)) => session.caller.reach(a.trim())?,
        (Caller::Admin, None) => {
            let totals = query::account_totals(s.store()).await?;
            let body = accounts_body(&totals);
            return Ok(answer(page("Accounts", None, Some(&session.csrf), &body)));
        }
    };
    to(&base(&account))
}

fn accounts_body(totals: &[(AccountId, u64)]) -> Markup {
    let rows: Vec<Vec<Markup>> = totals
        .iter()
        .map(|(a, n)| vec![link(&base(a), a.as_str()), html! { (n) }])
        .collect();
    html! {
        form.inline method="get" action="/ui" {
            label for="account" { "Account" }
            input id="account" name="account" required;
            button type="submit" id="open-account" { "Open" }
        }
        h2 { "Accounts with deliveries" }
        (table("accounts", &["account", "deliveries"], &rows, "No account has deliveries yet."))
    }
}

#[derive(Deserialize)]
pub(crate) struct OverviewQuery {
    /// Reload the page every this many seconds (opt-in; 10 to 3600).
    refresh: Option<String>,
}

/// The auto-refresh a query asks for: 10 to 3600 seconds, or none.
fn refresh_of(given: Option<&str>) -> Result<Option<u32>, ApiError> {
    match given.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|r| (10..=3600).contains(r))
            .map(Some)
            .ok_or_else(|| ApiError::bad_request("refresh: expected 10 to 3600 seconds")),
    }
}

/// Queue depth by state (with how many are held and why), deliveries per
/// minute, open circuits, disabled endpoints, dead letters and the latest
/// alerts of one account; reloaded every `?refresh=` seconds when asked.
pub(crate) async fn overview(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<OverviewQuery>,
) -> Page {
    let refresh = refresh_of(q.refresh.as_deref())?;
    let now = s.now();
    let o = query::overview(s.store(), &account, now).await?;
    let unknown = o.counts.is_empty() && s.store().endpoint_list(&account).await?.is_empty();
    let body = html! {
        @if unknown {
            p.error id="unknown-account" {
                "No endpoint and no delivery is stored under the account "
                code { (account.as_str()) } ": check its name (an erased account has none either)."
            }
        }
        p.refresh {
            @match refresh {
                Some(r) => {
                    "This page reloads every " (r) " s. "
                    a href=(base(&account)) id="stop-refresh" { "Stop" }
                }
                None => {
                    a href={ (base(&account)) "?refresh=30" } id="auto-refresh" { "Reload every 30 s" }
                }
            }
        }
        (overview_body(&account, &o, &session.csrf, now))
    };
    Ok(answer(page_refreshing(
        "Overview",
        Some((&account, Tab::Overview)),
        Some(&session.csrf),
        &body,
        refresh,
    )))
}

/// The figures at the top of the overview: each state's count, and the
/// pending deliveries held by disabled endpoints and open circuits.
fn state_cards(account: &AccountId, o: &Overview) -> Markup {
    let root = base(account);
    let held = o.held_total();
    let cards = [
        ("pending", o.count(DeliveryState::Pending), "st-wait", false),
        (
            "held",
            held.n,
            if held.n > 0 { "st-held" } else { "st-wait" },
            held.more,
        ),
        (
            "leased",
            o.count(DeliveryState::Leased),
            if o.count(DeliveryState::Leased) > 0 {
                "st-busy"
            } else {
                "st-wait"
            },
            false,
        ),
        (
            "delivered",
            o.count(DeliveryState::Delivered),
            "st-good",
            false,
        ),
        (
            "dead",
            o.count(DeliveryState::Dead),
            if o.count(DeliveryState::Dead) > 0 {
                "st-bad"
            } else {
                "st-good"
            },
            false,
        ),
    ];
    html! {
        section.cards {
            @for (label, n, tone, more) in cards {
                @let href = match label {
                    "held" => format!("{root}/deliveries?state=pending"),
                    "dead" => format!("{root}/dead"),
                    other => format!("{root}/deliveries?state={other}"),
                };
                a class={ "card " (tone) } href=(href) {
                    span.figure id={ "count-" (label) } { (n) @if more { "+" } }
                    span.label { (label) }
                }
            }
        }
    }
}

fn overview_body(account: &AccountId, o: &Overview, csrf: &str, now: Timestamp) -> Markup {
    let held_of = |id| {
        o.held.get(&id).map_or_else(String::new, |c| {
            format!("{}{} held", c.n, if c.more { "+" } else { "" })
        })
    };
    let open: Vec<Vec<Markup>> = o
        .open_circuits
        .iter()
        .map(|(e, c)| {
            vec![
                endpoint_link(account, e),
                html! { span class=(if c.mode == CircuitMode::Open { "st st-held" } else { "st st-wait" }) { (c.mode.as_str()) } },
                html! { (c.consecutive_failures) },
                html! { @if let Some(t) = c.open_until { "next probe " (when(t, now)) } },
                html! { strong.nowrap { (held_of(e.id)) } },
            ]
        })
        .collect();
    let disabled: Vec<Vec<Markup>> = o
        .disabled
        .iter()
        .map(|e| {
            vec![
                endpoint_link(account, e),
                html! { (e.disabled_reason.as_deref().unwrap_or("no reason given")) },
                html! { strong.nowrap { (held_of(e.id)) } },
                button(
                    &format!("{}/enable", endpoint_href(account, &e.id.to_string())),
                    csrf,
                    "Enable",
                    &format!("enable-{}", e.id),
                ),
            ]
        })
        .collect();
    html! {
        (state_cards(account, o))
        h2 { "Attempts per minute" }
        div.chart-line {
            p {
                "delivered, last minute: " span id="per-minute" { (o.per_minute[29]) }
                " · busiest: " (o.per_minute.iter().max().copied().unwrap_or(0))
            }
            (bars("delivered attempts per minute, last 30 minutes", &o.per_minute))
            p {
                "failed, last minute: " span id="failed-per-minute" { (o.failed_per_minute[29]) }
                " · busiest: " (o.failed_per_minute.iter().max().copied().unwrap_or(0))
            }
            (bars("failed attempts per minute, last 30 minutes", &o.failed_per_minute))
            p.axis { span { "30 min ago" } span { "now" } }
        }
        h2 { "Open circuits" }
        (table("open-circuits", &["endpoint", "mode", "consecutive failures", "next probe", "held"],
            &open, "No open circuit."))
        h2 { "Disabled endpoints" }
        (table("disabled-endpoints", &["endpoint", "reason", "held", ""], &disabled,
            "No disabled endpoint."))
        h2 { "Dead letters" }
        p {
            span id="dead-count" { (o.count(DeliveryState::Dead)) } " dead deliveries. "
            (link(&format!("{}/dead", base(account)), "Review and replay"))
        }
        h2 { "Latest alerts" }
        (alerts_table(account, &o.alerts, now, "No alert."))
        p { (link(&format!("{}/alerts", base(account)), "Every alert")) }
    }
}

/// An endpoint's URL as a link to its page, its id on hover.
pub(crate) fn endpoint_link(account: &AccountId, e: &Endpoint) -> Markup {
    let id = e.id.to_string();
    html! { a.url href=(endpoint_href(account, &id)) title=(id) { (e.destination_label()) } }
}

/// Every endpoint with its state, circuit, flow limits, its pending and
/// dead deliveries, last hour's success rate and response times, a chart
/// of its median response time per minute, and its actions.
pub(crate) async fn endpoints(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
) -> Page {
    let now = s.now();
    let health = query::endpoint_health(s.store(), &account, now).await?;
    let counts = query::state_counts(s.store(), &account).await?;
    let rows: Vec<Vec<Markup>> = health
        .iter()
        .map(|h| endpoint_row(h, &counts, &session.csrf, now))
        .collect();
    let body = table(
        "endpoints",
        &[
            "endpoint",
            "state",
            "pending / dead",
            "in flight",
            "rate limit",
            "success (1 h)",
            "p50 / p95 (1 h)",
            "latency (last 30)",
            "actions",
        ],
        &rows,
        "No endpoint yet.",
    );
    let body = html! {
        (body)
        p { (link(&format!("{}/portal-links", base(&account)), "Portal links of this account")) }
    };
    show("Endpoints", &account, Tab::Endpoints, &session, &body)
}

/// A count as shown: `342`, or `1000+` when the read stopped at its cap.
pub(crate) fn count_text(c: Count) -> String {
    format!("{}{}", c.n, if c.more && c.n > 0 { "+" } else { "" })
}

/// A row of the endpoints page.
fn endpoint_row(
    h: &EndpointHealth,
    counts: &StateCounts,
    csrf: &str,
    now: Timestamp,
) -> Vec<Markup> {
    let e = &h.endpoint;
    let ms = |v: Option<u64>| v.map_or_else(|| "–".into(), |v| format!("{v} ms"));
    let href = endpoint_href(&e.account, &e.id.to_string());
    vec![
        endpoint_cell(e),
        state(&endpoint_state(e, &h.circuit, now), now),
        html! {
            span.nowrap {
                a href={ (base(&e.account)) "/deliveries?state=pending&endpoint=" (e.id) } {
                    (count_text(counts.pending_of(e.id)))
                }
                " / "
                a href={ (base(&e.account)) "/deliveries?state=dead&endpoint=" (e.id) }
                    class=[(counts.dead_of(e.id).n > 0).then_some("bad")] {
                    (count_text(counts.dead_of(e.id)))
                }
            }
        },
        html! {
            span.nowrap {
                (h.in_flight) " / "
                @match e.max_in_flight { Some(cap) => { (cap) } None => { "default" } }
            }
        },
        html! {
            span.nowrap { @match e.rate_limit_per_s { Some(r) => { (r) "/s" } None => { "none" } } }
        },
        html! {
            span.nowrap {
                @match h.last_hour.success_rate() {
                    Some(r) => { (format!("{:.1}%", r * 100.0)) }
                    None => { "–" }
                }
            }
        },
        html! { span.nowrap { (ms(h.last_hour.p50_latency_ms)) " / " (ms(h.last_hour.p95_latency_ms)) } },
        bars(
            "median response time of each of the last 30 minutes, ms",
            &h.latencies,
        ),
        html! {
            div.actions {
                (crate::recover::form(e, csrf))
                @if e.enabled {
                    (button(&format!("{href}/disable"), csrf, "Disable", &format!("disable-{}", e.id)))
                } @else {
                    (button(&format!("{href}/enable"), csrf, "Enable", &format!("enable-{}", e.id)))
                }
            }
        },
    ]
}

/// The kind of a broker destination (`amqp`, `nats`, `redis`); `None` for
/// an HTTP one (docs/http-api.md, "Destinations").
pub(crate) fn broker_kind(url: &str) -> Option<&'static str> {
    match control_plane_core::Destination::parse(url).ok()? {
        control_plane_core::Destination::Http { .. } => None,
        other => Some(other.kind()),
    }
}

/// The endpoints page's first cell: URL, description, filter, the names of
/// its custom headers (never their values), the token URL and client id of
/// its OAuth2 credentials (never the secret), the subject and expiry of its
/// client certificate (never the key), and its own retry schedule.
pub(crate) fn endpoint_cell(e: &Endpoint) -> Markup {
    let headers = e.header_names();
    let id = e.id.to_string();
    html! {
        a.url href=(endpoint_href(&e.account, &id)) title=(id) { (e.destination_label()) }
        br; small { "id " (id_cell(&id, None)) }
        @if let Some(kind) = broker_kind(&e.url) {
            br; small.destination { "destination: " (kind) " broker" }
        }
        br; small { (e.description.as_deref().unwrap_or("")) }
        @if let Some(f) = &e.filter {
            br; small { "filter: " code { (f.to_text()) } }
        }
        @if !headers.is_empty() {
            br; small { "headers: " (headers.join(", ")) }
        }
        @if let Some(c) = e.oauth2_client() {
            br; small { "oauth2: client " (c.client_id) " at " (c.token_url) }
        }
        @if let Some(c) = e.client_tls().and_then(|c| c.summary().ok()) {
            br; small.client-tls title=(format!("SHA-256 {}", c.fingerprint_sha256)) {
                "client certificate: " (c.subject) ", expires " (crate::layout::time(c.not_after))
            }
        }
        @if let Some(r) = &e.retry {
            br; small.retry { "retries: " (retry_text(r)) }
        }
        @if let Some(k) = control_plane_core::Ed25519Key::from_secret(e.secrets.current.expose()) {
            br; small.signature { "signs v1a (ed25519), public key " code { (k.public_key()) } }
        }
    }
}

/// An endpoint's own retry schedule as an operator reads it: the delays in
/// seconds and the attempt limit.
fn retry_text(r: &control_plane_core::EndpointRetry) -> String {
    let delays: Vec<String> = r
        .schedule()
        .iter()
        .map(|d| format!("{}s", d.as_secs()))
        .collect();
    format!(
        "{} (at most {} attempts)",
        delays.join(", "),
        r.max_attempts()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_destination_is_named_by_its_kind_and_http_by_nothing() {
        assert_eq!(broker_kind("nats://n:4222?subject=a.b"), Some("nats"));
        assert_eq!(
            broker_kind("amqp://r/%2f?exchange=&routing_key=q"),
            Some("amqp")
        );
        assert_eq!(broker_kind("https://example.com/hook"), None);
        assert_eq!(broker_kind("not a url"), None);
    }
}
