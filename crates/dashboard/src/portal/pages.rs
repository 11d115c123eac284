//! The portal's pages: the link's endpoints, one endpoint, its deliveries
//! and attempts, one delivery, the account's event types. Each reads
//! through the API's query layer in the link's account, and shows only
//! the endpoints the link shows (another is `404`, as if it did not exist).

use std::collections::HashMap;

use api::query::{self, Flow};
use api::ApiError;
use axum::extract::{Path, Query};
use control_plane_core::{
    AttemptQuery, DeliveryListRequest, DeliveryState, Endpoint, EndpointId, EndpointKey,
    PortalRole, Timestamp,
};
use maud::{html, Markup};
use serde::Deserialize;

use super::PortalSession;
use crate::deliveries::attempts_table;
use crate::layout::{
    answer, button, csrf_field, id_cell, json_block, notice, pager, portal_page, segment, state,
    table, when, At, PortalTab,
};
use crate::reason::{endpoint_state, why};
use crate::recover::WINDOWS;
use crate::{ItemPath, Page, Shared};

/// A portal page as an answer.
pub(super) fn show(title: &str, tab: PortalTab, session: &PortalSession, body: &Markup) -> Page {
    Ok(answer(portal_page(
        title,
        Some(tab),
        Some(&session.csrf),
        body,
    )))
}

/// The page of endpoint `id`.
pub(super) fn endpoint_href(id: EndpointId) -> String {
    format!("/portal/endpoints/{id}")
}

/// The account's flow, its endpoints cut to those the link shows.
async fn flow_shown(s: &Shared, session: &PortalSession) -> Result<Flow, ApiError> {
    let mut flow = query::flow(s.store(), &session.link.account, s.endpoint_concurrency()).await?;
    flow.endpoints.retain(|e| session.link.shows(e.id));
    Ok(flow)
}

/// The link's endpoints, with their state.
pub(crate) async fn endpoints(s: Shared, session: PortalSession) -> Page {
    let now = s.now();
    let flow = flow_shown(&s, &session).await?;
    let rows: Vec<Vec<Markup>> = flow
        .endpoints
        .iter()
        .map(|e| {
            vec![
                html! { a.url href=(endpoint_href(e.id)) { (e.destination_label()) } },
                state(&endpoint_state(e, &flow.circuit(e.id), now), now),
                html! { (e.description.as_deref().unwrap_or("")) },
                html! { (subscription(e)) },
            ]
        })
        .collect();
    let adds = session.link.role == PortalRole::Manager && session.link.endpoints.is_empty();
    let body = html! {
        p.muted { "Account " (session.link.account.as_str()) " · signed in as a "
            strong id="role" { (session.link.role.as_str()) } }
        (table("endpoints", &["url", "state", "description", "event types"], &rows,
            "No endpoint yet."))
        @if adds {
            p { a href="/portal/endpoints/new" id="add-endpoint" { "Add an endpoint" } }
        }
    };
    show("Endpoints", PortalTab::Endpoints, &session, &body)
}

/// The event types an endpoint takes, as text.
pub(super) fn subscription(e: &Endpoint) -> String {
    if e.event_types.is_empty() {
        "every type".into()
    } else {
        e.event_types.join(", ")
    }
}

#[derive(Deserialize)]
pub(crate) struct Done {
    done: Option<String>,
}

/// One endpoint: its settings and state, its newest attempts, and (for a
/// manager) its edit form and actions.
pub(crate) async fn endpoint(
    s: Shared,
    session: PortalSession,
    Path(p): Path<ItemPath>,
    Query(done): Query<Done>,
) -> Page {
    let id = session.endpoint(&p.id)?;
    let account = &session.link.account;
    let e = s.store().endpoint_get(account, id).await?;
    let circuit = s.store().circuit_get(account, id).await?;
    let mut q = AttemptQuery::new(account.clone(), query::page_request(Some(20), None)?);
    q.endpoint = Some(id);
    let attempts = s.store().attempt_search(q).await?.items;
    let now = s.now();
    let body = html! {
        @if let Some(d) = done.done.as_deref() { (notice(&format!("Done: {d}."))) }
        dl.facts {
            dt { "id" } dd { span.id title=(id) { (id) } }
            dt { "url" } dd { (e.destination_label()) }
            dt { "state" } dd { (state(&endpoint_state(&e, &circuit, now), now)) }
            dt { "description" } dd { (e.description.as_deref().unwrap_or("")) }
            dt { "event types" } dd { (subscription(&e)) }
            dt { "created" } dd { (when(e.created_at, now)) }
        }
        p { a href={ "/portal/deliveries?endpoint=" (id) } id="its-deliveries" { "Its deliveries" }
            " · " a href={ "/portal/attempts?endpoint=" (id) } { "Its attempts" } }
        @if session.link.role == PortalRole::Manager { (manage(&e, &session.csrf)) }
        h2 { "Newest attempts" }
        (table("attempts", &ATTEMPT_HEAD, &attempt_rows(&attempts, now), "No attempt yet."))
    };
    show(e.destination_label(), PortalTab::Endpoints, &session, &body)
}

/// A manager's forms for endpoint `e`: edit, enable or disable, rotate
/// the secret, recover a window, delete.
fn manage(e: &Endpoint, csrf: &str) -> Markup {
    let base = endpoint_href(e.id);
    html! {
        h2 { "Change" }
        form.login method="post" action={ (base) "/edit" } {
            (csrf_field(csrf))
            @if !e.is_poll() {
                label for="url" { "URL" }
                input type="url" id="url" name="url" value=(e.url) required;
            }
            label for="description" { "Description" }
            input type="text" id="description" name="description"
                value=(e.description.as_deref().unwrap_or(""));
            label for="event_types" { "Event types (comma-separated; empty: every type)" }
            input type="text" id="event_types" name="event_types" value=(e.event_types.join(", "));
            button type="submit" id="save" { "Save" }
        }
        p.actions {
            @if e.enabled {
                (button(&format!("{base}/disable"), csrf, "Disable", "disable"))
            } @else {
                (button(&format!("{base}/enable"), csrf, "Enable", "enable"))
            }
            (button(&format!("{base}/rotate-secret"), csrf, "Rotate secret", "rotate"))
            form.inline method="post" action={ (base) "/recover" } {
                (csrf_field(csrf))
                select name="hours" aria-label="window" {
                    @for h in WINDOWS { option value=(h) { "last " (h) " h" } }
                }
                button type="submit" id="recover" { "Recover" }
            }
            (button(&format!("{base}/delete"), csrf, "Delete", "delete"))
        }
    }
}

/// The columns of [`attempt_rows`].
const ATTEMPT_HEAD: [&str; 7] = [
    "delivery", "#", "result", "status", "latency", "error", "when",
];

/// Rows of attempts, each linking its delivery.
fn attempt_rows(items: &[control_plane_core::AttemptRecord], now: Timestamp) -> Vec<Vec<Markup>> {
    items
        .iter()
        .map(|a| {
            let d = a.delivery_id.to_string();
            vec![
                id_cell(&d, Some(&format!("/portal/deliveries/{}", segment(&d)))),
                html! { (a.attempt) },
                html! { span.nowrap { (a.result.as_str()) } },
                html! { (a.status_code.map(|c| c.to_string()).unwrap_or_default()) },
                html! { span.nowrap { (a.latency_ms) " ms" } },
                html! { (a.error.as_deref().unwrap_or("")) },
                when(a.recorded_at, now),
            ]
        })
        .collect()
}

#[derive(Deserialize)]
pub(crate) struct Filters {
    endpoint: Option<String>,
    state: Option<String>,
    cursor: Option<String>,
    prev: Option<String>,
}

/// The endpoint a listing filters by: the one asked for (`404` outside the
/// link), or for a link that names endpoints and none asked, its first.
fn endpoint_filter(
    session: &PortalSession,
    asked: Option<&str>,
) -> Result<Option<EndpointId>, crate::UiError> {
    match asked.filter(|v| !v.is_empty()) {
        Some(v) => session.endpoint(v).map(Some),
        None => Ok(session.link.endpoints.first().copied()),
    }
}

/// A select of the link's endpoints (`any` for a whole-account link).
fn endpoint_select(flow: &Flow, chosen: Option<EndpointId>, any: bool) -> Markup {
    html! {
        select name="endpoint" id="endpoint" aria-label="endpoint" {
            @if any { option value="" { "every endpoint" } }
            @for e in &flow.endpoints {
                option value=(e.id) selected[chosen == Some(e.id)] { (e.destination_label()) }
            }
        }
    }
}

/// Deliveries newest first, by endpoint and state.
pub(crate) async fn deliveries(
    s: Shared,
    session: PortalSession,
    Query(q): Query<Filters>,
) -> Page {
    let endpoint = endpoint_filter(&session, q.endpoint.as_deref())?;
    let st = query::delivery_state(q.state.as_deref())?;
    let mut req = DeliveryListRequest::all(
        session.link.account.clone(),
        query::page_request(Some(50), q.cursor.as_deref())?,
    );
    (req.state, req.endpoint_id) = (st, endpoint);
    let mut found = query::delivery_page(s.store(), req, s.endpoint_concurrency()).await?;
    found.flow.endpoints.retain(|e| session.link.shows(e.id));
    let now = s.now();
    let urls: HashMap<EndpointId, &str> = found
        .flow
        .endpoints
        .iter()
        .map(|e| (e.id, e.destination_label()))
        .collect();
    let rows: Vec<Vec<Markup>> = found
        .deliveries
        .items
        .iter()
        .map(|d| {
            vec![
                id_cell(
                    &d.id.to_string(),
                    Some(&format!("/portal/deliveries/{}", d.id)),
                ),
                state(&why(d, &found.flow, now), now),
                html! { a.url href=(endpoint_href(d.endpoint_id)) {
                (urls.get(&d.endpoint_id).copied().unwrap_or("(deleted)")) } },
                html! { span.nowrap { (d.attempts) " / " (d.max_attempts) } },
                html! { (d.last_error.as_deref().unwrap_or("")) },
                when(d.updated_at, now),
            ]
        })
        .collect();
    let extra = format!(
        "{}{}",
        endpoint
            .map(|e| format!("&endpoint={e}"))
            .unwrap_or_default(),
        st.map(|s| format!("&state={}", s.as_str()))
            .unwrap_or_default()
    );
    let at = At {
        cursor: q.cursor.as_deref(),
        prev: q.prev.as_deref(),
    };
    let next = found.deliveries.next;
    let body = html! {
        form.filters method="get" action="/portal/deliveries" {
            (endpoint_select(&found.flow, endpoint, session.link.endpoints.is_empty()))
            select name="state" aria-label="state" {
                option value="" { "every state" }
                @for s in [DeliveryState::Pending, DeliveryState::Leased,
                           DeliveryState::Delivered, DeliveryState::Dead] {
                    option value=(s.as_str()) selected[st == Some(s)] { (s.as_str()) }
                }
            }
            button type="submit" { "Filter" }
        }
        (table("deliveries", &["delivery", "state", "endpoint", "attempts", "last error", "updated"],
            &rows, "No delivery."))
        (pager("/portal/deliveries", &extra, at, rows.len(), next))
    };
    show("Deliveries", PortalTab::Deliveries, &session, &body)
}

/// One delivery with its event and attempts; a manager may replay it
/// when it is dead.
pub(crate) async fn delivery(
    s: Shared,
    session: PortalSession,
    Path(p): Path<ItemPath>,
    Query(done): Query<Done>,
) -> Page {
    let account = &session.link.account;
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let r = query::delivery_record(s.store(), account, id, s.endpoint_concurrency()).await?;
    let d = &r.delivery.delivery;
    if !session.link.shows(d.endpoint_id) {
        return Err(ApiError::not_found("delivery").into());
    }
    let now = s.now();
    let payload = serde_json::from_str::<serde_json::Value>(&r.event.body).ok();
    let replay = session.link.role == PortalRole::Manager && d.state == DeliveryState::Dead;
    let body = html! {
        @if let Some(d) = done.done.as_deref() { (notice(&format!("Done: {d}."))) }
        dl.facts {
            dt { "state" } dd { (state(&why(d, &r.flow, now), now)) }
            dt { "endpoint" } dd { a href=(endpoint_href(d.endpoint_id)) {
                (r.url().unwrap_or("(deleted)")) } }
            dt { "event type" } dd { (r.event.event_type) }
            dt { "attempts" } dd { (d.attempts) " / " (d.max_attempts) }
            dt { "created" } dd { (when(d.created_at, now)) }
        }
        @if replay {
            (button(&format!("/portal/deliveries/{}/replay", d.id), &session.csrf, "Replay", "replay"))
        }
        h2 { "Payload" }
        (json_block(payload.as_ref()))
        (attempts_table(&r.delivery.attempts, now))
    };
    show(
        &format!("Delivery {}", d.id),
        PortalTab::Deliveries,
        &session,
        &body,
    )
}

/// Attempts newest first, by endpoint.
pub(crate) async fn attempts(s: Shared, session: PortalSession, Query(q): Query<Filters>) -> Page {
    let endpoint = endpoint_filter(&session, q.endpoint.as_deref())?;
    let flow = flow_shown(&s, &session).await?;
    let mut aq = AttemptQuery::new(
        session.link.account.clone(),
        query::page_request(Some(50), q.cursor.as_deref())?,
    );
    aq.endpoint = endpoint;
    let found = s.store().attempt_search(aq).await?;
    let rows = attempt_rows(&found.items, s.now());
    let extra = endpoint
        .map(|e| format!("&endpoint={e}"))
        .unwrap_or_default();
    let at = At {
        cursor: q.cursor.as_deref(),
        prev: q.prev.as_deref(),
    };
    let body = html! {
        form.filters method="get" action="/portal/attempts" {
            (endpoint_select(&flow, endpoint, session.link.endpoints.is_empty()))
            button type="submit" { "Filter" }
        }
        (table("attempts", &ATTEMPT_HEAD, &rows, "No attempt."))
        (pager("/portal/attempts", &extra, at, rows.len(), found.next))
    };
    show("Attempts", PortalTab::Attempts, &session, &body)
}

/// The account's event types, with their descriptions and schemas.
pub(crate) async fn event_types(s: Shared, session: PortalSession) -> Page {
    let types = s.store().event_type_list(&session.link.account).await?;
    let rows: Vec<Vec<Markup>> = types
        .iter()
        .map(|t| {
            vec![
                html! { span.nowrap { (t.name) } },
                html! { (t.description) },
                json_block(t.schema.as_ref()),
                json_block(t.example.as_ref()),
            ]
        })
        .collect();
    let body = table(
        "event-types",
        &["name", "description", "schema", "example"],
        &rows,
        "No event type is registered.",
    );
    show("Event types", PortalTab::EventTypes, &session, &body)
}

/// The key of endpoint `id` of the session's account.
pub(super) fn key<'a>(session: &'a PortalSession, id: &'a EndpointId) -> EndpointKey<'a> {
    EndpointKey::new(&session.link.account, *id)
}
