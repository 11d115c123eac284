//! A manager's actions in the portal: add, edit, disable, enable and
//! delete endpoints, rotate a secret, recover a window, replay a dead
//! delivery. Each checks the session's role and the link's endpoints
//! before it changes anything; a viewer is answered `403`.

use std::time::Duration;

use api::{query, ApiError};
use axum::extract::{Path, State};
use control_plane_core::{
    Enablement, EndpointCreateRequest, EndpointUpdateRequest, Recovery, Secret, SignatureScheme,
};
use maud::{html, Markup};
use serde::Deserialize;

use super::pages::{endpoint_href, key, show};
use super::{PortalAction, PortalSession};
use crate::layout::{csrf_field, notice, PortalTab};
use crate::recover::WINDOWS;
use crate::session::{CsrfForm, Posted};
use crate::{to, ItemPath, Page, Shared};

/// A manager of a link for every endpoint of the account: the one who may
/// add endpoints (a link that names endpoints would not show a new one).
fn may_add(session: &PortalSession) -> Result<(), crate::UiError> {
    session.manager()?;
    if session.link.endpoints.is_empty() {
        Ok(())
    } else {
        Err(
            ApiError::forbidden("this portal link shows some endpoints only: it cannot add one")
                .into(),
        )
    }
}

/// The form fields of an endpoint.
fn fields() -> Markup {
    html! {
        label for="url" { "URL" }
        input type="url" id="url" name="url" required;
        label for="description" { "Description" }
        input type="text" id="description" name="description";
        label for="event_types" { "Event types (comma-separated; empty: every type)" }
        input type="text" id="event_types" name="event_types";
    }
}

/// The form that adds an endpoint (a manager's, of a whole-account link).
pub(crate) async fn endpoint_new(session: PortalSession) -> Page {
    may_add(&session)?;
    let body = html! {
        form.login method="post" action="/portal/endpoints" {
            (csrf_field(&session.csrf))
            (fields())
            button type="submit" id="create" { "Add" }
        }
    };
    show("Add an endpoint", PortalTab::Endpoints, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct EndpointForm {
    csrf: String,
    /// Absent from a poll endpoint's edit form, which has no URL.
    url: Option<String>,
    description: Option<String>,
    event_types: Option<String>,
}

impl Posted for EndpointForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl EndpointForm {
    /// The event types, from their comma-separated list.
    fn types(&self) -> Vec<String> {
        self.event_types
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The description, none when empty.
    fn description(&self) -> Option<String> {
        self.description
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_string)
    }
}

/// Adds an endpoint within the account's quota and shows its signing
/// secret, this once.
pub(crate) async fn endpoint_add(
    State(s): Shared,
    PortalAction { session, form }: PortalAction<EndpointForm>,
) -> Page {
    may_add(&session)?;
    let secret = query::given_or_new_secret(None, SignatureScheme::Hmac)?;
    let mut req = EndpointCreateRequest::new(
        session.link.account.clone(),
        form.url.as_deref().unwrap_or_default().trim(),
        Secret::new(secret.clone()),
    );
    req.event_types = form.types();
    req.description = form.description();
    let e = query::create_endpoint(&s, req).await?;
    let body = html! {
        (notice("Added."))
        p { "Its signing secret, shown this once (the page is not cached): copy it to the receiver now." }
        pre id="new-secret" { (secret) }
        p { a href=(endpoint_href(e.id)) id="to-endpoint" { "To the endpoint" } }
    };
    show("Endpoint added", PortalTab::Endpoints, &session, &body)
}

/// Changes an endpoint's URL, description and event types.
pub(crate) async fn endpoint_edit(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    PortalAction { session, form }: PortalAction<EndpointForm>,
) -> Page {
    session.manager()?;
    let id = session.endpoint(&p.id)?;
    let req = EndpointUpdateRequest {
        // A poll endpoint's form has no URL field: nothing to change.
        url: form.url.as_deref().map(|u| u.trim().to_string()),
        event_types: Some(form.types()),
        description: Some(form.description()),
        ..EndpointUpdateRequest::default()
    };
    s.store().endpoint_update(key(&session, &id), req).await?;
    to(&format!("{}?done=saved", endpoint_href(id)))
}

#[derive(Deserialize)]
pub(crate) struct ActionPath {
    id: String,
    action: String,
}

#[derive(Deserialize)]
pub(crate) struct ActionForm {
    csrf: String,
    hours: Option<u32>,
}

impl Posted for ActionForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `enable`, `disable`, `rotate-secret`, `recover` or `delete` an endpoint.
pub(crate) async fn endpoint_action(
    State(s): Shared,
    Path(p): Path<ActionPath>,
    PortalAction { session, form }: PortalAction<ActionForm>,
) -> Page {
    session.manager()?;
    let id = session.endpoint(&p.id)?;
    let store = s.store();
    let done = match p.action.as_str() {
        "enable" => {
            store
                .endpoint_set_enabled(key(&session, &id), Enablement::Enabled)
                .await?;
            "enabled"
        }
        "disable" => {
            let reason = Some("disabled in the portal".to_string());
            store
                .endpoint_set_enabled(key(&session, &id), Enablement::Disabled { reason })
                .await?;
            "disabled"
        }
        "rotate-secret" => return rotated(&s, &session, id).await,
        "recover" => {
            let hours = form
                .hours
                .filter(|h| WINDOWS.contains(h))
                .ok_or_else(|| ApiError::invalid(format!("hours must be one of {WINDOWS:?}")))?;
            let now = s.now();
            let since = now.minus(Duration::from_secs(u64::from(hours) * 3600));
            let recovery = Recovery::new(id, since, now)?;
            query::queue_recovery(store, session.link.account.clone(), recovery).await?;
            "recovery queued"
        }
        "delete" => {
            store.endpoint_delete(&session.link.account, id).await?;
            return to("/portal/endpoints");
        }
        _ => return Err(ApiError::not_found("route").into()),
    };
    to(&format!(
        "{}?done={}",
        endpoint_href(id),
        done.replace(' ', "+")
    ))
}

/// Rotates the endpoint's secret and shows the new one, this once.
async fn rotated(
    s: &api::ApiState,
    session: &PortalSession,
    id: control_plane_core::EndpointId,
) -> Page {
    let (_, secret) = query::rotate_secret(s, key(session, &id), None).await?;
    let body = html! {
        (notice("Rotated: requests are signed with the new secret, and with the previous one for a while."))
        p { "The new secret, shown this once (the page is not cached): copy it to the receiver now." }
        pre id="new-secret" { (secret) }
        p { a href=(endpoint_href(id)) { "Back to the endpoint" } }
    };
    show("Secret rotated", PortalTab::Endpoints, session, &body)
}

/// Replays a dead delivery of one of the link's endpoints.
pub(crate) async fn replay(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    PortalAction { session, .. }: PortalAction<CsrfForm>,
) -> Page {
    session.manager()?;
    let account = &session.link.account;
    let id = p.id.parse().map_err(|_| ApiError::not_found("delivery"))?;
    let d = s.store().delivery_get(account, id).await?;
    if !session.link.shows(d.endpoint_id) {
        return Err(ApiError::not_found("delivery").into());
    }
    s.store().delivery_replay(account, id).await?;
    to(&format!("/portal/deliveries/{id}?done=replayed"))
}
