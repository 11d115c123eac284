//! apalis with its PostgreSQL backend: fetches of 100 jobs, completions
//! written in batches by the backend, a concurrency limit of C with the
//! handlers spawned on the runtime (apalis's README set-up).

use std::sync::atomic::Ordering;
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use sqlx::postgres::PgPool;

use crate::{admin_pool, check_handled, count, execute, prefilled, time_drain};
use crate::{Noop, HANDLED, PREFILL_CHUNK};

/// apalis-postgres 1.0 keeps all its objects in this fixed schema.
const SCHEMA: &str = "apalis";
const QUEUE: &str = "peers_noop";
/// The shortest poll interval apalis's strategy takes.
const POLL_MS: u64 = 1;

async fn noop(_job: Noop) -> Result<(), BoxDynError> {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

pub async fn run(url: &str, jobs: usize, concurrency: usize) -> Result<f64, String> {
    let admin = admin_pool(url).await?;
    let drop_schema = format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE");
    execute(&admin, drop_schema.clone()).await?;
    let result = bench(url, &admin, jobs, concurrency).await;
    let dropped = execute(&admin, drop_schema).await;
    admin.close().await;
    let seconds = result?;
    dropped?;
    Ok(seconds)
}

async fn bench(url: &str, admin: &PgPool, jobs: usize, concurrency: usize) -> Result<f64, String> {
    // The peer's own pool (sqlx's default size, 10).
    let pool = PgPool::connect(url)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    let r = bench_on(&pool, admin, jobs, concurrency).await;
    pool.close().await;
    r
}

async fn bench_on(
    pool: &PgPool,
    admin: &PgPool,
    jobs: usize,
    concurrency: usize,
) -> Result<f64, String> {
    PostgresStorage::<()>::setup(pool)
        .await
        .map_err(|e| format!("migrations: {e}"))?;

    // `lock_tasks(false)` as in the crate's examples/basic.rs: the fetch
    // already marks its rows Queued under this worker; completions are still
    // written (`persist_results` stays on, the default).
    let config = Config::default()
        .queue(QUEUE)
        .batch_size(100)
        .lock_tasks(false);

    // Prefill through the batch add API (one multi-row INSERT per chunk).
    let mut storage = PostgresStorage::<Noop>::new(pool).with_config(config.clone());
    let mut left = jobs;
    while left > 0 {
        let n = left.min(PREFILL_CHUNK);
        storage
            .push_bulk(vec![Noop {}; n])
            .await
            .map_err(|e| format!("push_bulk: {e}"))?;
        left -= n;
    }
    // Statistics for the backlog, as graphile_worker's add_jobs takes itself
    // (and as autovacuum would shortly).
    execute(admin, format!("ANALYZE {SCHEMA}.jobs")).await?;
    prefilled().await?;

    // The backend fetches, and writes the completions it gathered, when it
    // is polled: the interval bounds its rate (README.md).
    let backend = PostgresStorage::<Noop>::new(pool)
        .with_config(config)
        .poll_with_strategy(Strategy::new().interval(Duration::from_millis(POLL_MS)));
    let ctx = WorkerContext::new("peers-apalis");
    let worker = WorkerBuilder::new(&ctx)
        .backend(backend)
        .concurrency(concurrency)
        .parallelize(tokio::spawn)
        .build(noop);

    let ours = format!("FROM {SCHEMA}.jobs WHERE job_type = '{QUEUE}'");
    let remaining = format!("SELECT count(*) {ours} AND status <> 'Done'");
    let run = worker.run();
    tokio::pin!(run);
    let seconds = time_drain(run.as_mut(), admin, jobs, &remaining).await;
    ctx.stop().map_err(|e| format!("cannot stop: {e}"))?;
    run.await.map_err(|e| format!("the worker failed: {e}"))?;
    let seconds = seconds?;
    check_handled(jobs)?;
    let done_sql = format!("SELECT count(*) {ours} AND status = 'Done'");
    let done = count(admin, &done_sql).await?;
    if done != jobs as i64 {
        return Err(format!("{done} of {jobs} jobs Done after shutdown"));
    }
    Ok(seconds)
}
