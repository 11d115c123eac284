//! The dashboard's pages and actions. Each resolves the session's reach to
//! the account in the path first (as the API does), so an account key gets
//! `404` for every page of another account.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use control_plane_core::{
    AccountId, AttemptRecord, CircuitMode, Delivery, DeliveryListRequest, DeliveryState, Endpoint,
    EndpointId, PageRequest, ReplayFilter,
};
use serde::Deserialize;

use super::html::{self, bars, base, button, esc, header_names, link, notice, table, time, Tab};
use super::{CsrfForm, Session, UiError};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::page as page_request;
use crate::ApiState;

pub(super) type Shared = State<Arc<ApiState>>;
pub(super) type Page = Result<Response, UiError>;

pub(super) fn show(
    title: &str,
    account: &AccountId,
    tab: Tab,
    session: &Session,
    body: &str,
) -> Page {
    Ok(Html(html::page(
        title,
        Some((account, tab)),
        Some(&session.csrf),
        body,
    ))
    .into_response())
}

#[derive(Deserialize)]
pub(crate) struct AccountPath {
    pub(super) account: String,
}

#[derive(Deserialize)]
pub(crate) struct ItemPath {
    pub(super) account: String,
    pub(super) id: String,
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
            let mut by_account: Vec<(AccountId, u64)> = Vec::new();
            for (account, _, n) in s.store.delivery_count_by_account_and_state().await? {
                match by_account.last_mut() {
                    Some((a, total)) if *a == account => *total += n,
                    _ => by_account.push((account, n)),
                }
            }
            let rows: Vec<Vec<String>> = by_account
                .iter()
                .map(|(a, n)| vec![link(&base(a), a.as_str()), n.to_string()])
                .collect();
            let body = format!(
                "<form method=\"get\" action=\"/ui\" class=\"inline\">\
                 <label for=\"account\">Account</label>\
                 <input id=\"account\" name=\"account\" required>\
                 <button type=\"submit\" id=\"open-account\">Open</button></form>\
                 <h2>Accounts with deliveries</h2>{}",
                table(
                    "accounts",
                    &["account", "deliveries"],
                    &rows,
                    "No account has deliveries yet."
                )
            );
            return Ok(
                Html(html::page("Accounts", None, Some(&session.csrf), &body)).into_response(),
            );
        }
    };
    Ok(Redirect::to(&base(&account)).into_response())
}

/// Queue depth by state, deliveries per minute, open circuits, disabled
/// endpoints, dead letters and the latest alerts of one account.
pub(crate) async fn overview(
    State(s): Shared,
    session: Session,
    Path(p): Path<AccountPath>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let mut counts: HashMap<DeliveryState, u64> = HashMap::new();
    for (a, state, n) in s.store.delivery_count_by_account_and_state().await? {
        if a == account {
            counts.insert(state, n);
        }
    }
    let mut body = String::from("<section class=\"cards\">");
    for state in [
        DeliveryState::Pending,
        DeliveryState::Leased,
        DeliveryState::Delivered,
        DeliveryState::Dead,
    ] {
        let _ = write!(
            body,
            "<div class=\"card\"><span class=\"figure\" id=\"count-{0}\">{1}</span>\
             <span class=\"label\">{0}</span></div>",
            state.as_str(),
            counts.get(&state).copied().unwrap_or(0)
        );
    }
    body.push_str("</section>");

    body.push_str(&per_minute(&s, &account).await?);
    body.push_str(&troubled_endpoints(&s, &account).await?);
    let _ = write!(
        body,
        "<h2>Dead letters</h2><p><span id=\"dead-count\">{}</span> dead deliveries. {}</p>",
        counts.get(&DeliveryState::Dead).copied().unwrap_or(0),
        link(&format!("{}/dead", base(&account)), "Review and replay")
    );
    let alerts = s.store.alert_list(&account, PageRequest::first(10)).await?;
    let rows: Vec<Vec<String>> = alerts
        .items
        .iter()
        .map(|a| vec![time(a.created_at), esc(a.kind.as_str()), esc(&a.message)])
        .collect();
    let _ = write!(
        body,
        "<h2>Latest alerts</h2>{}",
        table("alerts", &["when", "kind", "message"], &rows, "No alert.")
    );
    show("Overview", &account, Tab::Overview, &session, &body)
}

/// The overview's deliveries per minute over the last 30 minutes, from the
/// newest 1,000 delivered (a busier account shows the most recent of them).
async fn per_minute(s: &ApiState, account: &AccountId) -> Result<String, UiError> {
    let now = s.clock.now();
    let delivered = s
        .store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Delivered),
            ..DeliveryListRequest::all(account.clone(), PageRequest::first(1000))
        })
        .await?;
    let mut per_minute = [0u64; 30];
    for d in &delivered.items {
        let age = now.since(d.updated_at).as_secs() / 60;
        if let Some(slot) = usize::try_from(age)
            .ok()
            .and_then(|a| 29usize.checked_sub(a))
        {
            per_minute[slot] += 1;
        }
    }
    Ok(format!(
        "<h2>Deliveries per minute</h2><p>last minute: <span id=\"per-minute\">{}</span>{}</p>",
        per_minute[29],
        bars("deliveries per minute, last 30 minutes", &per_minute)
    ))
}

/// The overview's endpoints in trouble: open circuits and disabled endpoints
/// (of the first 500).
async fn troubled_endpoints(s: &ApiState, account: &AccountId) -> Result<String, UiError> {
    let endpoints = s.store.endpoint_list(account).await?;
    let mut open = Vec::new();
    let mut disabled = Vec::new();
    for e in endpoints.iter().take(500) {
        let c = s.store.circuit_get(account, e.id).await?;
        if c.mode != CircuitMode::Closed {
            open.push(vec![
                esc(&e.url),
                esc(c.mode.as_str()),
                c.consecutive_failures.to_string(),
                c.open_until.map(time).unwrap_or_default(),
            ]);
        }
        if !e.enabled {
            disabled.push(vec![
                esc(&e.url),
                esc(e.disabled_reason.as_deref().unwrap_or("")),
            ]);
        }
    }
    Ok(format!(
        "<h2>Open circuits</h2>{}<h2>Disabled endpoints</h2>{}",
        table(
            "open-circuits",
            &["endpoint", "mode", "consecutive failures", "open until"],
            &open,
            "No open circuit."
        ),
        table(
            "disabled-endpoints",
            &["endpoint", "reason"],
            &disabled,
            "No disabled endpoint."
        ),
    ))
}

/// The "in flight / cap" cell: leased deliveries of the endpoint.
fn in_flight(e: &Endpoint, leased: &HashMap<EndpointId, u64>) -> String {
    let n = leased.get(&e.id).copied().unwrap_or(0);
    match e.max_in_flight {
        Some(cap) => format!("{n} / {cap}"),
        None => format!("{n} / default"),
    }
}

/// Every endpoint with its circuit, flow limits, last hour's success rate
/// and response times, and a chart of its last 30 response times.
pub(crate) async fn endpoints(
    State(s): Shared,
    session: Session,
    Path(p): Path<AccountPath>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let leased_page = s
        .store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Leased),
            ..DeliveryListRequest::all(account.clone(), PageRequest::first(1000))
        })
        .await?;
    let mut leased: HashMap<EndpointId, u64> = HashMap::new();
    for d in &leased_page.items {
        *leased.entry(d.endpoint_id).or_default() += 1;
    }
    let hour_ago = s.clock.now().minus(Duration::from_secs(3600));
    let mut rows = Vec::new();
    for e in s.store.endpoint_list(&account).await?.iter().take(200) {
        let c = s.store.circuit_get(&account, e.id).await?;
        let stats = s.store.attempt_stats(&account, e.id, hour_ago).await?;
        let recent = s
            .store
            .attempt_list_for_endpoint(&account, e.id, PageRequest::first(30))
            .await?;
        let latencies: Vec<u64> = recent.items.iter().rev().map(|a| a.latency_ms).collect();
        rows.push(vec![
            endpoint_cell(e),
            enabled_cell(e),
            format!(
                "{} ({} failures)",
                esc(c.mode.as_str()),
                c.consecutive_failures
            ),
            in_flight(e, &leased),
            e.rate_limit_per_s
                .map_or_else(|| "none".into(), |r| format!("{r}/s")),
            stats
                .success_rate()
                .map_or_else(|| "–".into(), |r| format!("{:.1}%", r * 100.0)),
            format!(
                "{} / {}",
                stats
                    .p50_latency_ms
                    .map_or_else(|| "–".into(), |v| format!("{v} ms")),
                stats
                    .p95_latency_ms
                    .map_or_else(|| "–".into(), |v| format!("{v} ms"))
            ),
            bars("response times of the last 30 attempts, ms", &latencies),
            super::recover::form(e, &session.csrf),
        ]);
    }
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

/// The endpoints page's first cell: URL, description, filter and the names
/// of its custom headers.
fn endpoint_cell(e: &Endpoint) -> String {
    format!(
        "<span class=\"url\">{}</span><br><small>{}</small>{}{}",
        esc(&e.url),
        esc(e.description.as_deref().unwrap_or("")),
        e.filter.as_ref().map_or_else(String::new, |f| format!(
            "<br><small>filter: <code>{}</code></small>",
            esc(&f.to_text())
        )),
        header_names(e)
    )
}

/// Whether an endpoint is enabled, with the reason when it is not.
fn enabled_cell(e: &Endpoint) -> String {
    if e.enabled {
        "enabled".to_string()
    } else {
        format!(
            "disabled: {}",
            esc(e.disabled_reason.as_deref().unwrap_or(""))
        )
    }
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    cursor: Option<String>,
    replayed: Option<u64>,
}

/// One page of delivery rows (a link to each) and the link to the next.
fn delivery_rows(
    account: &AccountId,
    items: &[Delivery],
    urls: &HashMap<EndpointId, String>,
    replay: Option<&str>,
) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|d| {
            let href = format!("{}/deliveries/{}", base(account), d.id);
            let mut row = vec![
                link(&href, &d.id.to_string()),
                esc(urls.get(&d.endpoint_id).map_or("(deleted)", String::as_str)),
                esc(d.state.as_str()),
                format!("{} / {}", d.attempts, d.max_attempts),
                esc(d.last_error.as_deref().unwrap_or("")),
                time(d.updated_at),
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

async fn endpoint_urls(
    s: &ApiState,
    account: &AccountId,
) -> Result<(Vec<Endpoint>, HashMap<EndpointId, String>), UiError> {
    let endpoints = s.store.endpoint_list(account).await?;
    let urls = endpoints.iter().map(|e| (e.id, e.url.clone())).collect();
    Ok((endpoints, urls))
}

pub(super) fn next_link(path: &str, extra: &str, next: Option<i64>) -> String {
    next.map(|n| {
        format!(
            "<p>{}</p>",
            link(&format!("{path}?cursor={n}{extra}"), "Next page")
        )
    })
    .unwrap_or_default()
}

/// The account's deliveries, newest first, optionally of one state.
pub(crate) async fn deliveries(
    State(s): Shared,
    session: Session,
    Path(p): Path<AccountPath>,
    Query(q): Query<ListQuery>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let state = match q.state.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => Some(
            v.parse::<DeliveryState>()
                .map_err(|_| ApiError::bad_request(format!("unknown state {v:?}")))?,
        ),
        None => None,
    };
    let page = s
        .store
        .delivery_list(DeliveryListRequest {
            state,
            ..DeliveryListRequest::all(
                account.clone(),
                page_request(Some(50), q.cursor.as_deref())?,
            )
        })
        .await?;
    let (_, urls) = endpoint_urls(&s, &account).await?;
    let path = format!("{}/deliveries", base(&account));
    let mut body = String::from("<p class=\"filters\">");
    body.push_str(&link(&path, "all"));
    for st in ["pending", "leased", "delivered", "dead"] {
        body.push(' ');
        body.push_str(&link(&format!("{path}?state={st}"), st));
    }
    body.push_str("</p>");
    body.push_str(&table(
        "deliveries",
        &[
            "delivery",
            "endpoint",
            "state",
            "attempts",
            "last error",
            "updated",
        ],
        &delivery_rows(&account, &page.items, &urls, None),
        "No delivery.",
    ));
    let extra = state
        .map(|st| format!("&state={}", st.as_str()))
        .unwrap_or_default();
    body.push_str(&next_link(&path, &extra, page.next));
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
    session: Session,
    Path(p): Path<ItemPath>,
    Query(q): Query<DoneQuery>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let d = s.store.delivery_get(&account, id).await?;
    let attempts = s.store.attempt_list_for_delivery(&account, id).await?;
    let event = s.store.event_get(&account, d.event_id).await?;
    let url = match s.store.endpoint_get(&account, d.endpoint_id).await {
        Ok(e) => e.url,
        Err(control_plane_core::StoreError::NotFound { .. }) => "(endpoint deleted)".into(),
        Err(e) => return Err(e.into()),
    };
    let mut body = String::new();
    if q.replayed.is_some() {
        body.push_str(&notice("Replayed: the delivery is pending again."));
    }
    if q.resent.is_some() {
        body.push_str(&notice(
            "Resent: the delivery is pending again, under the same webhook-id.",
        ));
    }
    let facts = [
        ("state", esc(d.state.as_str())),
        ("attempts", format!("{} of {}", d.attempts, d.max_attempts)),
        ("event type", esc(&event.event_type)),
        ("event", esc(&event.id.to_string())),
        ("due", time(d.due_at)),
        ("last error", esc(d.last_error.as_deref().unwrap_or(""))),
        ("created", time(d.created_at)),
        ("updated", time(d.updated_at)),
    ];
    body.push_str("<dl class=\"facts\">");
    for (k, v) in facts {
        let _ = write!(
            body,
            "<dt>{k}</dt><dd id=\"fact-{}\">{v}</dd>",
            k.replace(' ', "-")
        );
    }
    body.push_str("</dl>");
    if d.state == DeliveryState::Dead {
        body.push_str(&button(
            &format!("{}/deliveries/{}/replay", base(&account), d.id),
            &session.csrf,
            "Replay this delivery",
            "replay",
        ));
    }
    if d.state == DeliveryState::Delivered {
        body.push_str(&button(
            &format!("{}/deliveries/{}/resend", base(&account), d.id),
            &session.csrf,
            "Resend this delivery",
            "resend",
        ));
    }
    let _ = write!(
        body,
        "<h2>Request</h2><pre id=\"request\">POST {url}\n\
         content-type: application/json\n\
         webhook-id: {id}\n\
         webhook-timestamp: (the Unix time of each attempt)\n\
         webhook-signature: v1,(HMAC-SHA256 with the endpoint's secret, not shown)\n\n\
         {payload}</pre>",
        url = esc(&url),
        id = d.id,
        payload = esc(&event.body),
    );
    body.push_str(&attempts_table(&attempts));
    show("Delivery", &account, Tab::Deliveries, &session, &body)
}

/// A delivery's attempts as the delivery page shows them.
fn attempts_table(attempts: &[AttemptRecord]) -> String {
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                esc(a.result.as_str()),
                a.status_code.map(|c| c.to_string()).unwrap_or_default(),
                esc(a.error.as_deref().unwrap_or("")),
                format!("{} ms", a.latency_ms),
                time(a.recorded_at),
                a.next_attempt_at.map(time).unwrap_or_default(),
                format!(
                    "<pre class=\"answer\">{}</pre>",
                    esc(a.response_body.as_deref().unwrap_or(""))
                ),
            ]
        })
        .collect();
    format!(
        "<h2>Attempts</h2>{}",
        table(
            "attempts",
            &[
                "#",
                "result",
                "status",
                "error",
                "latency",
                "at",
                "next attempt",
                "answer"
            ],
            &rows,
            "No attempt yet."
        )
    )
}

/// Replays one dead delivery.
pub(crate) async fn delivery_replay(
    State(s): Shared,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<ItemPath>,
    Form(form): Form<CsrfForm>,
) -> Page {
    let account = session.act(&headers, &form.csrf, &p.account)?;
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let d = s.store.delivery_replay(&account, id).await?;
    Ok(Redirect::to(&format!(
        "{}/deliveries/{}?replayed=1",
        base(&account),
        d.id
    ))
    .into_response())
}

/// Resends one finished delivery.
pub(crate) async fn delivery_resend(
    State(s): Shared,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<ItemPath>,
    Form(form): Form<CsrfForm>,
) -> Page {
    let account = session.act(&headers, &form.csrf, &p.account)?;
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let d = s.store.delivery_resend(&account, id).await?;
    Ok(Redirect::to(&format!("{}/deliveries/{}?resent=1", base(&account), d.id)).into_response())
}

/// Dead deliveries, newest first, each with a replay button, and the bulk
/// replay form (by endpoint and how long ago they died).
pub(crate) async fn dead(
    State(s): Shared,
    session: Session,
    Path(p): Path<AccountPath>,
    Query(q): Query<ListQuery>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let page = s
        .store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Dead),
            ..DeliveryListRequest::all(
                account.clone(),
                page_request(Some(50), q.cursor.as_deref())?,
            )
        })
        .await?;
    let (endpoints, urls) = endpoint_urls(&s, &account).await?;
    let path = format!("{}/dead", base(&account));
    let mut body = String::new();
    if let Some(n) = q.replayed {
        body.push_str(&notice(&format!("Replayed {n} dead deliveries.")));
    }
    let mut options = String::from("<option value=\"\">every endpoint</option>");
    for e in &endpoints {
        let _ = write!(
            options,
            "<option value=\"{}\">{}</option>",
            e.id,
            esc(&e.url)
        );
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"{path}/replay\" class=\"bulk\">{csrf}\
         <label for=\"endpoint_id\">Endpoint</label>\
         <select id=\"endpoint_id\" name=\"endpoint_id\">{options}</select>\
         <label for=\"within_hours\">Died within</label>\
         <select id=\"within_hours\" name=\"within_hours\">\
         <option value=\"\">any time</option><option value=\"1\">the last hour</option>\
         <option value=\"24\">the last day</option><option value=\"168\">the last week</option>\
         </select><button type=\"submit\" id=\"replay-all\">Replay matching dead deliveries</button>\
         </form>",
        csrf = html::csrf_field(&session.csrf),
    );
    body.push_str(&table(
        "dead",
        &[
            "delivery",
            "endpoint",
            "state",
            "attempts",
            "last error",
            "died",
            "",
        ],
        &delivery_rows(&account, &page.items, &urls, Some(&session.csrf)),
        "No dead delivery.",
    ));
    body.push_str(&next_link(&path, "", page.next));
    show("Dead letters", &account, Tab::Dead, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct BulkReplayForm {
    csrf: String,
    endpoint_id: Option<String>,
    within_hours: Option<String>,
}

/// Replays every dead delivery the form matches, in one statement.
pub(crate) async fn dead_replay(
    State(s): Shared,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<AccountPath>,
    Form(form): Form<BulkReplayForm>,
) -> Page {
    let account = session.act(&headers, &form.csrf, &p.account)?;
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
            s.clock
                .now()
                .minus(Duration::from_secs(hours.saturating_mul(3600))),
        );
    }
    let n = s.store.delivery_replay_dead(filter).await?;
    Ok(Redirect::to(&format!("{}/dead?replayed={n}", base(&account))).into_response())
}
