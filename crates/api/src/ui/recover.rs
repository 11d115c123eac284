//! The dashboard's recovery of an endpoint: a form on the endpoints page
//! that queues the same task as `POST .../endpoints/{id}/recover`, then
//! shows that task (its state, and its counts once it completes).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use control_plane_core::{Endpoint, Recovery};
use serde::Deserialize;

use super::html::{base, csrf_field, esc, segment};
use super::pages::ItemPath;
use super::{Session, UiError};
use crate::error::ApiError;
use crate::routes::queue_recovery;
use crate::ApiState;

/// The windows the form offers, in hours back from now.
const WINDOWS: [u32; 5] = [1, 6, 24, 72, 168];

/// The recover form of endpoint `e`.
pub(crate) fn form(e: &Endpoint, csrf: &str) -> String {
    let options: String = WINDOWS
        .iter()
        .map(|h| format!("<option value=\"{h}\">last {h} h</option>"))
        .collect();
    format!(
        "<form method=\"post\" action=\"{}/endpoints/{}/recover\" class=\"inline\">{}\
         <select name=\"hours\" aria-label=\"window\">{options}</select>\
         <button type=\"submit\" id=\"recover-{}\">Recover</button></form>",
        esc(&base(&e.account)),
        e.id,
        csrf_field(csrf),
        e.id
    )
}

#[derive(Deserialize)]
pub(crate) struct RecoverForm {
    csrf: String,
    hours: u32,
}

/// Queues the recovery of the window the form names and shows its task.
pub(crate) async fn recover(
    State(s): State<Arc<ApiState>>,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<ItemPath>,
    Form(form): Form<RecoverForm>,
) -> Result<Response, UiError> {
    let account = session.act(&headers, &form.csrf, &p.account)?;
    if !WINDOWS.contains(&form.hours) {
        return Err(ApiError::invalid(format!("hours must be one of {WINDOWS:?}")).into());
    }
    let endpoint = p.id.parse().map_err(|_| ApiError::not_found("endpoint"))?;
    let now = s.clock.now();
    let since = now.minus(Duration::from_secs(u64::from(form.hours) * 3600));
    let recovery = Recovery::new(endpoint, since, now)?;
    let task = queue_recovery(&s.store, account.clone(), recovery).await?;
    Ok(Redirect::to(&format!(
        "{}/tasks?id={}",
        base(&account),
        segment(task.id.as_str())
    ))
    .into_response())
}
