//! The account's alerts, newest first, 50 a page, each linked to the
//! endpoint and the delivery it names.

use api::query;
use axum::extract::{Query, State};
use maud::html;
use serde::Deserialize;

use crate::layout::{alerts_table, base, pager, At, Tab};
use crate::pages::show;
use crate::session::AccountPage;
use crate::{Page, Shared};

#[derive(Deserialize)]
pub(crate) struct AlertsQuery {
    cursor: Option<String>,
    /// The cursors of the pages before this one (see `layout::At`).
    prev: Option<String>,
}

/// One page of the account's alerts.
pub(crate) async fn page(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<AlertsQuery>,
) -> Page {
    let page = query::page_request(Some(50), q.cursor.as_deref())?;
    let found = s.store().alert_list(&account, page).await?;
    let path = format!("{}/alerts", base(&account));
    let body = html! {
        (alerts_table(&account, &found.items, s.now(), "No alert."))
        (pager(&path, "", At { cursor: q.cursor.as_deref(), prev: q.prev.as_deref() }, found.items.len(), found.next))
    };
    show("Alerts", &account, Tab::Alerts, &session, &body)
}
