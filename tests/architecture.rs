//! Architecture invariants (README "Layout", ADR 0001), checked on the manifests.
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

/// The runtime (group commit, usage meter, trace bridge, the task use
/// cases) sits on the port and beside it, never under it: it depends on
/// core alone, and core on none of ours.
#[test]
fn the_runtime_depends_on_the_core_only_and_the_core_on_nothing_of_ours() {
    let ours = |krate: &str| -> Vec<String> {
        let (_, manifest) = manifests()
            .into_iter()
            .find(|(n, _)| n == krate)
            .unwrap_or_else(|| panic!("crates/{krate}"));
        normal_dependencies(&manifest)
            .into_iter()
            .filter(|d| d.starts_with("control-plane") || d.starts_with("store-"))
            .collect()
    };
    assert_eq!(ours("control-plane-runtime"), vec!["control-plane-core"]);
    assert_eq!(ours("control-plane-store-kit"), vec!["control-plane-core"]);
    assert!(ours("control-plane-core").is_empty());
}

/// Core is the port (issue 58): the OpenTelemetry bridge, the runtime's
/// machinery (group commit), the adapters' shared machinery (sealing, the
/// wake-up channel) and the reference model live elsewhere, and core
/// depends on no async runtime.
#[test]
fn core_holds_no_opentelemetry_and_no_runtime_machinery() {
    let (_, manifest) = manifests()
        .into_iter()
        .find(|(n, _)| n == "control-plane-core")
        .unwrap_or_else(|| panic!("crates/control-plane-core"));
    let deps = normal_dependencies(&manifest);
    for banned in [
        "opentelemetry",
        "tracing-opentelemetry",
        "tokio",
        "chacha20poly1305",
    ] {
        assert!(
            !deps.iter().any(|d| d == banned),
            "core depends on {banned}"
        );
    }
    for (path, text) in source_files() {
        if path.starts_with("crates/control-plane-core/") {
            for banned in [
                "tokio::sync::mpsc",
                "tokio::spawn",
                "tokio::",
                "struct SecretKeys",
                "struct GroupCommit",
                "struct UsageMeter",
                "DeliveryModel",
            ] {
                assert!(!text.contains(banned), "{path} holds {banned}");
            }
        }
    }
}

#[test]
fn the_dispatcher_and_the_api_depend_on_the_core_and_the_runtime_only() {
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
        assert_eq!(
            ours,
            vec![
                "control-plane-core".to_string(),
                "control-plane-runtime".to_string()
            ],
            "{krate}"
        );
    }
}

/// The dashboard is a front end of the API: it reads and acts through the
/// API's crate (its query layer, sessions' token checks) and the port, and
/// the API knows nothing of it.
#[test]
fn the_dashboard_depends_on_the_api_and_the_core_only() {
    let (_, manifest) = manifests()
        .into_iter()
        .find(|(n, _)| n == "dashboard")
        .unwrap_or_else(|| panic!("crates/dashboard"));
    let ours: Vec<String> = normal_dependencies(&manifest)
        .into_iter()
        .filter(|d| d.starts_with("control-plane") || d.starts_with("store-") || d == "api")
        .collect();
    assert_eq!(ours, vec!["api", "control-plane-core"]);
}

/// HTML is written in one crate and one way: the dashboard's maud
/// templates, which escape every spliced value. Nothing there marks a
/// string as already escaped (`PreEscaped`) or builds markup by formatting,
/// and the API's own sources write no HTML at all.
#[test]
fn markup_is_written_only_by_the_dashboards_templates() {
    let mut dashboard = 0;
    for (path, text) in source_files() {
        if path.starts_with("crates/dashboard/") {
            dashboard += 1;
            for banned in [
                "PreEscaped",
                "format!(\"<",
                "push_str(\"<",
                "write!(out, \"<",
            ] {
                assert!(!text.contains(banned), "{path} writes markup with {banned}");
            }
        } else if path.starts_with("crates/api/") {
            for banned in ["<html", "<p", "<table", "<form", "maud"] {
                assert!(!text.contains(banned), "{path} writes HTML ({banned})");
            }
        }
    }
    assert!(dashboard >= 5, "read {dashboard} files of the dashboard");
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

/// The port crate reads no process environment: the service's
/// configuration (`CONTROLPLANE_*` variables) is the binary's
/// (`crates/control-plane/src/config.rs`), so a library user of the port
/// never links the service's settings.
#[test]
fn core_reads_no_environment() {
    let src = workspace_root().join("crates/control-plane-core/src");
    let mut stack = vec![src];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            seen += 1;
            for call in ["env::var", "env::vars"] {
                assert!(
                    !text.contains(call),
                    "{} calls {call}: the environment is read by the binary's config",
                    path.display()
                );
            }
        }
    }
    assert!(seen > 10, "read only {seen} files of the core");
}

#[test]
fn the_manifest_parser_sees_dependencies() {
    let m = "[package]\nname = \"x\"\n[dependencies]\nstore-embedded.workspace = true\ntokio = \"1\"\n[dev-dependencies]\nstore-postgres = \"1\"\n";
    assert_eq!(normal_dependencies(m), vec!["store-embedded", "tokio"]);
}

/// SQL is parameterized: where the adapters build statement text with
/// `format!`, they splice in only constant fragments (`ALL_CAPS` items of the
/// crate), the validated schema name, the derived LISTEN channel, or generated
/// `$n` placeholder lists; values always travel as parameters.
#[test]
fn adapters_splice_only_constants_into_sql() {
    let allowed_names = ["schema", "channel", "placeholders", "lock"];
    let mut violations = Vec::new();
    for krate in ["store-embedded", "store-postgres"] {
        let dir = workspace_tests::workspace_root()
            .join("crates")
            .join(krate)
            .join("src");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for literal in format_literals(&text) {
                let sql = [
                    "SELECT", "INSERT", "UPDATE", "DELETE", "LISTEN", "CREATE", "SET ",
                ]
                .iter()
                .any(|k| literal.contains(k));
                if !sql {
                    continue;
                }
                let mut s = literal.as_str();
                while let Some(b) = s.find('{') {
                    s = &s[b + 1..];
                    if let Some(t) = s.strip_prefix('{') {
                        s = t;
                        continue;
                    }
                    let end = s.find('}').unwrap_or(s.len());
                    let name = s[..end].split(':').next().unwrap_or("");
                    let constant = !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit());
                    if !constant && !allowed_names.contains(&name) {
                        violations.push(format!("{}: {{{name}}} in {literal:?}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "values spliced into SQL: {violations:#?}"
    );
}

/// The first string literal of every `format!(` call in `text`.
fn format_literals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("format!(") {
        rest = &rest[i + 8..];
        let trimmed = rest.trim_start();
        let Some(body) = trimmed.strip_prefix('"') else {
            continue;
        };
        let mut literal = String::new();
        let mut chars = body.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        if n != '\n' {
                            literal.push(n);
                        }
                    }
                }
                '"' => break,
                c => literal.push(c),
            }
        }
        out.push(literal);
    }
    out
}

/// Both adapters have one shape: the same source files, each area in the
/// file of the same name. Only the files listed here are one adapter's own.
#[test]
fn both_adapters_have_the_same_files() {
    // LISTEN/NOTIFY wake-ups across processes: the embedded store has one
    // process and wakes its workers in memory. What the one embedded writer
    // keeps in memory between transactions (ADR 0028, ADR 0032): postgres
    // has many writers and keeps nothing. Connections to a server that may
    // sit behind a pooler or fail over (connection.rs): the embedded store
    // opens a file. `live/` holds the live index's tests.
    let own = [
        "notify.rs",
        "connection.rs",
        "live.rs",
        "live",
        "finished.rs",
        "cache.rs",
    ];
    let files = |adapter: &str| -> std::collections::BTreeSet<String> {
        let dir = workspace_root().join("crates").join(adapter).join("src");
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| !own.contains(&f.as_str()))
            .collect()
    };
    let (embedded, postgres) = (files("store-embedded"), files("store-postgres"));
    assert_eq!(
        embedded,
        postgres,
        "the adapters' src/ folders differ: embedded only {:?}, postgres only {:?}",
        embedded.difference(&postgres).collect::<Vec<_>>(),
        postgres.difference(&embedded).collect::<Vec<_>>()
    );
}

/// The functions each adapter's source file declares outside its tests, by
/// path under `src/`.
fn adapter_functions(
    adapter: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let prefix = format!("crates/{adapter}/src/");
    source_files()
        .into_iter()
        .filter_map(|(path, text)| {
            let file = path.strip_prefix(&prefix)?.to_string();
            let names = text
                .lines()
                .filter_map(|l| fn_name(l.trim_start()))
                .collect();
            Some((file, names))
        })
        .collect()
}

/// The twins below the file (ADR 0010, issue 58): each file both adapters
/// have declares the same functions, but for the differences listed in
/// `tests/twins.txt`, each file's with its reason. A new difference fails,
/// and so does a listed one that is gone (the list only shrinks).
#[test]
fn both_adapters_name_their_functions_alike() {
    let (embedded, postgres) = (
        adapter_functions("store-embedded"),
        adapter_functions("store-postgres"),
    );
    let mut found = std::collections::BTreeSet::new();
    for (file, e) in &embedded {
        let Some(p) = postgres.get(file) else {
            continue;
        };
        for name in e.difference(p) {
            found.insert(format!("{file} embedded {name}"));
        }
        for name in p.difference(e) {
            found.insert(format!("{file} postgres {name}"));
        }
    }
    let listed = std::fs::read_to_string(workspace_root().join("tests/twins.txt")).unwrap();
    let allowed: std::collections::BTreeSet<String> = listed
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let new: Vec<_> = found.difference(&allowed).collect();
    let gone: Vec<_> = allowed.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "function names differ between the adapters beyond tests/twins.txt: \
         new {new:#?}; listed but gone (remove them) {gone:#?}"
    );
}

/// The function scan used by the twins test sees every kind of declaration.
#[test]
fn the_function_scan_names_one_liners_and_async_ones() {
    for (line, name) in [
        ("pub(super) async fn claim(", "claim"),
        ("fn one() -> u8 { 1 }", "one"),
        ("pub(crate) const fn size() -> usize {", "size"),
    ] {
        assert_eq!(fn_name(line).as_deref(), Some(name));
    }
    assert_eq!(fn_name("let f = fn_like;"), None);
}

/// The tables an adapter's migrations leave, replaying `CREATE TABLE`,
/// `DROP TABLE` and `ALTER TABLE … RENAME TO` in file order.
fn tables_left(adapter: &str) -> std::collections::BTreeSet<String> {
    let dir = workspace_root()
        .join("crates")
        .join(adapter)
        .join("src")
        .join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no migrations in {}", dir.display());
    let mut tables = std::collections::BTreeSet::new();
    for file in files {
        let text: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .to_lowercase();
        for statement in text.split(';') {
            let words: Vec<&str> = statement
                .split(|c: char| c.is_whitespace() || c == '(')
                .filter(|w| !w.is_empty())
                .collect();
            match words.as_slice() {
                ["create", "table", "if", "not", "exists", name, ..]
                | ["create", "table", name, ..] => {
                    tables.insert(name.to_string());
                }
                ["drop", "table", "if", "exists", name, ..] | ["drop", "table", name, ..] => {
                    tables.remove(*name);
                }
                ["alter", "table", old, "rename", "to", new, ..] => {
                    tables.remove(*old);
                    tables.insert(new.to_string());
                }
                _ => {}
            }
        }
    }
    tables
}

/// Both adapters' migrations leave the same tables, except the ones listed
/// here with the reason; a new difference, or one that went away, fails
/// until this list says so.
#[test]
fn both_adapters_migrate_to_the_same_tables() {
    let embedded_only = [
        // Sequence numbers and log positions: postgres uses sequences.
        "counters",
        // A copy of each dead row for the dead-letter page (ADR 0032):
        // postgres pages its finished rows' partial index of dead ones.
        "dead_letters",
    ];
    let postgres_only = [
        // Circuit state and the rate budget live on the endpoint row in the
        // embedded store; postgres keeps them apart so that their updates
        // neither rewrite nor lock the endpoint row, and the flow row is the
        // lock that serializes one endpoint's claims across replicas
        // (postgres migrations 1 and 4, ADR 0009).
        "circuits",
        "endpoint_flow",
        // The write-once shape (ADR 0020), postgres only so far (issue 35).
        "delivery_done",
        "delivery_queue",
        // The finished counts (ADR 0032): the embedded writer keeps them in
        // its memory beside the live index.
        "delivery_tallies",
    ];
    let mut postgres_only = postgres_only.to_vec();
    postgres_only.sort_unstable();
    let (embedded, postgres) = (tables_left("store-embedded"), tables_left("store-postgres"));
    assert!(
        embedded.contains("deliveries") && postgres.contains("sessions"),
        "{embedded:?} {postgres:?}"
    );
    let only = |a: &std::collections::BTreeSet<String>, b: &std::collections::BTreeSet<String>| {
        a.difference(b).cloned().collect::<Vec<_>>()
    };
    assert_eq!(
        only(&embedded, &postgres),
        embedded_only,
        "tables only the embedded store has"
    );
    assert_eq!(
        only(&postgres, &embedded),
        postgres_only,
        "tables only postgres has"
    );
}

/// Each port trait is implemented in the area file of the same name, in
/// both adapters; `lib.rs` only wires modules and the umbrella trait.
#[test]
fn each_port_trait_is_implemented_in_its_area_file() {
    let areas = [
        ("EndpointStore", "endpoint.rs"),
        ("CircuitStore", "endpoint.rs"),
        ("DeliveryStore", "delivery.rs"),
        ("AttemptLogStore", "attempt.rs"),
        ("WorkflowStore", "workflow.rs"),
        ("IdempotencyStore", "idempotency.rs"),
        ("TickStore", "tick.rs"),
        ("UsageStore", "usage.rs"),
        ("AlertStore", "alert.rs"),
        ("AccountKeyStore", "account_key.rs"),
        ("PortalStore", "portal.rs"),
        ("PollStore", "poll.rs"),
        ("MaintenanceStore", "maintenance.rs"),
        ("ErasureStore", "erasure.rs"),
        ("ControlPlaneStore", "lib.rs"),
    ];
    for (adapter, store) in [
        ("store-embedded", "EmbeddedStore"),
        ("store-postgres", "PostgresStore"),
    ] {
        let dir = workspace_root().join("crates").join(adapter).join("src");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            for (area_trait, home) in areas {
                let found = text.contains(&format!("impl {area_trait} for {store} {{"));
                assert_eq!(
                    found,
                    file == home,
                    "{adapter}: `impl {area_trait}` belongs in {home}, found it {} {file}",
                    if found { "in" } else { "missing from" }
                );
            }
        }
    }
}

/// The contract names the port's rustdoc cites (backticked names in doc
/// comments of the port, `core/src/store/`) and the contracts the conformance macro stamps
/// are the same set: no promise without a test, no test without a promise.
#[test]
fn every_contract_the_port_cites_is_stamped_and_every_stamped_one_cited() {
    let dir = workspace_root().join("crates/control-plane-core/src/store");
    let mut port = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        port.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let cited: std::collections::BTreeSet<String> = port
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("///") || l.starts_with("//!"))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_string))
        .filter(|n| is_contract_name(n))
        .collect();
    let suite = std::fs::read_to_string(
        workspace_root().join("crates/control-plane-conformance/src/lib.rs"),
    )
    .unwrap();
    let start = suite.find("conformance_suite!(@stamp").unwrap();
    let list = &suite[start..];
    let list = &list[..list.find(");").unwrap()];
    let stamped: std::collections::BTreeSet<String> = list
        .lines()
        .skip(1)
        .map(|l| l.trim().trim_end_matches(',').to_string())
        .filter(|n| is_contract_name(n))
        .collect();
    assert!(
        stamped.len() >= 60,
        "found {} stamped contracts",
        stamped.len()
    );
    assert_eq!(
        cited,
        stamped,
        "cited only: {:?}; stamped only: {:?}",
        cited.difference(&stamped).collect::<Vec<_>>(),
        stamped.difference(&cited).collect::<Vec<_>>()
    );
}

/// Issue 36's one lease check: no adapter describes a lease's row to the
/// check itself (`Held { .. }`) or calls the check directly; each reads its
/// row into core's `LeaseRow`, `FinishedRow` or `TaskRow` and asks through
/// their methods, so the rule and its inputs are written once.
#[test]
fn adapters_ask_the_lease_check_through_core_rows() {
    let mut found = Vec::new();
    for (path, text) in source_files() {
        if !path.contains("crates/store-") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.contains("Held {") || calls_fence_directly(line) {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "ask through core's rows (lease::LeaseRow, FinishedRow, TaskRow) instead:\n{}",
        found.join("\n")
    );
}

/// A call of the free function `fence(`, not of a method `.fence(`.
fn calls_fence_directly(line: &str) -> bool {
    line.match_indices("fence(").any(|(at, _)| {
        let before = line[..at].chars().next_back();
        !before.is_some_and(|c| c == '.' || c == '_' || c.is_alphanumeric())
    })
}

#[test]
fn the_direct_fence_scan_tells_a_call_from_a_method() {
    assert!(calls_fence_directly(
        "    fence(Some(&held), token, write)?;"
    ));
    assert!(calls_fence_directly("if fence(x)? == Verdict::Repeat {"));
    assert!(!calls_fence_directly("    row.fence(&lease.token, end)?;"));
    assert!(!calls_fence_directly(
        "    let row = fenced_row(t, lease, w)?;"
    ));
    assert!(!calls_fence_directly("    lease_fence(x)"));
}

/// Contract names are snake case sentences: at least four words.
fn is_contract_name(s: &str) -> bool {
    s.matches('_').count() >= 3
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The source files of the workspace's crates and of `xtask` (test-only
/// files excluded: a `tests.rs`, and the conformance suite, whose functions
/// are tests), with their text cut at the first `#[cfg(test)]` module.
fn source_files() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = workspace_root();
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let krate = entry.unwrap().path();
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        // The fuzz targets are not a workspace member.
        if name != "control-plane-conformance" && name != "fuzz" {
            walk(&krate.join("src"), &mut paths);
        }
    }
    walk(&root.join("xtask/src"), &mut paths);
    let mut out = Vec::new();
    for path in paths {
        if path.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let end = (0..lines.len())
            .find(|&i| {
                lines[i] == "#[cfg(test)]"
                    && lines[i + 1..]
                        .iter()
                        .find(|l| !l.starts_with("#["))
                        .is_some_and(|l| {
                            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                            l.starts_with("mod ")
                        })
            })
            .unwrap_or(lines.len());
        let shown = path.strip_prefix(&root).unwrap().display().to_string();
        out.push((shown, lines[..end].join("\n")));
    }
    assert!(out.len() > 50, "found {} source files", out.len());
    out
}

/// The name of the function a (trimmed) line declares, if it declares one.
fn fn_name(trimmed: &str) -> Option<String> {
    let mut rest = trimmed;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
        rest = rest.strip_prefix("async ").unwrap_or(rest);
    }
    let signature = rest.strip_prefix("fn ")?;
    Some(
        signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect(),
    )
}

/// The functions of `text` (rustfmt-formatted) and their lengths in lines,
/// from the `fn` line to the closing brace at its indentation; declarations
/// without a body are skipped.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(name) = fn_name(trimmed) else {
            continue;
        };
        // Where the body opens; none for a declaration or a one-line body.
        let opens = lines[i..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        });
        let Some(open) = opens.map(|o| i + o) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[open + 1..].iter().position(|l| l.trim_end() == close) {
            out.push((name, open + 1 + end - i + 1));
        }
    }
    out
}

/// Issue 36's size limits: no source file over 800 lines outside its tests,
/// no function over 80 lines.
#[test]
fn no_file_over_800_lines_and_no_function_over_80() {
    let mut over = Vec::new();
    // The conformance contracts are library code too (issue 76): their
    // files are held to the same size; their functions, each a scenario,
    // are not held to the function limit.
    let contracts = workspace_root().join("crates/control-plane-conformance/src");
    for path in files_under(&[contracts], &["rs"], &[]) {
        let n = std::fs::read_to_string(&path).unwrap().lines().count();
        if n > 800 {
            over.push(format!("{}: {n} lines", path.display()));
        }
    }
    for (path, text) in source_files() {
        let n = text.lines().count();
        if n > 800 {
            over.push(format!("{path}: {n} lines"));
        }
        for (name, len) in function_lengths(&text) {
            if len > 80 {
                over.push(format!("{path}: fn {name} has {len} lines"));
            }
        }
    }
    assert!(over.is_empty(), "over the limits:\n{}", over.join("\n"));
}

/// The length counter sees a function's whole body, skips declarations,
/// and finds nested functions on their own.
#[test]
fn function_lengths_are_counted_from_fn_to_its_closing_brace() {
    let text = "trait T {\n    fn declared(&self) -> u8;\n}\n\
                pub(crate) async fn outer(\n    a: u8,\n) -> u8 {\n    fn inner() -> u8 {\n        1\n    }\n    a + inner()\n}\n\
                fn one() -> u8 { 1 }\n";
    assert_eq!(
        function_lengths(text),
        vec![("outer".to_string(), 8), ("inner".to_string(), 3)]
    );
}

/// Port methods take at most two arguments besides `&self`: more travel in
/// one value (issue 36, ADR 0031): a request built checked
/// (`IdempotencyBeginRequest`, `TickClaimRequest`, `TaskHeartbeat`), a
/// plain one (`TaskFailed`, `SecretRotation`, `TimeRange`), or the endpoint
/// of an account as one key (`EndpointKey`).
#[test]
fn port_methods_take_at_most_two_arguments_besides_self() {
    let dir = workspace_root().join("crates/control-plane-core/src/store");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("async fn ") {
            rest = &rest[at + "async fn ".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let open = rest.find('(').unwrap();
            let close = open + rest[open..].find(')').unwrap();
            let args = rest[open + 1..close]
                .split(',')
                .filter(|a| !a.trim().is_empty() && !a.contains("self"))
                .count();
            if args >= 3 {
                found.push(name);
            }
        }
    }
    assert!(
        found.is_empty(),
        "port methods of three or more arguments: {found:?}"
    );
}

/// DuckDB plans an `INSERT` once and reuses the plan, unless a placeholder
/// stands in it twice: the second `$n` marks the statement for planning
/// again at every execution (DuckDB's `BoundParameterMap`; measured: twice
/// the time of the deliveries insert of a publish, ADR 0028). So the
/// embedded adapter's inserts bind a value once per place it is used.
/// (`UPDATE`s, `DELETE`s and `SELECT`s read a table, which DuckDB 2.0
/// plans again at every execution whatever their placeholders.)
#[test]
fn embedded_inserts_use_each_placeholder_once() {
    let mut violations = Vec::new();
    let mut inserts = 0;
    for (path, text) in source_files() {
        if !path.starts_with("crates/store-embedded/src") {
            continue;
        }
        for literal in string_literals(&text) {
            if !literal.trim_start().starts_with("INSERT") {
                continue;
            }
            inserts += 1;
            let mut seen = std::collections::HashSet::new();
            for n in placeholders(&literal) {
                if !seen.insert(n) {
                    violations.push(format!("{path}: ${n} twice in {literal:?}"));
                }
            }
        }
    }
    assert!(inserts >= 10, "found only {inserts} inserts");
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn the_placeholder_scan_sees_a_repeat() {
    let text = "t.execute(\"INSERT INTO t (a, b) VALUES ($1, $12)\", p); x(\"INSERT INTO u VALUES ($2, \\\"$2\\\")\")";
    let lits = string_literals(text);
    assert_eq!(lits.len(), 2, "{lits:?}");
    assert_eq!(placeholders(&lits[0]), vec![1, 12]);
    assert_eq!(placeholders(&lits[1]), vec![2, 2]);
}

/// Every `"..."` literal of `text` (escapes kept as written).
fn string_literals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut lit = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    lit.push(c);
                    if let Some(n) = chars.next() {
                        lit.push(n);
                    }
                }
                '"' => break,
                _ => lit.push(c),
            }
        }
        out.push(lit);
    }
    out
}

/// The numbers of the `$n` placeholders in `sql`, in order.
fn placeholders(sql: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            out.push(n);
        }
    }
    out
}

/// The migrations that roll up the attempt log already written compute each
/// latency's bucket in SQL from a literal list of bucket bounds: the list
/// must be the core's rule, bound for bound (ADR 0032).
#[test]
fn the_rollup_migrations_use_the_cores_latency_buckets() {
    let want: Vec<u64> = (0..control_plane_core::LATENCY_BUCKETS - 1)
        .map(control_plane_core::latency_bucket_bound)
        .collect();
    for path in [
        "crates/store-postgres/src/migrations/0017_counts_and_rollups.sql",
        "crates/store-embedded/src/migrations/0012_attempt_rollup.sql",
    ] {
        let sql = std::fs::read_to_string(workspace_root().join(path)).unwrap();
        // The bounds are the one long run of numbers and separators.
        let run = sql
            .split(|c: char| !(c.is_ascii_digit() || ",() ".contains(c)))
            .max_by_key(|s| s.len())
            .unwrap_or_default();
        let got: Vec<u64> = run
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want, "{path}");
    }
}

/// The module files of one crate that each file names (`crate::a::b`,
/// `super::x`), its own ancestors left out: a parent declares and re-exports
/// its children, which is not a circle.
fn module_edges(
    files: &[(String, String)],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    // Module path of a file, from its path under `src/`.
    let module_of = |path: &str| -> Vec<String> {
        let rel = path.split("/src/").nth(1).unwrap_or(path);
        let mut parts: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    };
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|(p, _)| (module_of(p), p.clone()))
        .collect();
    // The deepest file that holds `path` (a path may end in an item).
    let file_of = |mut path: Vec<String>| -> Option<String> {
        while !path.is_empty() {
            if let Some(f) = by_module.get(&path) {
                return Some(f.clone());
            }
            path.pop();
        }
        None
    };
    let word = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty())
            .collect()
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in files {
        let me = module_of(path);
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut targets = Vec::new();
        for (at, _) in code.match_indices("crate::") {
            targets.push(word(&code[at + "crate::".len()..]));
        }
        for (at, _) in code.match_indices("super::") {
            // `super` of `a::b` (a/b.rs, or a/b/mod.rs) is `a`.
            let mut base = me.clone();
            base.pop();
            base.extend(word(&code[at + "super::".len()..]));
            targets.push(base);
        }
        for t in targets {
            if let Some(f) = file_of(t.clone()) {
                let ancestor = module_of(&f).len() < me.len() && me.starts_with(&module_of(&f));
                if f != *path && !ancestor {
                    out.entry(path.clone()).or_default().insert(f);
                }
            }
        }
    }
    out
}

/// The files that sit on a circle of imports, each circle once (Tarjan's
/// strongly connected components of more than one file).
fn circles(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    fn reach(
        from: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    ) -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    }
    let mut done = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for n in edges.keys() {
        if done.contains(n) {
            continue;
        }
        let ahead = reach(n, edges);
        if !ahead.contains(n) {
            continue;
        }
        let mut scc: Vec<String> = ahead
            .iter()
            .filter(|m| reach(m, edges).contains(n))
            .cloned()
            .collect();
        scc.sort();
        done.extend(scc.iter().cloned());
        out.push(scc);
    }
    out
}

/// Issue 58: no new circle of imports between files. The circles that are
/// left are listed here, to be untied (each removal shrinks the list; a
/// new circle fails).
#[test]
fn no_new_import_circles() {
    // None is left. Untied: the embedded ground floor (`live.rs` keeps
    // `LEASE_COLS`, `cache.rs` `Sender`, `store.rs` `check_keys`), postgres
    // `store` with `endpoint` (`check_keys` is the store's), the
    // dispatcher's `http` with `ssrf`, the dashboard's `pages` with
    // `recover`; and (issue 73) the adapters' delivery stages with
    // `catalogue`, `endpoint` and `attempt`: a publish reads the schemas it
    // checks itself (`delivery/publish.rs`), the attempt log checks a
    // delivery's account with its own statement, and the embedded
    // dead-letter copies sit below both the stages and the endpoint's
    // removal (`delivery/dead_letters.rs`). A new circle fails.
    let known: &[&str] = &[];
    let files = source_files();
    let mut crates: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
    for (path, text) in files {
        let krate = path.split("/src/").next().unwrap_or_default().to_string();
        crates.entry(krate).or_default().push((path, text));
    }
    let mut found = Vec::new();
    for files in crates.values() {
        for c in circles(&module_edges(files)) {
            found.push(c);
        }
    }
    let new: Vec<&Vec<String>> = found
        .iter()
        .filter(|c| c.iter().any(|f| !known.contains(&f.as_str())))
        .collect();
    assert!(
        new.is_empty(),
        "new import circles: {new:#?}\nall: {found:#?}"
    );
    let untied: Vec<&&str> = known
        .iter()
        .filter(|k| !found.iter().flatten().any(|f| f == *k))
        .collect();
    assert!(
        untied.is_empty(),
        "in no circle any more, remove from the list: {untied:?}"
    );
}

/// The circle finder sees a circle of two files and not a parent's
/// declaration of its child.
#[test]
fn the_circle_finder_sees_a_circle_and_not_a_parent() {
    let files = vec![
        (
            "c/src/lib.rs".to_string(),
            "mod a; mod b; use crate::a::x;".to_string(),
        ),
        ("c/src/a.rs".to_string(), "use crate::b::y;".to_string()),
        ("c/src/b.rs".to_string(), "use crate::a::x;".to_string()),
        ("c/src/d/mod.rs".to_string(), "mod e; use e::*;".to_string()),
        ("c/src/d/e.rs".to_string(), "use super::*;".to_string()),
    ];
    let found = circles(&module_edges(&files));
    assert_eq!(
        found,
        vec![vec!["c/src/a.rs".to_string(), "c/src/b.rs".to_string()]]
    );
}

/// An ADR that names a Rust item of ours (in backticks, with `::` or `()`)
/// names one that still exists: its last segment is a word of the
/// workspace's sources. Paths into other crates are theirs to keep.
#[test]
fn every_rust_item_an_adr_names_exists() {
    let others = [
        "std",
        "core",
        "tokio",
        "tokio_util",
        "axum",
        "serde",
        "serde_json",
        "duckdb",
        "tokio_postgres",
        "deadpool",
        "deadpool_postgres",
        "hyper",
        "reqwest",
        "utoipa",
        "utoipa_axum",
        "jsonschema",
        "lapin",
        "async_nats",
        "redis",
        "rustls",
        "tower",
        "tracing",
        "opentelemetry",
        "prometheus_client",
        "uuid",
        "mimalloc",
        "futures",
        "http",
        "regex",
        "object_store",
    ];
    let mut words = std::collections::HashSet::new();
    let root = workspace_root();
    let dirs = [root.join("crates"), root.join("xtask"), root.join("tests")];
    for path in files_under(&dirs, &["rs", "sql"], &["target"]) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for w in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !w.is_empty() {
                words.insert(w.to_string());
            }
        }
    }
    let mut stale = Vec::new();
    let mut adrs = 0;
    for entry in std::fs::read_dir(root.join("adr")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        adrs += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, span) in text.split('`').enumerate() {
            let span = span.trim();
            if i % 2 == 0 || span.contains('\n') || !(span.contains("::") || span.ends_with("()")) {
                continue;
            }
            let first = span.split("::").next().unwrap_or("");
            if others.contains(&first) {
                continue;
            }
            let last = span.rsplit("::").next().unwrap_or(span);
            let name: String = last
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !words.contains(&name) {
                let file = path.file_name().unwrap().to_string_lossy().into_owned();
                stale.push(format!("{file}: `{span}`"));
            }
        }
    }
    assert!(adrs > 40, "read only {adrs} ADRs");
    assert!(
        stale.is_empty(),
        "ADRs name Rust items that no longer exist: {stale:#?}"
    );
}

/// Library code imports names, not globs: a reader sees where each name
/// comes from. A test module may take its parent's names (`use super::*`,
/// indented inside `mod tests`, or a `tests.rs` file of its own).
#[test]
fn library_code_imports_no_globs() {
    let mut globs = Vec::new();
    let mut files = 0;
    // `tests/` holds test targets; `peers` and `fuzz` are workspaces of their own.
    let skip = ["tests", "target", "peers", "fuzz"];
    for path in files_under(&[workspace_root().join("crates")], &["rs"], &skip) {
        if path.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let import =
                line.starts_with("use ") || (line.starts_with("pub") && line.contains(" use "));
            if import && line.trim_end().ends_with("*;") {
                globs.push(format!("{}:{}: {line}", path.display(), i + 1));
            }
        }
    }
    assert!(files > 100, "read only {files} files");
    assert!(globs.is_empty(), "glob imports in library code: {globs:#?}");
}

/// Every file below `roots` whose name ends in one of `extensions`, skipping
/// folders named in `skip`.
fn files_under(
    roots: &[std::path::PathBuf],
    extensions: &[&str],
    skip: &[&str],
) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = roots.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !skip.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if path
                .extension()
                .is_some_and(|e| extensions.iter().any(|x| e == *x))
            {
                out.push(path);
            }
        }
    }
    out
}
