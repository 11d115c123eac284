//! The account's portal links (ADR 0049), for its operator: each with its
//! role, its reach, when it ends and whether it was opened, and a button
//! that revokes it (its sessions end at once). Links are made with the API.

use api::ApiError;
use axum::extract::{Path, State};
use control_plane_core::{AccountId, PortalLink, Timestamp};
use maud::{html, Markup};

use crate::layout::{base, button, endpoint_href, id_cell, notice, table, when, Tab};
use crate::pages::show;
use crate::session::{AccountPage, Action, CsrfForm};
use crate::{to, ItemPath, Page, Shared};

/// The page.
pub(crate) async fn page(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    uri: axum::http::Uri,
) -> Page {
    let links = s.store().portal_link_list(&account).await?;
    let now = s.now();
    let rows: Vec<Vec<Markup>> = links
        .iter()
        .map(|l| row(&account, l, &session.csrf, now))
        .collect();
    let revoked = uri.query().is_some_and(|q| q.contains("revoked=1"));
    let body = html! {
        @if revoked { (notice("Link revoked: its sessions have ended.")) }
        p {
            "Links that open a consumer view of this account are made with the API ("
            code { "POST /v1/accounts/" (account) "/portal-links" }
            "); each opens once, until it expires or is revoked here."
        }
        (table(
            "portal-links",
            &["link", "role", "endpoints", "created", "ends", "state", ""],
            &rows,
            "No portal link.",
        ))
    };
    show("Portal links", &account, Tab::Endpoints, &session, &body)
}

fn row(account: &AccountId, l: &PortalLink, csrf: &str, now: Timestamp) -> Vec<Markup> {
    let id = l.id.to_string();
    vec![
        id_cell(&id, None),
        html! { (l.role.as_str()) },
        html! {
            @if l.endpoints.is_empty() { "every endpoint" }
            @for e in &l.endpoints {
                (id_cell(&e.to_string(), Some(&endpoint_href(account, &e.to_string())))) " "
            }
        },
        when(l.created_at, now),
        when(l.expires_at, now),
        html! {
            @match (l.revoked_at, l.redeemed_at) {
                (Some(t), _) => { "revoked " (when(t, now)) }
                (None, Some(t)) => { "opened " (when(t, now)) }
                (None, None) => { "not opened yet" }
            }
        },
        html! {
            @if l.revoked_at.is_none() {
                (button(
                    &format!("{}/portal-links/{id}/revoke", base(account)),
                    csrf,
                    "Revoke",
                    &format!("revoke-{id}"),
                ))
            }
        },
    ]
}

/// Revokes a link of the account (`404` for another account's).
pub(crate) async fn revoke(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, .. }: Action<CsrfForm>,
) -> Page {
    let id =
        p.id.parse()
            .map_err(|_| ApiError::not_found("portal link"))?;
    s.store().portal_link_revoke(&account, id).await?;
    to(&format!("{}/portal-links?revoked=1", base(&account)))
}
