//! Architecture invariants (DESIGN.md section 2), checked on the manifests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use workspace_tests::{normal_dependencies, workspace_root};

fn manifests() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        out.push((name, text));
    }
    assert!(
        out.len() >= 5,
        "expected the workspace crates, found {}",
        out.len()
    );
    out
}

#[test]
fn only_the_binary_depends_on_adapters() {
    for (name, manifest) in manifests() {
        let deps = normal_dependencies(&manifest);
        let adapters: Vec<_> = deps.iter().filter(|d| d.starts_with("store-")).collect();
        // The binary wires profiles; the benchmark harness measures adapters.
        if name != "control-plane" && name != "bench" {
            assert!(
                adapters.is_empty(),
                "{name} depends on adapter(s) {adapters:?}"
            );
        }
    }
}

#[test]
fn the_dispatcher_and_the_api_depend_on_the_core_only() {
    for krate in ["dispatcher", "api"] {
        let (_, manifest) = manifests()
            .into_iter()
            .find(|(n, _)| n == krate)
            .unwrap_or_else(|| panic!("crates/{krate}"));
        let ours: Vec<String> = normal_dependencies(&manifest)
            .into_iter()
            .filter(|d| {
                d.starts_with("control-plane")
                    || d.starts_with("store-")
                    || d == "dispatcher"
                    || d == "api"
            })
            .collect();
        assert_eq!(ours, vec!["control-plane-core".to_string()], "{krate}");
    }
}

#[test]
fn core_knows_no_database_driver() {
    for (name, manifest) in manifests() {
        if name == "control-plane-core" || name == "control-plane-conformance" {
            let deps = normal_dependencies(&manifest);
            for banned in ["duckdb", "tokio-postgres", "deadpool-postgres"] {
                assert!(
                    !deps.iter().any(|d| d == banned),
                    "{name} depends on {banned}"
                );
            }
        }
    }
}

#[test]
fn the_manifest_parser_sees_dependencies() {
    let m = "[package]\nname = \"x\"\n[dependencies]\nstore-embedded.workspace = true\ntokio = \"1\"\n[dev-dependencies]\nstore-postgres = \"1\"\n";
    assert_eq!(normal_dependencies(m), vec!["store-embedded", "tokio"]);
}
