//! The event-type catalogue: each registered type with its description,
//! schema and example, and a form that sends the example to one endpoint
//! (as `POST .../endpoints/{id}/send-example` does).

use api::query;
use api::ApiError;
use axum::extract::{Path, State};
use control_plane_core::{Endpoint, EventType};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{base, csrf_field, json_block, segment, table, Tab};
use crate::pages::show;
use crate::session::{AccountPage, Action, Posted};
use crate::Page;
use crate::{to, Shared};

/// The send-example form of type `t`: a choice of the account's endpoints.
fn send_form(t: &EventType, endpoints: &[Endpoint], csrf: &str) -> Markup {
    html! {
        @if t.example.is_none() {
            "no example"
        } @else if endpoints.is_empty() {
            "no endpoint"
        } @else {
            form.inline method="post"
                action={ (base(&t.account)) "/event-types/" (segment(&t.name)) "/send-example" } {
                (csrf_field(csrf))
                select name="endpoint" aria-label="endpoint" {
                    @for e in endpoints { option value=(e.id) { (e.destination_label()) } }
                }
                button type="submit" id={ "send-example-" (t.name) } { "Send example" }
            }
        }
    }
}

/// Every registered type of the account.
pub(crate) async fn page(State(s): Shared, AccountPage { session, account }: AccountPage) -> Page {
    let c = query::catalogue(s.store(), &account).await?;
    let rows: Vec<Vec<Markup>> = c
        .types
        .iter()
        .map(|t| {
            vec![
                html! { code { (t.name) } },
                html! { (t.description) },
                json_block(t.schema.as_ref()),
                json_block(t.example.as_ref()),
                send_form(t, &c.endpoints, &session.csrf),
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
    name: String,
}

#[derive(Deserialize)]
pub(crate) struct SendForm {
    csrf: String,
    endpoint: String,
}

impl Posted for SendForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// Sends the type's example to the chosen endpoint and shows its delivery.
pub(crate) async fn send_example(
    State(s): Shared,
    Path(p): Path<TypePath>,
    Action { account, form }: Action<SendForm>,
) -> Page {
    let endpoint = form
        .endpoint
        .parse()
        .map_err(|_| ApiError::not_found("endpoint"))?;
    let published = query::send_example(&s, &account, &p.name, endpoint).await?;
    match published.deliveries.first() {
        Some(d) => to(&format!("{}/deliveries/{d}", base(&account))),
        None => to(&format!("{}/event-types", base(&account))),
    }
}
