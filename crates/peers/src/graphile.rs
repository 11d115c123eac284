//! graphile_worker in its documented high-throughput mode: a local queue that
//! batch-fetches jobs and batched completions (the settings of the crate's
//! own `benches/perf_test.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, RefetchDelayConfig, TaskHandler,
    WorkerContext, WorkerOptions,
};
use sqlx::postgres::PgPool;

use crate::{admin_pool, check_handled, count, execute, prefilled, time_drain, unique_schema};
use crate::{Noop, HANDLED, PREFILL_CHUNK};

impl TaskHandler for Noop {
    const IDENTIFIER: &'static str = "noop";

    async fn run(self, _ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        HANDLED.fetch_add(1, Ordering::Relaxed);
        Ok::<(), String>(())
    }
}

pub async fn run(url: &str, jobs: usize, concurrency: usize) -> Result<f64, String> {
    let admin = admin_pool(url).await?;
    let schema = unique_schema("peers_graphile");
    let result = bench(url, &admin, &schema, jobs, concurrency).await;
    let drop_schema = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let dropped = execute(&admin, drop_schema).await;
    admin.close().await;
    let seconds = result?;
    dropped?;
    Ok(seconds)
}

async fn bench(
    url: &str,
    admin: &PgPool,
    schema: &str,
    jobs: usize,
    concurrency: usize,
) -> Result<f64, String> {
    // `init` connects (a pool of 20, the default) and runs the migrations,
    // which create the schema.
    let worker = WorkerOptions::default()
        .database_url(url)
        .schema(schema)
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(100))
        .local_queue(
            LocalQueueConfig::default()
                .with_size(500)
                .with_refetch_delay(
                    RefetchDelayConfig::default().with_duration(Duration::from_millis(10)),
                ),
        )
        .complete_job_batch_delay(Duration::from_millis(5))
        .fail_job_batch_delay(Duration::from_millis(5))
        .listen_os_shutdown_signals(false)
        .define_job::<Noop>()
        .init()
        .await
        .map_err(|e| format!("init: {e}"))?;

    // Prefill through the batch add API (one `add_jobs` SQL call per chunk;
    // it runs ANALYZE itself after chunks of 10,000 or more).
    let utils = worker.create_utils();
    let spec = JobSpec::default();
    let mut left = jobs;
    while left > 0 {
        let n = left.min(PREFILL_CHUNK);
        let chunk: Vec<(Noop, &JobSpec)> = (0..n).map(|_| (Noop {}, &spec)).collect();
        utils
            .add_jobs::<Noop>(&chunk)
            .await
            .map_err(|e| format!("add_jobs: {e}"))?;
        left -= n;
    }
    prefilled().await?;

    // Completed jobs are deleted from the jobs table.
    let remaining = format!("SELECT count(*) FROM \"{schema}\"._private_jobs");
    let run = worker.run();
    tokio::pin!(run);
    let seconds = time_drain(run.as_mut(), admin, jobs, &remaining).await;
    worker.request_shutdown();
    run.await.map_err(|e| format!("the worker failed: {e}"))?;
    let seconds = seconds?;
    check_handled(jobs)?;
    match count(admin, &remaining).await? {
        0 => Ok(seconds),
        n => Err(format!("{n} jobs left in the queue after shutdown")),
    }
}
