//! The attempts page: the account's attempt log newest first, filtered by
//! endpoint, result, status code and time (the API's attempt search).

use std::time::Duration;

use api::ApiError;
use axum::extract::{Query, State};
use control_plane_core::{AccountId, AttemptQuery, AttemptRecord, AttemptResult, Timestamp};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{base, endpoint_href, id_cell, pager, segment, table, when, At, Tab};
use crate::pages::show;
use crate::session::AccountPage;
use crate::Page;
use crate::Shared;

#[derive(Deserialize)]
pub(crate) struct AttemptFilters {
    endpoint: Option<String>,
    result: Option<String>,
    status_code: Option<String>,
    /// Only attempts of the last this many hours.
    within: Option<String>,
    cursor: Option<String>,
    /// The cursors of the pages before this one (see `layout::At`).
    prev: Option<String>,
}

/// The windows of the time filters: hours back, and how the page says it.
pub(crate) const WITHIN: [(&str, &str); 3] = [
    ("1", "in the last hour"),
    ("24", "in the last day"),
    ("168", "in the last week"),
];

/// The start of the time window `within` (one of [`WITHIN`]) before `now`.
pub(crate) fn since(within: Option<&str>, now: Timestamp) -> Result<Option<Timestamp>, ApiError> {
    within
        .map(|w| {
            WITHIN
                .iter()
                .find(|(v, _)| *v == w)
                .and_then(|(v, _)| v.parse::<u64>().ok())
                .map(|hours| now.minus(Duration::from_secs(hours * 3600)))
                .ok_or_else(|| ApiError::bad_request("within: expected 1, 24 or 168 hours"))
        })
        .transpose()
}

/// The store's query for the page's filters (endpoint, result, status
/// code, each as typed) and cursor.
fn attempt_query(
    account: &AccountId,
    (endpoint, result, status): (Option<&str>, Option<&str>, Option<&str>),
    cursor: Option<&str>,
) -> Result<AttemptQuery, ApiError> {
    let mut query = AttemptQuery::new(account.clone(), api::query::page_request(Some(50), cursor)?);
    if let Some(e) = endpoint {
        query = query.of_endpoint(e.parse().map_err(|_| ApiError::not_found("endpoint"))?);
    }
    if let Some(r) = result {
        query.result = Some(r.parse::<AttemptResult>().map_err(|_| {
            ApiError::bad_request("result: expected delivered, failed or lease_expired")
        })?);
    }
    if let Some(c) = status {
        query.status_code = Some(
            c.parse::<u16>()
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(|| ApiError::bad_request("status code: expected 100 to 599"))?,
        );
    }
    Ok(query)
}

/// The filters of the page as given (empty ones dropped): endpoint,
/// result, status code and time window.
type Given = [Option<String>; 4];

/// The query string that keeps the filters `given` on another page.
fn kept(given: &Given) -> String {
    ["endpoint", "result", "status_code", "within"]
        .iter()
        .zip(given)
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("&{k}={}", segment(v))))
        .collect()
}

/// The filter form, showing the filters in force.
fn filter_form(path: &str, [endpoint, result, status, within]: &Given) -> Markup {
    html! {
        form.inline method="get" action=(path) id="attempt-filters" {
            label for="f-endpoint" { "Endpoint id" }
            input id="f-endpoint" name="endpoint" value=(endpoint.as_deref().unwrap_or(""));
            label for="f-result" { "Result" }
            select id="f-result" name="result" {
                option value="" { "any" }
                @for r in ["delivered", "failed", "lease_expired"] {
                    option value=(r) selected[result.as_deref() == Some(r)] { (r) }
                }
            }
            label for="f-status" { "Status code" }
            input id="f-status" name="status_code" value=(status.as_deref().unwrap_or("")) size="4";
            label for="f-within" { "Recorded" }
            select id="f-within" name="within" {
                option value="" { "any time" }
                @for (v, label) in WITHIN {
                    option value=(v) selected[within.as_deref() == Some(v)] { (label) }
                }
            }
            button type="submit" id="filter-attempts" { "Filter" }
        }
    }
}

/// The rows of a page of attempts.
fn attempt_rows(account: &AccountId, items: &[AttemptRecord], now: Timestamp) -> Vec<Vec<Markup>> {
    let root = base(account);
    items
        .iter()
        .map(|a| {
            let (d, e) = (a.delivery_id.to_string(), a.endpoint_id.to_string());
            vec![
                id_cell(&d, Some(&format!("{root}/deliveries/{}", segment(&d)))),
                id_cell(&e, Some(&endpoint_href(account, &e))),
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

/// One page of the account's attempts, newest first, filtered.
pub(crate) async fn page(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<AttemptFilters>,
) -> Page {
    let given = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let filters: Given = [
        given(&q.endpoint),
        given(&q.result),
        given(&q.status_code),
        given(&q.within),
    ];
    let [endpoint, result, status, within] = &filters;
    let mut query = attempt_query(
        &account,
        (endpoint.as_deref(), result.as_deref(), status.as_deref()),
        q.cursor.as_deref(),
    )?;
    let now = s.now();
    query.since = since(within.as_deref(), now)?;
    let found = s.store().attempt_search(query).await?;
    let path = format!("{}/attempts", base(&account));
    let at = At {
        cursor: q.cursor.as_deref(),
        prev: q.prev.as_deref(),
    };
    let body = html! {
        (filter_form(&path, &filters))
        (table(
            "attempts",
            &["delivery", "endpoint", "attempt", "result", "status", "latency", "error", "recorded"],
            &attempt_rows(&account, &found.items, now),
            "No attempt.",
        ))
        (pager(&path, &kept(&filters), at, found.items.len(), found.next))
    };
    show("Attempts", &account, Tab::Attempts, &session, &body)
}
