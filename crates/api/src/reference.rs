//! The HTTP API reference in Markdown (`docs/api.md`), written from the
//! OpenAPI document the routes generate, so that the reference cannot drift
//! from the code: `cargo xtask openapi` rewrites it, and a test fails when
//! the committed file differs.
//!
//! The same document is browsable at `/docs` (`interactive`): Swagger UI,
//! its assets embedded in the binary when it is built, so the page needs
//! no CDN and works offline.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::Router;
use serde_json::Value;

use crate::ApiState;

/// What the reference's page may load: its own assets and the document,
/// from this origin only; the inline styles and `data:` images Swagger UI
/// uses; never framed.
const DOCS_POLICY: &str =
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The interactive reference at `/docs` (no token needed to read it; a
/// request tried from it carries the token the reader enters).
pub(crate) fn interactive() -> Router<Arc<ApiState>> {
    let ui = utoipa_swagger_ui::SwaggerUi::new("/docs")
        .config(utoipa_swagger_ui::Config::from("/v1/openapi.json"));
    Router::from(ui).layer(axum::middleware::map_response(
        |mut response: Response| async move {
            response.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(DOCS_POLICY),
            );
            response
        },
    ))
}

/// The methods in the order an operation's section lists them.
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// The reference of `doc` (an OpenAPI 3.1 document) as Markdown.
pub fn markdown(doc: &Value) -> String {
    let mut out = String::new();
    let title = doc["info"]["title"].as_str().unwrap_or("API");
    let _ = writeln!(out, "# {title}: HTTP API reference\n");
    out.push_str(
        "Generated from `openapi.json` by `cargo xtask openapi`; CI fails when it is stale, \
         so do not edit it by hand. The running service serves the same document at \
         `/v1/openapi.json`.\n\n",
    );
    if let Some(d) = doc["info"]["description"].as_str() {
        let _ = writeln!(out, "{d}\n");
    }
    let tags: Vec<(&str, &str)> = doc["tags"]
        .as_array()
        .map(|tags| {
            tags.iter()
                .map(|t| {
                    (
                        t["name"].as_str().unwrap_or(""),
                        t["description"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str("## Contents\n\n");
    for (name, description) in &tags {
        let _ = writeln!(out, "- [{name}](#{}): {description}", anchor(name));
    }
    out.push_str("- [Schemas](#schemas)\n\n");
    for (name, description) in &tags {
        let _ = writeln!(out, "## {name}\n\n{description}\n");
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for method in METHODS {
                let op = &item[method];
                let tagged = op["tags"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t.as_str() == Some(name)));
                if tagged {
                    operation(&mut out, method, path, op);
                }
            }
        }
    }
    out.push_str("## Schemas\n\n");
    for (name, schema) in doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
    {
        schema_section(&mut out, name, schema);
    }
    out
}

/// One operation: its summary, parameters, body and answers.
fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = writeln!(out, "### `{} {path}`\n", method.to_uppercase());
    if let Some(s) = op["summary"].as_str() {
        let _ = writeln!(out, "{s}\n");
    }
    if let Some(d) = op["description"].as_str() {
        let _ = writeln!(out, "{d}\n");
    }
    if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
        out.push_str(
            "| parameter | in | required | type | description |\n| --- | --- | --- | --- | --- |\n",
        );
        for p in params {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                p["name"].as_str().unwrap_or(""),
                p["in"].as_str().unwrap_or(""),
                yes_no(p["required"].as_bool().unwrap_or(false)),
                type_of(&p["schema"]),
                cell(p["description"].as_str().unwrap_or("")),
            );
        }
        out.push('\n');
    }
    if let Some(content) = op["requestBody"]["content"].as_object() {
        for (media, body) in content {
            let _ = writeln!(
                out,
                "Request body (`{media}`): {}\n",
                type_of(&body["schema"])
            );
        }
    }
    if let Some(responses) = op["responses"].as_object() {
        out.push_str("| status | meaning | body |\n| --- | --- | --- |\n");
        for (status, r) in responses {
            let body = r["content"]
                .as_object()
                .and_then(|c| c.values().next())
                .map_or(String::new(), |c| type_of(&c["schema"]));
            let _ = writeln!(
                out,
                "| {status} | {} | {body} |",
                cell(r["description"].as_str().unwrap_or(""))
            );
        }
        out.push('\n');
    }
}

/// One schema of `components`: its fields, or what it is.
fn schema_section(out: &mut String, name: &str, schema: &Value) {
    let _ = writeln!(out, "### {name}\n");
    if let Some(d) = schema["description"].as_str() {
        let _ = writeln!(out, "{d}\n");
    }
    let Some(properties) = schema["properties"].as_object() else {
        let _ = writeln!(out, "{}\n", type_of(schema));
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | required | description |\n| --- | --- | --- | --- |\n");
    for (field, p) in properties {
        let _ = writeln!(
            out,
            "| `{field}` | {} | {} | {} |",
            type_of(p),
            yes_no(required.contains(&field.as_str())),
            cell(p["description"].as_str().unwrap_or("")),
        );
    }
    out.push('\n');
}

/// A schema's type as a reader wants it: a link for a named schema,
/// `array of ...`, alternatives joined, `null` marked as optional.
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[`{name}`](#{})", anchor(name));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(alternatives) = schema[key].as_array() {
            let named: Vec<String> = alternatives
                .iter()
                .filter(|a| a["type"].as_str() != Some("null"))
                .map(type_of)
                .collect();
            let nullable = named.len() < alternatives.len();
            return with_null(named.join(" or "), nullable);
        }
    }
    let (base, nullable) = match &schema["type"] {
        Value::String(t) => (t.clone(), false),
        Value::Array(ts) => {
            let named: Vec<&str> = ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect();
            (named.join(" or "), named.len() < ts.len())
        }
        _ => ("any".to_string(), false),
    };
    let base = if base == "array" {
        format!("array of {}", type_of(&schema["items"]))
    } else if let Some(f) = schema["format"].as_str() {
        format!("{base} ({f})")
    } else {
        base
    };
    with_null(base, nullable)
}

fn with_null(t: String, nullable: bool) -> String {
    if nullable {
        format!("{t}, or null")
    } else {
        t
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Text for a table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// GitHub's anchor of a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_read_as_a_reader_wants_them() {
        assert_eq!(
            type_of(&json!({"$ref": "#/components/schemas/TaskView"})),
            "[`TaskView`](#taskview)"
        );
        assert_eq!(
            type_of(&json!({"type": ["string", "null"], "format": "uuid"})),
            "string (uuid), or null"
        );
        assert_eq!(
            type_of(&json!({"type": "array", "items": {"type": "string"}})),
            "array of string"
        );
        assert_eq!(cell("a | b\n c"), "a \\| b c");
        assert_eq!(anchor("event types"), "event-types");
    }
}
