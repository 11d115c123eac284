//! Replicas as separate processes: three `control-plane worker` processes
//! against one PostgreSQL schema share one endpoint's rate limit, because the
//! store enforces it in the claim's transaction (ADR 0009).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::*;
use control_plane_store_kit::DatabaseUrl;
use workspace_tests::{
    answer_ok, assert_rate_kept, database_url, events, secret_keys, Process, Receiver, Schema,
};

/// Three worker processes, one endpoint limited to 20 requests per second
/// (burst 20), a backlog larger than 10 s can drain: over 10 s the receiver
/// never sees more than the rate plus the burst in any one-second window, and
/// the workers together do use the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_keep_an_endpoints_rate_limit() {
    let schema = Schema::new("cp_rate");
    let (rx, base) = Receiver::start(answer_ok()).await;
    let mut cfg = store_postgres::PostgresConfig::new(DatabaseUrl::new(database_url()));
    cfg.schema = Some(schema.0.clone());
    cfg.pool_size = 2;
    cfg.keys = secret_keys();
    let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .unwrap();
    let account = AccountId::new("rate").unwrap();
    let mut create = EndpointCreateRequest::new(
        account.clone(),
        format!("{base}/limited"),
        Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    );
    create.rate_limit_per_s = Some(20);
    store
        .endpoint_create(create.checked().unwrap())
        .await
        .unwrap();
    store
        .event_publish_batch(
            control_plane_core::Checked::all(events(&account, "rate", 400)).unwrap(),
        )
        .await
        .unwrap();
    let mut env = schema.env(4);
    env.push(("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()));
    env.push(("CONTROLPLANE_CONCURRENCY", "16".to_string()));
    let bin = env!("CARGO_BIN_EXE_control-plane");
    let mut workers: Vec<Process> = (0..3)
        .map(|_| Process::start(bin, "worker", &env))
        .collect();
    let start = Instant::now();
    while rx.count() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing arrived: {}",
            workers[0].log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = rx.all()[0].at;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(first.elapsed())).await;
    // Arrival times, in milliseconds after the first, over 10 s.
    let at: Vec<i64> = rx
        .all()
        .iter()
        .map(|r| r.at.duration_since(first).as_millis() as i64)
        .filter(|ms| *ms < 10_000)
        .collect();
    for w in &mut workers {
        assert!(w.is_running(), "a worker died: {}", w.log());
        w.kill();
    }
    // At least half the rate: the limit does not starve, with room for a busy machine.
    assert_rate_kept("3 worker processes, requests", &at, 20, 10, 100);
}
