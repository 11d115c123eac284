//! The dashboard's event-type catalogue: each registered type with its
//! description, schema and example, and a form that sends the example to
//! one endpoint (as `POST .../endpoints/{id}/send-example` does).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use control_plane_core::{Endpoint, EventType, UsageMetric};
use serde::Deserialize;

use super::html::{base, csrf_field, esc, segment, table, Tab};
use super::pages::{show, AccountPath};
use super::{Session, UiError};
use crate::error::ApiError;
use crate::ApiState;

/// JSON, indented, escaped, in a `<pre>`; a dash when absent.
fn json_block(v: Option<&serde_json::Value>) -> String {
    v.and_then(|v| serde_json::to_string_pretty(v).ok())
        .map_or_else(|| "–".into(), |t| format!("<pre>{}</pre>", esc(&t)))
}

/// The send-example form of type `t`: a choice of the account's endpoints.
fn send_form(t: &EventType, endpoints: &[Endpoint], csrf: &str) -> String {
    if t.example.is_none() {
        return "no example".into();
    }
    if endpoints.is_empty() {
        return "no endpoint".into();
    }
    let options: String = endpoints
        .iter()
        .map(|e| format!("<option value=\"{}\">{}</option>", e.id, esc(&e.url)))
        .collect();
    format!(
        "<form method=\"post\" action=\"{}/event-types/{}/send-example\" class=\"inline\">{}\
         <select name=\"endpoint\" aria-label=\"endpoint\">{options}</select>\
         <button type=\"submit\" id=\"send-example-{}\">Send example</button></form>",
        esc(&base(&t.account)),
        esc(&segment(&t.name)),
        csrf_field(csrf),
        esc(&t.name)
    )
}

/// Every registered type of the account.
pub(crate) async fn page(
    State(s): State<Arc<ApiState>>,
    session: Session,
    Path(p): Path<AccountPath>,
) -> Result<Response, UiError> {
    let account = session.caller.reach(&p.account)?;
    let endpoints = s.store.endpoint_list(&account).await?;
    let rows: Vec<Vec<String>> = s
        .store
        .event_type_list(&account)
        .await?
        .iter()
        .map(|t| {
            vec![
                format!("<code>{}</code>", esc(&t.name)),
                esc(&t.description),
                json_block(t.schema.as_ref()),
                json_block(t.example.as_ref()),
                send_form(t, &endpoints, &session.csrf),
            ]
        })
        .collect();
    let body = table(
        "event-types",
        &["type", "description", "schema", "example", "send example"],
        &rows,
        "No event type registered yet (PUT /v1/accounts/{account}/event-types/{name}).",
    );
    show("Event types", &account, Tab::EventTypes, &session, &body)
}

#[derive(Deserialize)]
pub(crate) struct TypePath {
    account: String,
    name: String,
}

#[derive(Deserialize)]
pub(crate) struct SendForm {
    csrf: String,
    endpoint: String,
}

/// Sends the type's example to the chosen endpoint and shows its delivery.
pub(crate) async fn send_example(
    State(s): State<Arc<ApiState>>,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<TypePath>,
    Form(form): Form<SendForm>,
) -> Result<Response, UiError> {
    let account = session.act(&headers, &form.csrf, &p.account)?;
    let endpoint = form
        .endpoint
        .parse()
        .map_err(|_| ApiError::not_found("endpoint"))?;
    let published = s
        .store
        .event_type_send_example(&account, &p.name, endpoint)
        .await?;
    s.usage.add(&account, UsageMetric::EventsPublished, 1);
    let to = match published.deliveries.first() {
        Some(d) => format!("{}/deliveries/{d}", base(&account)),
        None => format!("{}/event-types", base(&account)),
    };
    Ok(Redirect::to(&to).into_response())
}
