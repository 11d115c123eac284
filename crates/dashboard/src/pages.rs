//! The account's pages: overview, endpoints, deliveries (one, and the dead
//! letters), and their actions. Each handler resolves the session's reach
//! to the account in the path first (as the API does, so an account key
//! gets `404` for every page of another account), reads through
//! `api::query`, and renders with a template of this file.

use std::time::Duration;

use api::auth::Caller;
use api::query::{self, DeliveryPage, DeliveryRecord, EndpointHealth, Overview};
use api::ApiError;
use axum::extract::{Path, Query, State};
use control_plane_core::{
    AccountId, AttemptRecord, Delivery, DeliveryState, Endpoint, ReplayFilter,
};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{
    answer, bars, base, button, csrf_field, link, next_link, notice, page, table, time, Tab,
};
use crate::session::{AccountPage, Action, CsrfForm, Posted, Session};
use crate::{to, ItemPath, Page, Shared};

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

/// Queue depth by state, deliveries per minute, open circuits, disabled
/// endpoints, dead letters and the latest alerts of one account.
pub(crate) async fn overview(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
) -> Page {
    let o = query::overview(s.store(), &account, s.now()).await?;
    show(
        "Overview",
        &account,
        Tab::Overview,
        &session,
        &overview_body(&account, &o),
    )
}

fn overview_body(account: &AccountId, o: &Overview) -> Markup {
    let states = [
        DeliveryState::Pending,
        DeliveryState::Leased,
        DeliveryState::Delivered,
        DeliveryState::Dead,
    ];
    let open: Vec<Vec<Markup>> = o
        .open_circuits
        .iter()
        .map(|(e, c)| {
            vec![
                html! { (e.url) },
                html! { (c.mode.as_str()) },
                html! { (c.consecutive_failures) },
                html! { (c.open_until.map(time).unwrap_or_default()) },
            ]
        })
        .collect();
    let disabled: Vec<Vec<Markup>> = o
        .disabled
        .iter()
        .map(|e| {
            vec![
                html! { (e.url) },
                html! { (e.disabled_reason.as_deref().unwrap_or("")) },
            ]
        })
        .collect();
    let alerts: Vec<Vec<Markup>> = o
        .alerts
        .iter()
        .map(|a| {
            vec![
                html! { (time(a.created_at)) },
                html! { (a.kind.as_str()) },
                html! { (a.message) },
            ]
        })
        .collect();
    html! {
        section.cards {
            @for state in states {
                div.card {
                    span.figure id={ "count-" (state.as_str()) } { (o.count(state)) }
                    span.label { (state.as_str()) }
                }
            }
        }
        h2 { "Deliveries per minute" }
        p {
            "last minute: " span id="per-minute" { (o.per_minute[29]) }
            (bars("deliveries per minute, last 30 minutes", &o.per_minute))
        }
        h2 { "Open circuits" }
        (table("open-circuits", &["endpoint", "mode", "consecutive failures", "open until"],
            &open, "No open circuit."))
        h2 { "Disabled endpoints" }
        (table("disabled-endpoints", &["endpoint", "reason"], &disabled, "No disabled endpoint."))
        h2 { "Dead letters" }
        p {
            span id="dead-count" { (o.count(DeliveryState::Dead)) } " dead deliveries. "
            (link(&format!("{}/dead", base(account)), "Review and replay"))
        }
        h2 { "Latest alerts" }
        (table("alerts", &["when", "kind", "message"], &alerts, "No alert."))
    }
}

/// Every endpoint with its circuit, flow limits, last hour's success rate
/// and response times, and a chart of its median response time per minute.
pub(crate) async fn endpoints(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
) -> Page {
    let health = query::endpoint_health(s.store(), &account, s.now()).await?;
    let rows: Vec<Vec<Markup>> = health
        .iter()
        .map(|h| endpoint_row(h, &session.csrf))
        .collect();
    let body = table(
        "endpoints",
        &[
            "endpoint",
            "state",
            "circuit",
            "in flight",
            "rate limit",
            "success (1 h)",
            "p50 / p95 (1 h)",
            "latency (last 30)",
            "send again",
        ],
        &rows,
        "No endpoint yet.",
    );
    show("Endpoints", &account, Tab::Endpoints, &session, &body)
}

/// A row of the endpoints page.
fn endpoint_row(h: &EndpointHealth, csrf: &str) -> Vec<Markup> {
    let e = &h.endpoint;
    let ms = |v: Option<u64>| v.map_or_else(|| "–".into(), |v| format!("{v} ms"));
    vec![
        endpoint_cell(e),
        html! {
            @if e.enabled { "enabled" }
            @else { "disabled: " (e.disabled_reason.as_deref().unwrap_or("")) }
        },
        html! { (h.circuit.mode.as_str()) " (" (h.circuit.consecutive_failures) " failures)" },
        html! {
            (h.in_flight) " / "
            @match e.max_in_flight { Some(cap) => { (cap) } None => { "default" } }
        },
        html! {
            @match e.rate_limit_per_s { Some(r) => { (r) "/s" } None => { "none" } }
        },
        html! {
            @match h.last_hour.success_rate() {
                Some(r) => { (format!("{:.1}%", r * 100.0)) }
                None => { "–" }
            }
        },
        html! { (ms(h.last_hour.p50_latency_ms)) " / " (ms(h.last_hour.p95_latency_ms)) },
        bars(
            "median response time of each of the last 30 minutes, ms",
            &h.latencies,
        ),
        crate::recover::form(e, csrf),
    ]
}

/// The kind of a broker destination (`amqp`, `nats`, `redis`); `None` for
/// an HTTP one (docs/http-api.md, "Destinations").
fn broker_kind(url: &str) -> Option<&'static str> {
    match control_plane_core::Destination::parse(url).ok()? {
        control_plane_core::Destination::Http { .. } => None,
        other => Some(other.kind()),
    }
}

/// The endpoints page's first cell: URL, description, filter, the names of
/// its custom headers (never their values), the token URL and client id of
/// its OAuth2 credentials (never the secret), and its own retry schedule.
fn endpoint_cell(e: &Endpoint) -> Markup {
    let headers = e.header_names();
    html! {
        span.url { (e.url) }
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

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    cursor: Option<String>,
    replayed: Option<u64>,
}

/// The rows of a page of deliveries (a link to each; a replay button each
/// when `replay` carries the session's CSRF token).
fn delivery_rows(
    account: &AccountId,
    page: &DeliveryPage,
    replay: Option<&str>,
) -> Vec<Vec<Markup>> {
    page.deliveries
        .items
        .iter()
        .map(|d| {
            let href = format!("{}/deliveries/{}", base(account), d.id);
            let mut row = vec![
                link(&href, &d.id.to_string()),
                html! { (page.url_of(d.endpoint_id).unwrap_or("(deleted)")) },
                html! { (d.state.as_str()) },
                html! { (d.attempts) " / " (d.max_attempts) },
                html! { (d.last_error.as_deref().unwrap_or("")) },
                html! { (time(d.updated_at)) },
            ];
            if let Some(csrf) = replay {
                row.push(button(
                    &format!("{href}/replay"),
                    csrf,
                    "Replay",
                    &format!("replay-{}", d.id),
                ));
            }
            row
        })
        .collect()
}

/// The account's deliveries, newest first, optionally of one state.
pub(crate) async fn deliveries(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<ListQuery>,
) -> Page {
    let state = query::delivery_state(q.state.as_deref())?;
    let page_request = query::page_request(Some(50), q.cursor.as_deref())?;
    let found = query::delivery_page(s.store(), &account, state, page_request).await?;
    let path = format!("{}/deliveries", base(&account));
    let extra = state
        .map(|st| format!("&state={}", st.as_str()))
        .unwrap_or_default();
    let body = html! {
        p.filters {
            (link(&path, "all"))
            @for st in ["pending", "leased", "delivered", "dead"] {
                " " (link(&format!("{path}?state={st}"), st))
            }
        }
        (table(
            "deliveries",
            &["delivery", "endpoint", "state", "attempts", "last error", "updated"],
            &delivery_rows(&account, &found, None),
            "No delivery.",
        ))
        (next_link(&path, &extra, found.deliveries.next))
    };
    show("Deliveries", &account, Tab::Deliveries, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct DoneQuery {
    replayed: Option<u64>,
    resent: Option<u64>,
}

/// One delivery: its state, the exact request it sends (never the secret)
/// and its attempt log; a replay button while it is dead, a resend button
/// once it is delivered.
pub(crate) async fn delivery(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Path(p): Path<ItemPath>,
    Query(q): Query<DoneQuery>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let record = query::delivery_record(s.store(), &account, id).await?;
    let body = html! {
        @if q.replayed.is_some() {
            (notice("Replayed: the delivery is pending again."))
        }
        @if q.resent.is_some() {
            (notice("Resent: the delivery is pending again, under the same webhook-id."))
        }
        (delivery_body(&account, &record, &session.csrf))
    };
    show("Delivery", &account, Tab::Deliveries, &session, &body)
}

fn delivery_body(account: &AccountId, r: &DeliveryRecord, csrf: &str) -> Markup {
    let d: &Delivery = &r.delivery.delivery;
    let facts: [(&str, Markup); 8] = [
        ("state", html! { (d.state.as_str()) }),
        ("attempts", html! { (d.attempts) " of " (d.max_attempts) }),
        ("event type", html! { (r.event.event_type) }),
        ("event", html! { (r.event.id) }),
        ("due", html! { (time(d.due_at)) }),
        (
            "last error",
            html! { (d.last_error.as_deref().unwrap_or("")) },
        ),
        ("created", html! { (time(d.created_at)) }),
        ("updated", html! { (time(d.updated_at)) }),
    ];
    let action = format!("{}/deliveries/{}", base(account), d.id);
    html! {
        dl.facts {
            @for (k, v) in facts {
                dt { (k) }
                dd id={ "fact-" (k.replace(' ', "-")) } { (v) }
            }
        }
        @if d.state == DeliveryState::Dead {
            (button(&format!("{action}/replay"), csrf, "Replay this delivery", "replay"))
        }
        @if d.state == DeliveryState::Delivered {
            (button(&format!("{action}/resend"), csrf, "Resend this delivery", "resend"))
        }
        h2 { "Request" }
        pre id="request" {
            (r.url.as_deref().and_then(broker_kind).map_or("POST", |_| "PUBLISH")) " "
            (r.url.as_deref().unwrap_or("(endpoint deleted)")) "\n"
            "content-type: application/json\n"
            "webhook-id: " (d.id) "\n"
            "webhook-timestamp: (the Unix time of each attempt)\n"
            "webhook-signature: v1,(HMAC-SHA256 with the endpoint's secret, not shown)\n\n"
            (r.event.body)
        }
        (attempts_table(&r.delivery.attempts))
    }
}

/// A delivery's attempts as the delivery page shows them.
fn attempts_table(attempts: &[AttemptRecord]) -> Markup {
    let rows: Vec<Vec<Markup>> = attempts
        .iter()
        .map(|a| {
            vec![
                html! { (a.attempt) },
                html! { (a.result.as_str()) },
                html! { @if let Some(c) = a.status_code { (c) } },
                html! { (a.error.as_deref().unwrap_or("")) },
                html! { (a.latency_ms) " ms" },
                html! { (time(a.recorded_at)) },
                html! { (a.next_attempt_at.map(time).unwrap_or_default()) },
                html! { pre.answer { (a.response_body.as_deref().unwrap_or("")) } },
            ]
        })
        .collect();
    html! {
        h2 { "Attempts" }
        (table(
            "attempts",
            &["#", "result", "status", "error", "latency", "at", "next attempt", "answer"],
            &rows,
            "No attempt yet.",
        ))
    }
}

#[derive(Deserialize)]
pub(crate) struct ActionPath {
    id: String,
    action: String,
}

/// Replays a dead delivery or resends a finished one (`{action}` is
/// `replay` or `resend`), then shows it with a notice.
pub(crate) async fn delivery_action(
    State(s): Shared,
    Path(p): Path<ActionPath>,
    Action { account, .. }: Action<CsrfForm>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let (d, done) = match p.action.as_str() {
        "replay" => (s.store().delivery_replay(&account, id).await?, "replayed"),
        "resend" => (s.store().delivery_resend(&account, id).await?, "resent"),
        _ => return Err(ApiError::not_found("route").into()),
    };
    to(&format!("{}/deliveries/{}?{done}=1", base(&account), d.id))
}

/// Dead deliveries, newest first, each with a replay button, and the bulk
/// replay form (by endpoint and how long ago they died).
pub(crate) async fn dead(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<ListQuery>,
) -> Page {
    let page_request = query::page_request(Some(50), q.cursor.as_deref())?;
    let found =
        query::delivery_page(s.store(), &account, Some(DeliveryState::Dead), page_request).await?;
    let path = format!("{}/dead", base(&account));
    let body = html! {
        @if let Some(n) = q.replayed {
            (notice(&format!("Replayed {n} dead deliveries.")))
        }
        form.bulk method="post" action={ (path) "/replay" } {
            (csrf_field(&session.csrf))
            label for="endpoint_id" { "Endpoint" }
            select id="endpoint_id" name="endpoint_id" {
                option value="" { "every endpoint" }
                @for e in &found.endpoints {
                    option value=(e.id) { (e.url) }
                }
            }
            label for="within_hours" { "Died within" }
            select id="within_hours" name="within_hours" {
                option value="" { "any time" }
                option value="1" { "the last hour" }
                option value="24" { "the last day" }
                option value="168" { "the last week" }
            }
            button type="submit" id="replay-all" { "Replay matching dead deliveries" }
        }
        (table(
            "dead",
            &["delivery", "endpoint", "state", "attempts", "last error", "died", ""],
            &delivery_rows(&account, &found, Some(&session.csrf)),
            "No dead delivery.",
        ))
        (next_link(&path, "", found.deliveries.next))
    };
    show("Dead letters", &account, Tab::Dead, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct BulkReplayForm {
    csrf: String,
    endpoint_id: Option<String>,
    within_hours: Option<String>,
}

impl Posted for BulkReplayForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Replays every dead delivery the form matches, in one statement.
pub(crate) async fn dead_replay(
    State(s): Shared,
    Action { account, form }: Action<BulkReplayForm>,
) -> Page {
    let mut filter = ReplayFilter::all(account.clone());
    if let Some(e) = form.endpoint_id.as_deref().filter(|e| !e.is_empty()) {
        filter.endpoint_id = Some(
            e.parse()
                .map_err(|_| ApiError::invalid(format!("not an endpoint id: {e:?}")))?,
        );
    }
    if let Some(h) = form.within_hours.as_deref().filter(|h| !h.is_empty()) {
        let hours: u64 = h
            .parse()
            .map_err(|_| ApiError::invalid(format!("not a number of hours: {h:?}")))?;
        filter.dead_since = Some(
            s.now()
                .minus(Duration::from_secs(hours.saturating_mul(3600))),
        );
    }
    let n = s.store().delivery_replay_dead(filter).await?;
    to(&format!("{}/dead?replayed={n}", base(&account)))
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
