//! The committed `openapi.json` is the document the code generates, so a
//! client generated from the file matches the API that is built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

/// `UPDATE_OPENAPI=1` (what `cargo xtask openapi` sets) rewrites the file
/// instead of comparing.
#[test]
fn committed_openapi_json_matches_the_code() {
    let generated = serde_json::to_string_pretty(&api::openapi_document()).unwrap() + "\n";
    // Read at run time: the manifest directory of this checkout, not the
    // one this binary was first built in.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let path = root.join("openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from the document the code generates: run `cargo xtask openapi` and commit it",
        path.display()
    );
}
