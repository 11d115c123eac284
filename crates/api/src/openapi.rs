//! The router and its OpenAPI 3.1 document, built from one list of
//! handlers: a route cannot exist without its description, and every answer
//! is serialized by the type its schema is generated from.
//!
//! What every authenticated operation shares (the bearer scheme and the
//! error answers) is added here once instead of on each handler.

use std::sync::Arc;

use serde_json::{json, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, PathItem, Ref, RefOr, ResponseBuilder};
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{code_for, ErrorBody};
use crate::{routes as r, ApiState};

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "control-plane",
        description = "Durable webhook delivery and workflow queue. Every route under \
            `/v1/accounts/{account}`, `/v1/sessions` and `/metrics` needs `Authorization: Bearer <token>`: \
            the admin token reaches every account, an account key only its own (anything \
            else answers `404`). Every error has the shape `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "service", description = "Health, readiness, metrics and this document"),
        (name = "keys", description = "Account keys and erasure (admin only)"),
        (name = "sessions", description = "Dashboard sessions (admin only)"),
        (name = "portal", description = "Portal links: one-time sign-ins to a consumer view of an account"),
        (name = "endpoints", description = "Where deliveries go"),
        (name = "events", description = "What is published"),
        (name = "event types", description = "The catalogue of event types, with their schemas and examples"),
        (name = "deliveries", description = "One event to one endpoint, with its attempts"),
        (name = "tasks", description = "The leased workflow queue"),
        (name = "usage", description = "Hourly usage counters"),
        (name = "alerts", description = "Operational alerts"),
    ),
)]
struct Doc;

/// Every route with its description, before the state is given.
pub(crate) fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::with_openapi(Doc::openapi())
        .routes(routes!(crate::healthz))
        .routes(routes!(crate::readyz))
        .routes(routes!(crate::render_metrics))
        .routes(routes!(crate::serve_openapi))
        .routes(routes!(r::admin::key_create))
        .routes(routes!(r::admin::key_revoke))
        .routes(routes!(r::admin::account_erase))
        .routes(routes!(r::admin::session_list))
        .routes(routes!(r::admin::session_revoke))
        .routes(routes!(
            r::portal::portal_link_create,
            r::portal::portal_link_list
        ))
        .routes(routes!(r::portal::portal_link_revoke))
        .routes(routes!(
            r::endpoints::endpoint_create,
            r::endpoints::endpoint_list
        ))
        .routes(routes!(
            r::endpoints::endpoint_get,
            r::endpoints::endpoint_update,
            r::endpoints::endpoint_delete
        ))
        .routes(routes!(r::endpoints::endpoint_rotate))
        .routes(routes!(r::endpoints::endpoint_enable))
        .routes(routes!(r::endpoints::endpoint_disable))
        .routes(routes!(r::endpoints::endpoint_stats))
        .routes(routes!(r::endpoints::endpoint_recover))
        .routes(routes!(r::poll::endpoint_poll))
        .routes(routes!(r::event_types::endpoint_send_example))
        .routes(routes!(r::event_types::event_type_list))
        .routes(routes!(
            r::event_types::event_type_put,
            r::event_types::event_type_get,
            r::event_types::event_type_delete
        ))
        .routes(routes!(r::events::event_publish, r::events::event_list))
        .routes(routes!(r::events::event_publish_batch))
        .routes(routes!(r::events::event_get))
        .routes(routes!(r::deliveries::delivery_list))
        .routes(routes!(r::deliveries::attempt_search))
        .routes(routes!(r::deliveries::endpoint_attempt_search))
        .routes(routes!(r::deliveries::delivery_replay_dead))
        .routes(routes!(r::deliveries::delivery_get))
        .routes(routes!(r::deliveries::delivery_replay))
        .routes(routes!(r::deliveries::delivery_resend))
        .routes(routes!(r::tasks::task_enqueue, r::tasks::task_list))
        .routes(routes!(r::tasks::task_get))
        .routes(routes!(r::tasks::task_retry))
        .routes(routes!(r::tasks::task_list_dead))
        .routes(routes!(r::operations::usage))
        .routes(routes!(r::operations::alerts))
}

/// The statuses any authenticated operation may answer with an error.
const ERRORS: [u16; 9] = [400, 401, 404, 409, 413, 415, 422, 429, 503];

/// Where an answer's ids lead (OpenAPI links): the operations that take
/// the id a response carries, so a client or a fuzzer (schemathesis's
/// stateful phase) can follow a creation to the item it created.
/// (path, method, status, where the id is, the operations it feeds.)
const LINKS: &[(&str, &str, &str, &str, &[&str])] = &[
    (
        "/v1/accounts/{account}/endpoints",
        "post",
        "201",
        "$response.body#/id",
        &[
            "endpoint_get",
            "endpoint_update",
            "endpoint_delete",
            "endpoint_rotate",
            "endpoint_enable",
            "endpoint_disable",
            "endpoint_stats",
        ],
    ),
    (
        "/v1/accounts/{account}/events",
        "post",
        "202",
        "$response.body#/id",
        &["event_get"],
    ),
    (
        "/v1/accounts/{account}/tasks",
        "post",
        "201",
        "$response.body#/id",
        &["task_get", "task_retry"],
    ),
    (
        "/v1/accounts/{account}/keys",
        "post",
        "201",
        "$response.body#/id",
        &["key_revoke"],
    ),
    (
        "/v1/accounts/{account}/portal-links",
        "post",
        "201",
        "$response.body#/id",
        &["portal_link_revoke"],
    ),
];

/// Adds the links of [`LINKS`] to their responses. (Written into the JSON:
/// `utoipa` 5.5 serializes a link's `operationId` as `operation_id`.)
fn add_links(doc: &mut Value) {
    for (path, method, status, id, targets) in LINKS {
        let pointer = format!(
            "/paths/{}/{method}/responses/{status}",
            path.replace('~', "~0").replace('/', "~1")
        );
        let Some(Value::Object(response)) = doc.pointer_mut(&pointer) else {
            continue;
        };
        let links = response
            .entry("links")
            .or_insert_with(|| Value::Object(Default::default()));
        let Value::Object(links) = links else {
            continue;
        };
        for target in *targets {
            let name = format!("{target}_{}", id.rsplit('/').next().unwrap_or("id"));
            links.insert(
                name,
                json!({
                    "operationId": target,
                    "parameters": {"account": "$request.path.account", "id": id},
                }),
            );
        }
    }
}

/// Adds the bearer scheme, and the error answers and security requirement
/// of every operation that needs a token.
fn finish(mut doc: OpenApi) -> OpenApi {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The admin token or an account key"))
                .build(),
        ),
    );
    for (path, item) in doc.paths.paths.iter_mut() {
        let secured = path.starts_with("/v1/accounts/")
            || path.starts_with("/v1/sessions")
            || path == "/metrics";
        for op in operations(item) {
            let statuses: &[u16] = if secured { &ERRORS } else { &[503] };
            if secured {
                op.security = Some(vec![SecurityRequirement::new(
                    "bearer",
                    Vec::<String>::new(),
                )]);
            }
            for status in statuses {
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| error_response(*status));
            }
        }
    }
    doc
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

fn error_response(status: u16) -> RefOr<utoipa::openapi::Response> {
    let reason = axum::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    RefOr::T(
        ResponseBuilder::new()
            .description(format!("{reason} (`{}`)", code_for_u16(status)))
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build(),
    )
}

fn code_for_u16(status: u16) -> &'static str {
    axum::http::StatusCode::from_u16(status)
        .map(code_for)
        .unwrap_or("error")
}

/// The OpenAPI document of the API as it is built, as JSON.
pub fn document() -> Value {
    to_json(routes().split_for_parts().1)
}

/// The document the routes gave, finished, as JSON with its links.
pub(crate) fn to_json(doc: OpenApi) -> Value {
    let mut doc = serde_json::to_value(finish(doc)).unwrap_or(Value::Null);
    add_links(&mut doc);
    add_idempotency_keys(&mut doc);
    doc
}

/// Documents the `Idempotency-Key` header on every mutating operation that
/// [`crate::idempotency`] covers (publishing documents its own), with the
/// `409` it may answer. (Written into the JSON: one rule for every route.)
fn add_idempotency_keys(doc: &mut Value) {
    let Some(Value::Object(paths)) = doc.pointer_mut("/paths") else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        for method in ["post", "patch", "delete"] {
            let m = axum::http::Method::from_bytes(method.to_uppercase().as_bytes())
                .unwrap_or(axum::http::Method::POST);
            let Some(Value::Object(op)) = item.get_mut(method) else {
                continue;
            };
            if !crate::idempotency::covered(&m, path) {
                continue;
            }
            if let Value::Array(params) = op
                .entry("parameters")
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                params.push(json!({
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": false,
                    "description": "1 to 255 visible ASCII characters: the same request again gets the first answer (with `Idempotent-Replayed: true`); another request with the key is 422; one while the first runs is 409. Keys belong to the caller that authenticated (an account key, or the admin on the path's account): no record is kept for a request without a valid token or on another account's route, a revoked key replays nothing, and a replay shows `null` for a secret the first answer showed",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                }));
            }
            if let Some(Value::Object(responses)) = op.get_mut("responses") {
                responses.entry("409").or_insert_with(|| {
                    json!({
                        "description": "A request with this Idempotency-Key is still running",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    })
                });
                responses.entry("422").or_insert_with(|| {
                    json!({
                        "description": "The Idempotency-Key was used for another request",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    })
                });
            }
        }
    }
}
