//! The committed `openapi.json` is the document the code generates, so a
//! client generated from the file matches the API that is built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

/// `UPDATE_OPENAPI=1` (what `cargo xtask openapi` sets) rewrites the file
/// instead of comparing.
#[test]
fn committed_openapi_json_matches_the_code() {
    let generated = serde_json::to_string_pretty(&api::openapi_document()).unwrap() + "\n";
    matches_committed(
        "openapi.json",
        &generated,
        "the document the code generates",
    );
}

/// `docs/api.md` is the reference the committed document gives, so the
/// reference a reader opens matches the API that is built.
/// `UPDATE_OPENAPI=1` (what `cargo xtask openapi` sets) rewrites it.
#[test]
fn committed_api_reference_matches_the_document() {
    let generated = api::reference::markdown(&api::openapi_document());
    matches_committed(
        "docs/api.md",
        &generated,
        "the reference the document gives",
    );
}

/// Asserts that the committed file at `relative` (from the workspace root)
/// is `generated`; with `UPDATE_OPENAPI` set, writes it instead.
fn matches_committed(relative: &str, generated: &str, what: &str) {
    // Read at run time: the manifest directory of this checkout, not the
    // one this binary was first built in.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let path = root.join(relative);
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        // A CI run with the variable set would rewrite the file and pass
        // whatever the code generates: there it is an error.
        assert!(
            std::env::var("CI").map_or(true, |v| v.is_empty() || v == "false"),
            "UPDATE_OPENAPI is set in a CI run: the committed {relative} would not be checked"
        );
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from {what}: run `cargo xtask openapi` and commit it",
        path.display()
    );
}

/// The document names the values a client will see: every state a task and
/// a delivery can be in, and every usage metric, as the store names them.
#[test]
fn the_document_names_every_state_and_metric_the_api_answers_with() {
    use control_plane_core::{DeliveryState, TaskState, UsageMetric};
    let doc = api::openapi_document();
    let text = |schema: &str, field: &str| {
        doc["components"]["schemas"][schema]["properties"][field]["description"]
            .as_str()
            .unwrap_or_else(|| panic!("{schema}.{field} has no description"))
            .to_string()
    };
    let described = [
        (
            "TaskView.state",
            text("TaskView", "state"),
            TaskState::ALL
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
        ),
        (
            "DeliveryView.state",
            text("DeliveryView", "state"),
            DeliveryState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "UsageView.metric",
            text("UsageView", "metric"),
            UsageMetric::ALL.iter().map(|m| m.as_str()).collect(),
        ),
    ];
    for (what, description, names) in described {
        for name in names {
            assert!(
                description.contains(&format!("`{name}`")),
                "{what} does not name {name}: {description}"
            );
        }
    }
}
