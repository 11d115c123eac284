//! Dead letters: the listing with a replay button each, and the bulk
//! replay, which first shows what it will do ("Replay 44 dead deliveries of
//! 3 endpoints") and asks once more before it runs.

use std::time::Duration;

use api::query::{self, ReplayPreview, DEAD_SAMPLE};
use api::ApiError;
use axum::extract::{Query, State};
use control_plane_core::{
    AccountId, DeliveryListRequest, DeliveryState, Endpoint, ReplayFilter, Timestamp,
};
use maud::{html, Markup};
use serde::Deserialize;

use crate::deliveries::{delivery_cells, DELIVERY_HEAD};
use crate::layout::{base, button, csrf_field, notice, pager, table, At, Tab};
use crate::pages::show;
use crate::session::{AccountPage, Action, Posted};
use crate::{to, Page, Shared};

#[derive(Deserialize)]
pub(crate) struct DeadQuery {
    cursor: Option<String>,
    /// The cursors of the pages before this one (see `layout::At`).
    prev: Option<String>,
    replayed: Option<u64>,
}

/// The windows the bulk replay offers, in hours back from now.
const WINDOWS: [(&str, &str); 4] = [
    ("", "any time"),
    ("1", "the last hour"),
    ("24", "the last day"),
    ("168", "the last week"),
];

/// Dead deliveries, newest first, each with a replay button, and the bulk
/// replay form (by endpoint and how long ago they died).
pub(crate) async fn dead(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<DeadQuery>,
) -> Page {
    let page = query::page_request(Some(50), q.cursor.as_deref())?;
    let req = DeliveryListRequest {
        state: Some(DeliveryState::Dead),
        ..DeliveryListRequest::all(account.clone(), page)
    };
    let found = query::delivery_page(s.store(), req, s.endpoint_concurrency()).await?;
    let now = s.now();
    let path = format!("{}/dead", base(&account));
    let rows: Vec<Vec<Markup>> = found
        .deliveries
        .items
        .iter()
        .map(|d| {
            let mut row = delivery_cells(&account, &found, d, now);
            row.push(button(
                &format!("{}/deliveries/{}/replay", base(&account), d.id),
                &session.csrf,
                "Replay",
                &format!("replay-{}", d.id),
            ));
            row
        })
        .collect();
    let mut head = DELIVERY_HEAD.to_vec();
    head.push("");
    let body = html! {
        @if let Some(n) = q.replayed {
            (notice(&format!("Replayed {n} dead deliveries.")))
        }
        form.bulk method="post" action={ (path) "/replay" } {
            (csrf_field(&session.csrf))
            label for="endpoint_id" { "Endpoint" }
            select id="endpoint_id" name="endpoint_id" {
                option value="" { "every endpoint" }
                @for e in &found.flow.endpoints {
                    option value=(e.id) { (e.destination_label()) }
                }
            }
            label for="within_hours" { "Died within" }
            select id="within_hours" name="within_hours" {
                @for (v, label) in WINDOWS { option value=(v) { (label) } }
            }
            button type="submit" id="replay-all" { "Replay matching dead deliveries…" }
        }
        (table("dead", &head, &rows, "No dead delivery."))
        (pager(&path, "", At { cursor: q.cursor.as_deref(), prev: q.prev.as_deref() }, found.deliveries.items.len(), found.deliveries.next))
    };
    show("Dead letters", &account, Tab::Dead, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct BulkReplayForm {
    csrf: String,
    endpoint_id: Option<String>,
    within_hours: Option<String>,
    /// Present once the operator confirmed what the replay will do.
    confirm: Option<String>,
}

impl Posted for BulkReplayForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// The replay filter a bulk replay form names, at `now`.
fn replay_filter(
    account: &AccountId,
    form: &BulkReplayForm,
    now: Timestamp,
) -> Result<ReplayFilter, ApiError> {
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
        filter.dead_since = Some(now.minus(Duration::from_secs(hours.saturating_mul(3600))));
    }
    Ok(filter)
}

/// A bulk replay: the first post shows what it will do and asks once
/// more; the confirmed one replays every dead delivery the form matches,
/// in one statement.
pub(crate) async fn dead_replay(
    State(s): Shared,
    Action { account, form }: Action<BulkReplayForm>,
) -> Page {
    let filter = replay_filter(&account, &form, s.now())?;
    if form.confirm.as_deref() == Some("yes") {
        let n = s.store().delivery_replay_dead(filter).await?;
        return to(&format!("{}/dead?replayed={n}", base(&account)));
    }
    let preview = query::replay_preview(s.store(), &filter).await?;
    let endpoint = match filter.endpoint_id {
        Some(id) => Some(s.store().endpoint_get(&account, id).await?),
        None => None,
    };
    let body = confirm_body(&account, &form, preview, endpoint.as_ref());
    Ok(crate::layout::answer(crate::layout::page(
        "Replay dead deliveries?",
        Some((&account, Tab::Dead)),
        Some(&form.csrf),
        &body,
    )))
}

/// What a bulk replay will do, as a sentence: "Replay 44 dead deliveries of
/// 3 endpoints".
pub(crate) fn replay_sentence(p: ReplayPreview) -> String {
    let (count, endpoints) = (p.count, p.endpoints);
    let n = if count.more {
        format!("at least {}", count.n)
    } else {
        count.n.to_string()
    };
    let deliveries = if count.n == 1 && !count.more {
        "dead delivery"
    } else {
        "dead deliveries"
    };
    let at_least = if p.more_endpoints { "at least " } else { "" };
    let of = if endpoints == 1 {
        format!("{at_least}1 endpoint")
    } else {
        format!("{at_least}{endpoints} endpoints")
    };
    format!("Replay {n} {deliveries} of {of}")
}

/// The confirmation page of a bulk replay: what it matches, and the same
/// form again with `confirm`.
fn confirm_body(
    account: &AccountId,
    form: &BulkReplayForm,
    preview: ReplayPreview,
    endpoint: Option<&Endpoint>,
) -> Markup {
    let path = format!("{}/dead", base(account));
    let window = WINDOWS
        .iter()
        .find(|(v, _)| Some(*v) == form.within_hours.as_deref().or(Some("")))
        .map_or("any time", |(_, l)| l);
    html! {
        p.confirm id="replay-summary" {
            strong { (replay_sentence(preview)) } "?"
        }
        p {
            "Endpoint: " (endpoint.map_or("every endpoint", |e| e.destination_label()))
            ". Died within: " (window) ". "
            "Each goes back to the queue with a fresh attempt budget, under its own webhook-id."
            @if preview.count.more {
                " The count is of the newest " (DEAD_SAMPLE) " dead letters; the replay takes every match."
            }
        }
        @if preview.count.n == 0 && !preview.count.more {
            p.empty { "Nothing matches: there is nothing to replay." }
        } @else {
            form.inline method="post" action={ (path) "/replay" } {
                (csrf_field(&form.csrf))
                input type="hidden" name="endpoint_id" value=(form.endpoint_id.as_deref().unwrap_or(""));
                input type="hidden" name="within_hours" value=(form.within_hours.as_deref().unwrap_or(""));
                input type="hidden" name="confirm" value="yes";
                button.danger type="submit" id="confirm-replay" { (replay_sentence(preview)) }
            }
        }
        " " a href=(path) id="cancel" { "Cancel" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::query::Count;

    #[test]
    fn the_replay_says_how_many_of_how_many_endpoints() {
        let p = |n, more, endpoints, more_endpoints| ReplayPreview {
            count: Count { n, more },
            endpoints,
            more_endpoints,
        };
        assert_eq!(
            replay_sentence(p(44, false, 3, false)),
            "Replay 44 dead deliveries of 3 endpoints"
        );
        assert_eq!(
            replay_sentence(p(1, false, 1, false)),
            "Replay 1 dead delivery of 1 endpoint"
        );
        assert_eq!(
            replay_sentence(p(100, true, 2, true)),
            "Replay at least 100 dead deliveries of at least 2 endpoints"
        );
        assert_eq!(
            replay_sentence(p(20_000, false, 1, true)),
            "Replay 20000 dead deliveries of at least 1 endpoint"
        );
    }
}
