//! Durability of the embedded store across close, SIGKILL and a second
//! process. The child processes are this same test binary started with a
//! role argument, so the file uses its own harness (`harness = false`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use control_plane_core::*;
use store_embedded::{EmbeddedConfig, EmbeddedStore};

fn acct() -> AccountId {
    AccountId::new("durable").unwrap()
}

/// A store whose endpoints may have every delivery in flight at once, so
/// one claim can show that nothing acknowledged was lost.
/// The account's one endpoint.
fn hook() -> Checked<EndpointCreateRequest> {
    EndpointCreateRequest::new(
        acct(),
        "https://example.com/h",
        Secret::new("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4"),
    )
    .checked()
    .unwrap()
}

async fn open(path: &Path) -> StoreResult<EmbeddedStore> {
    let mut config = EmbeddedConfig::new(path);
    config.options.endpoint_concurrency = 10_000;
    EmbeddedStore::open(config, Arc::new(SystemClock)).await
}

fn publish_req(n: usize) -> PublishRequest {
    keyed_req(format!("k{n}"))
}

fn keyed_req(key: String) -> PublishRequest {
    PublishRequest {
        account: acct(),
        event_type: "t".into(),
        payload: serde_json::json!({ "key": key }),
        idempotency_key: Some(key),
        traceparent: None,
    }
}

async fn committed_state_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let store = open(&path).await.unwrap();
    let e = store.endpoint_create(hook()).await.unwrap();
    let mut published = Vec::new();
    for n in 0..3 {
        published.push(
            store
                .event_publish(publish_req(n).checked().unwrap())
                .await
                .unwrap(),
        );
    }
    let c = store
        .delivery_claim(ClaimRequest::new("w", 1, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    store
        .delivery_record_outcome(
            &c[0].lease,
            DeliveryOutcome::Delivered(AttemptReport::default()),
        )
        .await
        .unwrap();
    let last_seq = store
        .delivery_get(&acct(), published[2].deliveries[0])
        .await
        .unwrap()
        .seq;
    drop(store);

    let store = open(&path).await.unwrap();
    assert_eq!(store.endpoint_get(&acct(), e.id).await.unwrap(), e);
    let d0 = store
        .delivery_get(&acct(), published[0].deliveries[0])
        .await
        .unwrap();
    assert_eq!(d0.state, DeliveryState::Delivered);
    assert_eq!(
        store
            .attempt_list_for_delivery(&acct(), d0.id)
            .await
            .unwrap()
            .len(),
        1
    );
    let again = store
        .event_publish(publish_req(1).checked().unwrap())
        .await
        .unwrap();
    assert!(!again.created, "idempotency keys survive a restart");
    let next = store
        .event_publish(publish_req(99).checked().unwrap())
        .await
        .unwrap();
    let seq = store
        .delivery_get(&acct(), next.deliveries[0])
        .await
        .unwrap()
        .seq;
    assert!(
        seq > last_seq,
        "sequence numbers keep increasing across restarts: {seq} after {last_seq}"
    );
}

/// Creates the account's endpoint unless an earlier round did.
async fn ensure_endpoint(store: &EmbeddedStore) {
    if store.endpoint_list(&acct()).await.unwrap().is_empty() {
        store.endpoint_create(hook()).await.unwrap();
    }
}

/// Child role: publish events one by one and report each after its commit.
async fn child_writer(path: &Path, round: &str) {
    let store = open(path).await.unwrap();
    ensure_endpoint(&store).await;
    for n in 0usize.. {
        let p = store
            .event_publish(keyed_req(format!("round{round}-{n}")).checked().unwrap())
            .await
            .unwrap();
        assert!(p.created);
        println!("committed {} {}", p.event.id, p.deliveries[0]);
    }
}

/// Child role: 16 tasks publish keyless events at once, so the writer
/// commits them in groups; each reports its event after its publish returns.
async fn child_burst(path: &Path, round: &str) {
    let store = Arc::new(open(path).await.unwrap());
    ensure_endpoint(&store).await;
    let mut tasks = Vec::new();
    for task in 0..16 {
        let (store, round) = (store.clone(), round.to_string());
        tasks.push(tokio::spawn(async move {
            for n in 0usize.. {
                let req = PublishRequest::new(
                    acct(),
                    "t",
                    serde_json::json!({ "round": round, "task": task, "n": n }),
                );
                let p = store.event_publish(req.checked().unwrap()).await.unwrap();
                println!("committed {} {}", p.event.id, p.deliveries[0]);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn a_sigkilled_writer_loses_nothing_it_acknowledged() {
    sigkilled_loses_nothing("child-writer").await;
}

async fn a_writer_killed_in_a_burst_of_concurrent_publishes_loses_nothing_it_answered() {
    sigkilled_loses_nothing("child-burst").await;
}

/// Starts `role` three times and SIGKILLs it after it acknowledged some
/// publishes; then every acknowledged event is there with its pending
/// delivery.
async fn sigkilled_loses_nothing(role: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let mut acknowledged = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg(role)
            .arg(&path)
            .arg(round.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut this_round = 0;
        while this_round < 40 + round * 7 {
            let line = lines.next().expect("child ended early").unwrap();
            let mut parts = line.split_whitespace().skip(1);
            let ev: EventId = parts.next().unwrap().parse().unwrap();
            let d: DeliveryId = parts.next().unwrap().parse().unwrap();
            acknowledged.push((ev, d));
            this_round += 1;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let store = open(&path).await.unwrap();
    for (ev, d) in &acknowledged {
        store.event_get(&acct(), *ev).await.unwrap();
        assert_eq!(
            store.delivery_get(&acct(), *d).await.unwrap().state,
            DeliveryState::Pending
        );
    }
    let claimed = store
        .delivery_claim(ClaimRequest::new("w", 1000, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    assert!(
        claimed.len() >= acknowledged.len(),
        "{} claimable, {} acknowledged",
        claimed.len(),
        acknowledged.len()
    );
    println!(
        "  {role}: {} acknowledged publishes over 3 SIGKILLs, all present",
        acknowledged.len()
    );
}

/// Child role: try to open a file another process holds.
async fn child_open(path: &Path) {
    match open(path).await {
        Ok(_) => {
            println!("OPENED");
            std::process::exit(3)
        }
        Err(e) => {
            println!("{e}");
            std::process::exit(if matches!(e, StoreError::Unavailable(_)) {
                0
            } else {
                4
            })
        }
    }
}

async fn a_second_process_gets_a_clear_error_and_the_file_is_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let store = open(&path).await.unwrap();
    store.endpoint_create(hook()).await.unwrap();
    let p = store
        .event_publish(publish_req(1).checked().unwrap())
        .await
        .unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("child-open")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "child said: {text}");
    assert!(text.contains("in use by another process"), "{text}");
    assert!(
        text.contains("postgres"),
        "the error says what to do: {text}"
    );
    store
        .event_publish(publish_req(2).checked().unwrap())
        .await
        .unwrap();
    drop(store);
    let store = open(&path).await.unwrap();
    assert_eq!(store.event_get(&acct(), p.event.id).await.unwrap(), p.event);
    assert_eq!(
        store.delivery_count_by_state().await.unwrap(),
        vec![(DeliveryState::Pending, 2)]
    );
}

async fn a_missing_directory_is_a_clear_error() {
    let e = open(Path::new("/nonexistent-dir-for-test/x.duckdb"))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::InvalidInput(_)), "{e}");
    assert!(e.to_string().contains("CONTROLPLANE_EMBEDDED_PATH"), "{e}");
}

/// Which cases to run, read from libtest's arguments: name filters
/// (substrings, or whole names with `--exact`), `--skip NAME` (repeatable),
/// `--list`; other flags (`--nocapture`, `--test-threads N`, ...) change
/// nothing here.
#[derive(Debug, Default, PartialEq)]
struct Selection {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
    list: bool,
}

impl Selection {
    fn parse(args: &[String]) -> Selection {
        let mut s = Selection::default();
        let mut args = args.iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--skip" => s.skips.extend(args.next().cloned()),
                "--exact" => s.exact = true,
                "--list" => s.list = true,
                // Flags of libtest that take a value.
                "--test-threads" | "--format" | "--color" | "-Z" | "--logfile" => {
                    args.next();
                }
                flag if flag.starts_with('-') => {}
                filter => s.filters.push(filter.to_string()),
            }
        }
        s
    }

    fn runs(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skips.iter().any(matches)
    }
}

async fn the_selection_reads_filters_skips_and_flags() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let s = Selection::parse(&args(&["--skip", "sigkilled", "--test-threads", "2"]));
    assert!(s.runs("committed_state_survives_close_and_reopen"));
    assert!(!s.runs("a_sigkilled_writer_loses_nothing_it_acknowledged"));
    let s = Selection::parse(&args(&["missing", "--exact"]));
    assert!(!s.runs("a_missing_directory_is_a_clear_error"));
    let s = Selection::parse(&args(&["missing"]));
    assert!(s.runs("a_missing_directory_is_a_clear_error"));
    assert!(!s.runs("committed_state_survives_close_and_reopen"));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    match args.get(1).map(String::as_str) {
        Some("child-writer") => {
            return rt.block_on(child_writer(&PathBuf::from(&args[2]), &args[3]))
        }
        Some("child-burst") => return rt.block_on(child_burst(&PathBuf::from(&args[2]), &args[3])),
        Some("child-open") => return rt.block_on(child_open(&PathBuf::from(&args[2]))),
        _ => {}
    }
    type Case = (
        &'static str,
        fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
    );
    let cases: Vec<Case> = vec![
        ("committed_state_survives_close_and_reopen", || {
            Box::pin(committed_state_survives_close_and_reopen())
        }),
        ("a_sigkilled_writer_loses_nothing_it_acknowledged", || {
            Box::pin(a_sigkilled_writer_loses_nothing_it_acknowledged())
        }),
        (
            "a_writer_killed_in_a_burst_of_concurrent_publishes_loses_nothing_it_answered",
            || {
                Box::pin(
                    a_writer_killed_in_a_burst_of_concurrent_publishes_loses_nothing_it_answered(),
                )
            },
        ),
        (
            "a_second_process_gets_a_clear_error_and_the_file_is_intact",
            || Box::pin(a_second_process_gets_a_clear_error_and_the_file_is_intact()),
        ),
        ("a_missing_directory_is_a_clear_error", || {
            Box::pin(a_missing_directory_is_a_clear_error())
        }),
        ("the_selection_reads_filters_skips_and_flags", || {
            Box::pin(the_selection_reads_filters_skips_and_flags())
        }),
    ];
    let select = Selection::parse(&args[1..]);
    if select.list {
        for (name, _) in &cases {
            println!("{name}: test");
        }
        return;
    }
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        if !select.runs(name) {
            continue;
        }
        let ok =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(case()))).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if ok {
            passed += 1
        } else {
            failed += 1
        }
    }
    println!("\ndurability: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
