//! The workflow task runner over the embedded store: results, errors and
//! panics are recorded, leases are renewed while a handler runs, shutdown
//! releases what did not finish.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::*;
use dispatcher::{TaskError, TaskRunner, TaskRunnerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir, max_attempts: u32) -> DynControlPlaneStore {
    common::embedded_store(dir, |cfg| {
        cfg.options.workflow = WorkflowPolicy {
            max_attempts,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
        };
    })
    .await
}

fn config(lease: Duration) -> TaskRunnerConfig {
    TaskRunnerConfig {
        worker: "test".into(),
        concurrency: 4,
        lease,
        poll_interval: Duration::from_millis(20),
        grace: Duration::from_millis(300),
    }
}

async fn enqueue(store: &DynControlPlaneStore, id: &str, kind: &str) {
    store
        .workflow_enqueue(
            TaskEnqueueRequest {
                id: TaskId::new(id).unwrap(),
                account: AccountId::new("acme").unwrap(),
                kind: kind.into(),
                payload: json!({"n": id}),
                run_at: None,
            }
            .checked()
            .unwrap(),
        )
        .await
        .unwrap();
}

async fn task(store: &DynControlPlaneStore, id: &str) -> Task {
    store
        .workflow_get(&AccountId::new("acme").unwrap(), &TaskId::new(id).unwrap())
        .await
        .unwrap()
}

async fn until(store: &DynControlPlaneStore, id: &str, done: impl Fn(&Task) -> bool) -> Task {
    let start = Instant::now();
    loop {
        let t = task(store, id).await;
        if done(&t) {
            return t;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{t:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_errors_and_panics_are_recorded_and_the_worker_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir, 2).await;
    let mut runner = TaskRunner::new(store.clone(), config(Duration::from_secs(10)));
    runner.register(
        "echo",
        |t: Task| async move { Ok(json!({"echo": t.payload})) },
    );
    runner.register("flaky", |_t: Task| async move {
        Err(TaskError::retry("upstream 503"))
    });
    runner.register("broken", |_t: Task| async move {
        Err(TaskError::fatal("bad payload"))
    });
    runner.register("panics", |_t: Task| async move {
        if true {
            panic!("handler bug");
        }
        Ok(json!(null))
    });
    assert_eq!(runner.kinds(), ["broken", "echo", "flaky", "panics"]);
    enqueue(&store, "p1", "panics").await;
    enqueue(&store, "e1", "echo").await;
    enqueue(&store, "f1", "flaky").await;
    enqueue(&store, "b1", "broken").await;
    enqueue(&store, "x1", "nobody-handles-this").await;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { runner.run(stopped).await });

    let t = until(&store, "e1", |t| t.state == TaskState::Completed).await;
    assert_eq!(t.result, Some(json!({"echo": {"n": "e1"}})));
    let t = until(&store, "p1", |t| t.state == TaskState::DeadLettered).await;
    assert!(
        t.last_error
            .as_deref()
            .unwrap()
            .contains("panicked: handler bug"),
        "{t:?}"
    );
    assert_eq!(t.attempts, 2, "a panic is a retryable failure");
    let t = until(&store, "f1", |t| t.state == TaskState::DeadLettered).await;
    assert_eq!(
        (t.attempts, t.last_error.as_deref()),
        (2, Some("upstream 503"))
    );
    let t = until(&store, "b1", |t| t.state == TaskState::DeadLettered).await;
    assert_eq!(t.attempts, 1, "a fatal error dead-letters at once");
    enqueue(&store, "e2", "echo").await;
    until(&store, "e2", |t| t.state == TaskState::Completed).await;
    assert_eq!(
        task(&store, "x1").await.state,
        TaskState::Pending,
        "unknown kinds are left alone"
    );
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.completed, 2);
    assert_eq!(report.failed, 5, "2 panics, 2 retryable errors, 1 fatal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_handler_keeps_its_lease_and_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir, 3).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut runner = TaskRunner::new(store.clone(), config(Duration::from_millis(600)));
    let counter = runs.clone();
    runner.register("long", move |_t: Task| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(3000)).await;
            Ok(json!("done"))
        }
    });
    enqueue(&store, "l1", "long").await;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { runner.run(stopped).await });
    // Two and a half leases: only renewals keep the rival out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rival = store
        .workflow_claim(
            TaskClaimRequest::new("rival", vec!["long".into()], 10, Duration::from_secs(5))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        rival.is_empty(),
        "the lease (600 ms) was not renewed past its first expiry"
    );
    let t = until(&store, "l1", |t| t.state == TaskState::Completed).await;
    assert_eq!(t.attempts, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_a_handler_that_outlives_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir, 3).await;
    let mut runner = TaskRunner::new(store.clone(), config(Duration::from_secs(10)));
    runner.register("stuck", |_t: Task| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(json!(null))
    });
    enqueue(&store, "s1", "stuck").await;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { runner.run(stopped).await });
    until(&store, "s1", |t| t.state == TaskState::Leased).await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.released, 1);
    let t = task(&store, "s1").await;
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(t.attempts, 0, "a release gives the attempt back");
}

/// A handler's progress is stored while it runs (with the heartbeats), so a
/// reader sees it move; the last report is stored before a failure, and the
/// retried run is handed it to go on from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_visible_while_a_handler_runs_and_handed_to_its_retry() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir, 2).await;
    let mut runner = TaskRunner::new(store.clone(), config(Duration::from_millis(300)));
    let go_on = Arc::new(tokio::sync::Notify::new());
    let waiting = go_on.clone();
    runner.register_with_progress("long", move |t: Task, progress| {
        let waiting = waiting.clone();
        async move {
            if let Some(p) = t.progress {
                // The retry: it starts from what the first run reported.
                return Ok(json!({"resumed_from": p}));
            }
            progress.report(json!({"page": 1}));
            waiting.notified().await;
            progress.report(json!({"page": 2}));
            Err(TaskError::retry("cut short"))
        }
    });
    enqueue(&store, "l1", "long").await;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { runner.run(stopped).await });
    let t = until(&store, "l1", |t| t.progress.is_some()).await;
    assert_eq!(t.state, TaskState::Leased, "visible while it runs");
    assert_eq!(t.progress, Some(json!({"page": 1})));
    go_on.notify_one();
    let t = until(&store, "l1", |t| t.state == TaskState::Completed).await;
    assert_eq!(t.result, Some(json!({"resumed_from": {"page": 2}})));
    assert_eq!(t.attempts, 2);
    stop.cancel();
    run.await.unwrap();
}
