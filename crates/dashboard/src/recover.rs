//! The recovery of an endpoint: a form on the endpoints page that queues
//! the same task as `POST .../endpoints/{id}/recover`, then shows that task
//! (its state, and its counts once it completes).

use std::time::Duration;

use api::query;
use api::ApiError;
use axum::extract::{Path, State};
use control_plane_core::{Endpoint, Recovery};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{base, csrf_field, segment};
use crate::session::{Action, Posted};
use crate::Page;
use crate::{to, ItemPath, Shared};

/// The windows the form offers, in hours back from now.
pub(crate) const WINDOWS: [u32; 5] = [1, 6, 24, 72, 168];

/// The recover form of endpoint `e`.
pub(crate) fn form(e: &Endpoint, csrf: &str) -> Markup {
    html! {
        form.inline method="post" action={ (base(&e.account)) "/endpoints/" (e.id) "/recover" } {
            (csrf_field(csrf))
            select name="hours" aria-label="window" {
                @for h in WINDOWS { option value=(h) { "last " (h) " h" } }
            }
            button type="submit" id={ "recover-" (e.id) } { "Recover" }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct RecoverForm {
    csrf: String,
    hours: u32,
}

impl Posted for RecoverForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Queues the recovery of the window the form names and shows its task.
pub(crate) async fn recover(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, form }: Action<RecoverForm>,
) -> Page {
    if !WINDOWS.contains(&form.hours) {
        return Err(ApiError::invalid(format!("hours must be one of {WINDOWS:?}")).into());
    }
    let endpoint = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let now = s.now();
    let since = now.minus(Duration::from_secs(u64::from(form.hours) * 3600));
    let recovery = Recovery::new(endpoint, since, now)?;
    let task = query::queue_recovery(s.store(), account.clone(), recovery).await?;
    to(&format!(
        "{}/tasks?id={}",
        base(&account),
        segment(task.id.as_str())
    ))
}
