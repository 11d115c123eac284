//! The deliveries of an account: the listing (filtered by state, endpoint,
//! event, event type and creation time, with a lookup by delivery id, event id or idempotency key),
//! one delivery with why it is where it is, and their actions (replay,
//! resend).

use api::query::{self, DeliveryPage, DeliveryRecord};
use api::ApiError;
use axum::extract::{Path, Query, State};
use control_plane_core::{
    AccountId, AttemptRecord, Delivery, DeliveryId, DeliveryListRequest, DeliveryState, EventId,
    StoreError, Timestamp,
};
use maud::{html, Markup};
use serde::Deserialize;

use crate::attempts::{since, WITHIN};
use crate::layout::{
    alerts_table, base, button, endpoint_href, id_cell, link, notice, pager, segment, state, table,
    time, when, At, Tab,
};
use crate::pages::{broker_kind, show};
use crate::reason::why;
use crate::session::{AccountPage, Action, CsrfForm};
use crate::{to, ItemPath, Page, Shared};

/// The cells of a page of deliveries: its id, state with why (first, where
/// a phone shows it), endpoint, attempts, last error, last change and event.
pub(crate) fn delivery_cells(
    account: &AccountId,
    page: &DeliveryPage,
    d: &Delivery,
    now: Timestamp,
) -> Vec<Markup> {
    let root = base(account);
    let href = format!("{root}/deliveries/{}", d.id);
    let event = format!("{root}/deliveries?event={}", d.event_id);
    let endpoint = d.endpoint_id.to_string();
    vec![
        id_cell(&d.id.to_string(), Some(&href)),
        state(&why(d, &page.flow, now), now),
        match page.url_of(d.endpoint_id) {
            Some(url) => html! {
                a.url href=(endpoint_href(account, &endpoint)) title=(endpoint) { (url) }
            },
            None => html! { span.muted title=(endpoint) { "(deleted)" } },
        },
        html! { span.nowrap { (d.attempts) " / " (d.max_attempts) } },
        html! { (d.last_error.as_deref().unwrap_or("")) },
        when(d.updated_at, now),
        id_cell(&d.event_id.to_string(), Some(&event)),
    ]
}

/// The columns of [`delivery_cells`].
pub(crate) const DELIVERY_HEAD: [&str; 7] = [
    "delivery",
    "state",
    "endpoint",
    "attempts",
    "last error",
    "updated",
    "event",
];

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    endpoint: Option<String>,
    event: Option<String>,
    /// Only deliveries of events of this type.
    #[serde(rename = "type")]
    event_type: Option<String>,
    /// Only deliveries created in the last this many hours (`WITHIN`).
    within: Option<String>,
    /// A delivery id, an event id or an idempotency key to look up.
    q: Option<String>,
    cursor: Option<String>,
    /// The cursors of the pages before this one (see `layout::At`).
    prev: Option<String>,
}

/// A query value as given, or none when empty.
fn given(v: Option<&String>) -> Option<&str> {
    v.map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// Where a lookup of `q` leads: the delivery of that id, or the deliveries
/// of the event of that id or of that idempotency key; `None` when none is
/// the account's.
async fn lookup(s: &Shared, account: &AccountId, q: &str) -> Result<Option<String>, ApiError> {
    let root = base(account);
    if let Ok(id) = q.parse::<DeliveryId>() {
        match s.store().delivery_get(account, id).await {
            Ok(d) => return Ok(Some(format!("{root}/deliveries/{}", d.id))),
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Ok(id) = q.parse::<EventId>() {
        match s.store().event_get(account, id).await {
            Ok(e) => return Ok(Some(format!("{root}/deliveries?event={}", e.id))),
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let by_key = s.store().event_find_by_key(account, q).await?;
    Ok(by_key.map(|e| format!("{root}/deliveries?event={}", e.id)))
}

/// The account's deliveries, newest first, filtered by state, endpoint and
/// event; a lookup by delivery or event id leads to what it names.
pub(crate) async fn deliveries(
    s: Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<ListQuery>,
) -> Page {
    let looked_up = given(q.q.as_ref());
    if let Some(wanted) = looked_up {
        if let Some(href) = lookup(&s, &account, wanted).await? {
            return to(&href);
        }
    }
    let st = query::delivery_state(given(q.state.as_ref()))?;
    let endpoint = given(q.endpoint.as_ref());
    let event = given(q.event.as_ref());
    let mut req = DeliveryListRequest::all(
        account.clone(),
        query::page_request(Some(50), q.cursor.as_deref())?,
    );
    req.state = st;
    req.endpoint_id = endpoint
        .map(|e| e.parse())
        .transpose()
        .map_err(|_| ApiError::bad_request("endpoint: expected an endpoint id (a UUID)"))?;
    req.event_id = event
        .map(|e| e.parse())
        .transpose()
        .map_err(|_| ApiError::bad_request("event: expected an event id (a UUID)"))?;
    let event_type = given(q.event_type.as_ref());
    req.event_type = event_type.map(str::to_string);
    let within = given(q.within.as_ref());
    let now = s.now();
    req.since = since(within, now)?;
    let found = query::delivery_page(s.store(), req, s.endpoint_concurrency()).await?;
    let path = format!("{}/deliveries", base(&account));
    let keep = |k: &str, v: Option<&str>| {
        v.map(|v| format!("&{k}={}", segment(v)))
            .unwrap_or_default()
    };
    let filters = [
        ("state", st.map(DeliveryState::as_str)),
        ("endpoint", endpoint),
        ("event", event),
        ("type", event_type),
        ("within", within),
    ];
    let extra: String = filters.iter().map(|(k, v)| keep(k, *v)).collect();
    let rows: Vec<Vec<Markup>> = found
        .deliveries
        .items
        .iter()
        .map(|d| delivery_cells(&account, &found, d, now))
        .collect();
    let body = html! {
        (search_form(&path, looked_up))
        @if let Some(wanted) = looked_up {
            p.error id="not-found" {
                "No delivery or event of this account has the id or idempotency key "
                code { (wanted) } "."
            }
        }
        (state_filters(&path, &filters))
        (filter_form(&path, &filters))
        (active_filters(&account, &path, &filters, &found))
        (table("deliveries", &DELIVERY_HEAD, &rows, "No delivery."))
        (pager(&path, &extra, At { cursor: q.cursor.as_deref(), prev: q.prev.as_deref() }, found.deliveries.items.len(), found.deliveries.next))
    };
    show("Deliveries", &account, Tab::Deliveries, &session, &body)
}

/// The lookup form of the deliveries page.
fn search_form(path: &str, wanted: Option<&str>) -> Markup {
    html! {
        form.inline method="get" action=(path) id="lookup" {
            label for="q" { "Delivery id, event id or idempotency key" }
            input id="q" name="q" value=(wanted.unwrap_or("")) size="36";
            button type="submit" id="find" { "Find" }
        }
    }
}

/// The filters of the deliveries page, in the order of its query string:
/// state, endpoint, event, event type and time window.
type Filters<'a> = [(&'a str, Option<&'a str>); 5];

/// The event type and time window form; the other filters ride along.
fn filter_form(path: &str, filters: &Filters<'_>) -> Markup {
    let [(_, state), (_, endpoint), (_, event), (_, ty), (_, within)] = *filters;
    let hidden = [("state", state), ("endpoint", endpoint), ("event", event)];
    html! {
        form.inline method="get" action=(path) id="delivery-filters" {
            @for (k, v) in hidden {
                @if let Some(v) = v { input type="hidden" name=(k) value=(v); }
            }
            label for="f-type" { "Event type" }
            input id="f-type" name="type" value=(ty.unwrap_or("")) size="20";
            label for="f-within" { "Created" }
            select id="f-within" name="within" {
                option value="" { "any time" }
                @for (v, label) in WITHIN {
                    option value=(v) selected[within == Some(v)] { (label) }
                }
            }
            button type="submit" id="filter-deliveries" { "Filter" }
        }
    }
}

/// The state links, the active one marked, each keeping the other filters.
fn state_filters(path: &str, filters: &Filters<'_>) -> Markup {
    let others: String = filters
        .iter()
        .skip(1)
        .filter_map(|(k, v)| v.map(|v| format!("&{k}={}", segment(v))))
        .collect();
    let active = filters[0].1;
    html! {
        p.filters id="state-filters" {
            "State: "
            a href={ (path) "?" (others.trim_start_matches('&')) }
                class=[active.is_none().then_some("active")] { "all" }
            @for st in ["pending", "leased", "delivered", "dead"] {
                " " a href={ (path) "?state=" (st) (others) }
                    class=[(active == Some(st)).then_some("active")] { (st) }
            }
        }
    }
}

/// The filters in force, each with a link that drops it.
fn active_filters(
    account: &AccountId,
    path: &str,
    filters: &Filters<'_>,
    found: &DeliveryPage,
) -> Markup {
    let without = |skip: &str| -> String {
        let q: Vec<String> = filters
            .iter()
            .filter(|(k, _)| *k != skip)
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", segment(v))))
            .collect();
        format!("{path}?{}", q.join("&"))
    };
    html! {
        @if filters.iter().any(|(_, v)| v.is_some()) {
            p.active-filters id="active-filters" {
                "Showing only: "
                @for (k, v) in filters {
                    @if let Some(v) = v {
                        span.chip {
                            (k) " "
                            @if *k == "endpoint" {
                                @let url = v.parse().ok().and_then(|id| found.url_of(id));
                                a href=(endpoint_href(account, v)) title=(v) { (url.unwrap_or(*v)) }
                            } @else {
                                strong title=(v) { (v) }
                            }
                            " " a.drop href=(without(k)) title="remove this filter" { "×" }
                        }
                    }
                }
                " " (link(path, "Clear all"))
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct DoneQuery {
    replayed: Option<u64>,
    resent: Option<u64>,
}

/// One delivery: its state and why, the exact request it sends (never the
/// secret), its attempt log and its alerts; links to its event, endpoint
/// and attempts; a replay button while it is dead, a resend button once it
/// is delivered.
pub(crate) async fn delivery(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Path(p): Path<ItemPath>,
    Query(q): Query<DoneQuery>,
) -> Page {
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let record = query::delivery_record(s.store(), &account, id, s.endpoint_concurrency()).await?;
    let body = html! {
        @if q.replayed.is_some() {
            (notice("Replayed: the delivery is pending again."))
        }
        @if q.resent.is_some() {
            (notice("Resent: the delivery is pending again, under the same webhook-id."))
        }
        (delivery_body(&account, &record, &session.csrf, s.now()))
    };
    show("Delivery", &account, Tab::Deliveries, &session, &body)
}

/// The facts of a delivery page: state and why, attempts, event, endpoint,
/// times.
fn delivery_facts(account: &AccountId, r: &DeliveryRecord, now: Timestamp) -> Markup {
    let d: &Delivery = &r.delivery.delivery;
    let root = base(account);
    let endpoint = d.endpoint_id.to_string();
    let facts: [(&str, Markup); 9] = [
        ("state", state(&why(d, &r.flow, now), now)),
        ("attempts", html! { (d.attempts) " of " (d.max_attempts) }),
        ("event type", html! { (r.event.event_type) }),
        (
            "event",
            html! {
                a href={ (root) "/deliveries?event=" (d.event_id) } { (d.event_id) }
                @if let Some(k) = &r.event.idempotency_key {
                    " " small { "idempotency key " code { (k) } }
                }
            },
        ),
        (
            "endpoint",
            html! {
                a href=(endpoint_href(account, &endpoint)) { (r.url().unwrap_or("(deleted)")) }
                " " small { (endpoint) }
            },
        ),
        ("due", when(d.due_at, now)),
        (
            "last error",
            html! { (d.last_error.as_deref().unwrap_or("")) },
        ),
        ("created", when(d.created_at, now)),
        ("updated", when(d.updated_at, now)),
    ];
    html! {
        dl.facts {
            @for (k, v) in facts {
                dt { (k) }
                dd id={ "fact-" (k.replace(' ', "-")) } { (v) }
            }
        }
        p.links {
            a href={ (root) "/attempts?endpoint=" (endpoint) } id="endpoint-attempts" { "Attempts of this endpoint" }
            " · " a href={ (root) "/deliveries?event=" (d.event_id) } id="event-deliveries" { "Every delivery of this event" }
            " · " a href={ (root) "/deliveries?endpoint=" (endpoint) } { "Deliveries of this endpoint" }
        }
    }
}

fn delivery_body(account: &AccountId, r: &DeliveryRecord, csrf: &str, now: Timestamp) -> Markup {
    let d: &Delivery = &r.delivery.delivery;
    let action = format!("{}/deliveries/{}", base(account), d.id);
    html! {
        (delivery_facts(account, r, now))
        @if d.state == DeliveryState::Dead {
            (button(&format!("{action}/replay"), csrf, "Replay this delivery", "replay"))
        }
        @if d.state == DeliveryState::Delivered {
            (button(&format!("{action}/resend"), csrf, "Resend this delivery", "resend"))
        }
        @if r.endpoint().is_some_and(|e| e.is_poll()) {
            h2 { "Event" }
            p.note id="polled" { "Its endpoint is a poll endpoint: its consumer reads this body, nothing is sent." }
            pre id="request" { (r.event.body) }
        } @else {
        h2 { "Request" }
        pre id="request" {
            (r.url().and_then(broker_kind).map_or("POST", |_| "PUBLISH")) " "
            (r.url().unwrap_or("(endpoint deleted)")) "\n"
            "content-type: application/json\n"
            "webhook-id: " (d.id) "\n"
            "webhook-timestamp: (the Unix time of each attempt)\n"
            "webhook-signature: v1,(HMAC-SHA256 with the endpoint's secret, not shown)\n\n"
            (r.event.body)
        }
        }
        @if let Some(t) = r.flow.endpoint(d.endpoint_id).and_then(|e| e.transform.as_ref()) {
            p.note id="transformed" {
                "Its endpoint's transformation rewrites this body before it is signed (or drops the \
                 delivery when it gives null); the body it gave is not kept: "
                code { (t.as_str()) }
            }
        }
        (attempts_table(&r.delivery.attempts, now))
        h2 { "Alerts" }
        (alerts_table(account, &r.alerts, now, "No alert names this delivery."))
    }
}

/// A delivery's attempts as the delivery page shows them.
pub(crate) fn attempts_table(attempts: &[AttemptRecord], now: Timestamp) -> Markup {
    let rows: Vec<Vec<Markup>> = attempts
        .iter()
        .map(|a| {
            vec![
                html! { (a.attempt) },
                html! { span.nowrap { (a.result.as_str()) } },
                html! { @if let Some(c) = a.status_code { (c) } },
                html! { (a.error.as_deref().unwrap_or("")) },
                html! { span.nowrap { (a.latency_ms) " ms" } },
                html! { span.nowrap title=(time(a.recorded_at)) { (time(a.recorded_at)) } },
                html! { @if let Some(t) = a.next_attempt_at { (when(t, now)) } },
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
