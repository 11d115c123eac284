//! One endpoint's page: its settings and subscription, health (success,
//! latency, circuit and next probe), deliveries by state, its latest
//! failures with the receiver's answers and the alerts that name it; and
//! its actions (enable or disable, recover, replay its dead, rotate the
//! secret, send an example), each a form posted with the session's CSRF
//! token through the same query functions and store calls as the API.

use api::query::{self, EndpointPage};
use api::ApiError;
use axum::extract::{Path, Query, State};
use control_plane_core::{
    AccountId, AttemptRecord, AttemptStats, Circuit, Enablement, Endpoint, EndpointKey, Timestamp,
};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{
    alerts_table, answer, base, button, csrf_field, endpoint_href, id_cell, notice, page, state,
    table, when, Tab,
};
use crate::pages::{count_text, endpoint_cell, show};
use crate::reason::endpoint_state;
use crate::session::{AccountPage, Action, CsrfForm, Posted};
use crate::{to, ItemPath, Page, Shared};

#[derive(Deserialize)]
pub(crate) struct DoneQuery {
    done: Option<String>,
}

/// The endpoint's page.
pub(crate) async fn page_of(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Path(p): Path<ItemPath>,
    Query(q): Query<DoneQuery>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let now = s.now();
    let found = query::endpoint_page(
        s.store(),
        EndpointKey::new(&account, id),
        now,
        s.endpoint_concurrency(),
    )
    .await?;
    let Some(e) = found.endpoint() else {
        return Err(ApiError::not_found("endpoint").into());
    };
    let circuit = found.flow.circuit(e.id);
    let done = match q.done.as_deref() {
        Some("enabled") => Some("Enabled: its held deliveries go again."),
        Some("disabled") => Some("Disabled: its deliveries are held until it is enabled."),
        _ => None,
    };
    let body = html! {
        @if let Some(d) = done { (notice(d)) }
        (settings(e, &circuit, now))
        (health(&found, &circuit, now))
        (actions(e, &found.examples, &session.csrf))
        h2 { "Latest failures" }
        (failures(&account, &found.failures, now))
        h2 { "Alerts" }
        (alerts_table(&account, &found.alerts, now, "No recent alert names this endpoint."))
    };
    show("Endpoint", &account, Tab::Endpoints, &session, &body)
}

/// What the endpoint is: URL, id, state, subscription and settings.
fn settings(e: &Endpoint, circuit: &Circuit, now: Timestamp) -> Markup {
    let types = if e.event_types.is_empty() {
        "every type".to_string()
    } else {
        e.event_types.join(", ")
    };
    html! {
        dl.facts id="endpoint" {
            dt { "endpoint" } dd id="fact-url" { (endpoint_cell(e)) }
            dt { "id" } dd id="fact-id" { code { (e.id) } }
            @if e.is_poll() {
                dt { "kind" } dd id="fact-kind" {
                    "poll: its consumer reads its events from "
                    code { "GET /v1/accounts/" (e.account) "/endpoints/" (e.id) "/poll" }
                    " with the account's key; nothing is sent"
                }
            }
            dt { "state" } dd id="fact-state" { (state(&endpoint_state(e, circuit, now), now)) }
            dt { "event types" } dd id="fact-types" { (types) }
            dt { "in-flight cap" } dd {
                @match e.max_in_flight { Some(c) => { (c) } None => { "the service's default" } }
                @if e.ordered { " (ordered: one at a time, in order)" }
            }
            dt { "rate limit" } dd {
                @match e.rate_limit_per_s { Some(r) => { (r) " per second" } None => { "none" } }
            }
            dt { "transformation" } dd id="fact-transform" {
                @match &e.transform {
                    Some(t) => { pre { (t.as_str()) } }
                    None => { "none: bodies are sent as published" }
                }
            }
            dt { "created" } dd { (when(e.created_at, now)) }
            dt { "updated" } dd { (when(e.updated_at, now)) }
        }
    }
}

/// A success rate as a percentage, a dash without attempts.
fn rate(s: &AttemptStats) -> String {
    s.success_rate()
        .map_or_else(|| "–".into(), |r| format!("{:.1}%", r * 100.0))
}

/// Health and counts: success and latency over the last hour and day, the
/// circuit, and the deliveries by state.
fn health(found: &EndpointPage, circuit: &Circuit, now: Timestamp) -> Markup {
    let ms = |v: Option<u64>| v.map_or_else(|| "–".into(), |v| format!("{v} ms"));
    let Some(e) = found.endpoint() else {
        return html! {};
    };
    let root = base(&e.account);
    let stats = [
        ("last hour", &found.last_hour),
        ("last day", &found.last_day),
    ];
    html! {
        h2 { "Health" }
        dl.facts id="health" {
            @for (label, s) in stats {
                dt { (label) }
                dd {
                    strong { (rate(s)) } " success · "
                    (s.delivered) " delivered, " (s.failed) " failed, " (s.lease_expired) " lease expired · p50 "
                    (ms(s.p50_latency_ms)) ", p95 " (ms(s.p95_latency_ms))
                }
            }
            dt { "circuit" }
            dd id="circuit" {
                (circuit.mode.as_str()) ", " (circuit.consecutive_failures) " failures in a row"
                @if let Some(t) = circuit.open_until { "; next probe " (when(t, now)) }
                @if let Some(t) = circuit.failing_since { "; failing since " (when(t, now)) }
            }
        }
        h2 { "Deliveries" }
        section.cards id="endpoint-counts" {
            a.card.st-wait href={ (root) "/deliveries?state=pending&endpoint=" (e.id) } {
                span.figure id="count-pending" { (count_text(found.pending)) }
                span.label { "pending" }
            }
            a.card.st-busy href={ (root) "/deliveries?state=leased&endpoint=" (e.id) } {
                span.figure id="count-leased" { (found.flow.in_flight_of(e.id)) }
                span.label { "in flight" }
            }
            a class=(if found.dead.n > 0 { "card st-bad" } else { "card st-good" })
                href={ (root) "/deliveries?state=dead&endpoint=" (e.id) } {
                span.figure id="count-dead" { (count_text(found.dead)) }
                span.label { "dead" }
            }
            div.card.st-good {
                span.figure id="count-delivered" { (found.last_day.delivered) }
                span.label { "delivered (1 day)" }
            }
        }
        p.links {
            a href={ (root) "/deliveries?endpoint=" (e.id) } id="endpoint-deliveries" { "Its deliveries" }
            " · " a href={ (root) "/attempts?endpoint=" (e.id) } id="endpoint-attempts" { "Its attempts" }
            " · " a href={ (root) "/endpoints" } { "Every endpoint" }
        }
    }
}

/// The endpoint's actions.
fn actions(e: &Endpoint, examples: &[String], csrf: &str) -> Markup {
    let href = endpoint_href(&e.account, &e.id.to_string());
    html! {
        h2 { "Actions" }
        div.actions id="actions" {
            @if e.enabled {
                form.inline method="post" action={ (href) "/disable" } {
                    (csrf_field(csrf))
                    input name="reason" aria-label="reason" placeholder="reason (optional)" maxlength="500";
                    button type="submit" id="disable" { "Disable" }
                }
            } @else {
                (button(&format!("{href}/enable"), csrf, "Enable", "enable"))
            }
            (crate::recover::form(e, csrf))
            form.inline method="post" action={ (base(&e.account)) "/dead/replay" } {
                (csrf_field(csrf))
                input type="hidden" name="endpoint_id" value=(e.id);
                input type="hidden" name="within_hours" value="";
                button type="submit" id="replay-dead" { "Replay its dead…" }
            }
            (button(&format!("{href}/rotate-secret"), csrf, "Rotate secret", "rotate-secret"))
            @if !examples.is_empty() {
                form.inline method="post" action={ (href) "/send-example" } {
                    (csrf_field(csrf))
                    select name="type" aria-label="event type" {
                        @for t in examples { option value=(t) { (t) } }
                    }
                    button type="submit" id="send-example" { "Send example" }
                }
            }
        }
    }
}

/// The latest failed attempts with the receiver's answers.
fn failures(account: &AccountId, attempts: &[AttemptRecord], now: Timestamp) -> Markup {
    let root = base(account);
    let rows: Vec<Vec<Markup>> = attempts
        .iter()
        .map(|a| {
            let d = a.delivery_id.to_string();
            vec![
                when(a.recorded_at, now),
                id_cell(&d, Some(&format!("{root}/deliveries/{d}"))),
                html! { (a.attempt) },
                html! { @if let Some(c) = a.status_code { (c) } },
                html! { (a.error.as_deref().unwrap_or("")) },
                html! { pre.answer { (a.response_body.as_deref().unwrap_or("")) } },
            ]
        })
        .collect();
    table(
        "failures",
        &["when", "delivery", "attempt", "status", "error", "answer"],
        &rows,
        "No failed attempt.",
    )
}

/// Enables the endpoint: its held deliveries go again.
pub(crate) async fn enable(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, .. }: Action<CsrfForm>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    s.store()
        .endpoint_set_enabled(EndpointKey::new(&account, id), Enablement::Enabled)
        .await?;
    to(&format!(
        "{}?done=enabled",
        endpoint_href(&account, &id.to_string())
    ))
}

#[derive(Deserialize)]
pub(crate) struct DisableForm {
    csrf: String,
    reason: Option<String>,
}

impl Posted for DisableForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Disables the endpoint with the reason given: its deliveries are held.
pub(crate) async fn disable(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, form }: Action<DisableForm>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let reason = form
        .reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    s.store()
        .endpoint_set_enabled(
            EndpointKey::new(&account, id),
            Enablement::Disabled { reason },
        )
        .await?;
    to(&format!(
        "{}?done=disabled",
        endpoint_href(&account, &id.to_string())
    ))
}

/// Rotates the signing secret and shows the new one, this once.
pub(crate) async fn rotate(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, form }: Action<CsrfForm>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let (e, secret) = query::rotate_secret(&s, EndpointKey::new(&account, id), None).await?;
    let body = html! {
        (notice("Rotated: requests are signed with the new secret, and with the previous one during the rotation grace."))
        p { "The new secret, shown this once (the page is not cached): copy it to the receiver now." }
        pre id="new-secret" { (secret) }
        p { a href=(endpoint_href(&account, &e.id.to_string())) { "Back to the endpoint" } }
    };
    Ok(answer(page(
        "Secret rotated",
        Some((&account, Tab::Endpoints)),
        Some(&form.csrf),
        &body,
    )))
}

#[derive(Deserialize)]
pub(crate) struct ExampleForm {
    csrf: String,
    r#type: String,
}

impl Posted for ExampleForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Sends the chosen type's example to the endpoint and shows its delivery.
pub(crate) async fn send_example(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, form }: Action<ExampleForm>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let published = query::send_example(&s, &account, &form.r#type, id).await?;
    match published.deliveries.first() {
        Some(d) => to(&format!("{}/deliveries/{d}", base(&account))),
        None => to(&endpoint_href(&account, &id.to_string())),
    }
}
