//! PgQ, Skype's queue in PostgreSQL (the `pgq` extension, Debian's
//! `postgresql-<major>-pgq3`). Producers only insert events; a ticker cuts
//! the event stream into batches by recording snapshots ("ticks"), and a
//! consumer takes one batch at a time (`pgq.next_batch`), reads its events
//! (`pgq.get_batch_events`) and moves its position past it
//! (`pgq.finish_batch`): nothing is updated or deleted per event (PgQ empties
//! its event tables by rotating and truncating them).
//!
//! Consumers: one, whose batches are handed to C handler tasks. Every
//! consumer registered on a PgQ queue receives every event (it is a
//! publish/subscribe log), so C consumers would handle each job C times;
//! sharing one consumer's batches among parallel workers is what PgQ's
//! separate `pgq_coop` extension (cooperative sub-consumers) is for, and
//! Debian does not package it (README.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Connection;

use crate::{admin_pool, check_handled, count, execute, prefilled, time_drain, unique_schema};
use crate::{Noop, HANDLED};

/// Events per producer transaction of the prefill, each followed by a tick:
/// the backlog is cut into batches of this many events (PgQ's default
/// `ticker_max_count`, and the claim size of graphile_worker's local queue;
/// README.md).
const BATCH: usize = 500;
/// The ticker's period, and the consumer's sleep when no batch is ready.
const TICK_MS: u64 = 10;

pub async fn run(url: &str, jobs: usize, concurrency: usize) -> Result<f64, String> {
    let admin = admin_pool(url).await?;
    let result = match ensure_extension(&admin).await {
        Ok(()) => {
            let queue = unique_schema("peers_pgq");
            let seconds = bench(url, &admin, &queue, jobs, concurrency).await;
            // Unregisters the consumer too (the `true`); nothing if the
            // queue was never created.
            let drop_queue = format!(
                "SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue \
                 WHERE queue_name = '{queue}'"
            );
            let dropped = execute(&admin, drop_queue).await;
            seconds.and_then(|s| dropped.map(|()| s))
        }
        Err(e) => Err(e),
    };
    admin.close().await;
    result
}

/// Creates the extension in this database (left in place afterwards, like
/// apalis's `pgcrypto` and `hstore`); says which package to install when the
/// server does not have it.
async fn ensure_extension(admin: &PgPool) -> Result<(), String> {
    let available = count(
        admin,
        "SELECT count(*) FROM pg_available_extensions WHERE name = 'pgq'",
    )
    .await?;
    if available == 0 {
        let major = count(
            admin,
            "SELECT (current_setting('server_version_num')::int / 10000)::bigint",
        )
        .await?;
        return Err(format!(
            "the database server has no pgq extension: install PgQ on it \
             (`apt-get install postgresql-{major}-pgq3` on Debian; `cargo xtask bench --peers` \
             does this for the local server)"
        ));
    }
    execute(admin, "CREATE EXTENSION IF NOT EXISTS pgq".to_owned()).await?;
    no_other_ticker(admin).await
}

/// PgQ allows one ticker per database (two calling `pgq.ticker()` at once can
/// record ticks whose snapshots disagree). Fails when another client, such as
/// the `pgqd` daemon the Debian package installs, has been ticking this
/// database: its last statement is one of pgqd's (lower case; ours are upper
/// case).
async fn no_other_ticker(admin: &PgPool) -> Result<(), String> {
    let others = count(
        admin,
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
         AND (query = 'select pgq.ticker()' OR query LIKE 'select %pgq.maint%')",
    )
    .await?;
    match others {
        0 => Ok(()),
        n => Err(format!(
            "{n} other session(s) of this database run PgQ's ticker (pgqd?): stop it \
             (`systemctl stop pgqd`); this peer runs its own"
        )),
    }
}

async fn bench(
    url: &str,
    admin: &PgPool,
    queue: &str,
    jobs: usize,
    concurrency: usize,
) -> Result<f64, String> {
    // The queue (its first tick included), then the consumer: a consumer sees
    // the events after the tick it registered at, so it registers before the
    // prefill. Its name is the queue's, unique too.
    one(admin, "SELECT pgq.create_queue($1)", queue).await?;
    // The explicit ticks of the prefill need only one new event; the 10 ms
    // ticker of the drain has no new events to cut and only adds idle ticks.
    for (param, value) in [("ticker_max_count", "1"), ("ticker_max_lag", "10 ms")] {
        sqlx::query_scalar::<_, i32>("SELECT pgq.set_queue_config($1, $2, $3)")
            .bind(queue)
            .bind(param)
            .bind(value)
            .fetch_one(admin)
            .await
            .map_err(|e| format!("pgq.set_queue_config({param}): {e}"))?;
    }
    one(admin, "SELECT pgq.register_consumer($1, $1)", queue).await?;
    let (queue_id, table): (i32, String) =
        sqlx::query_as("SELECT queue_id, queue_data_pfx FROM pgq.queue WHERE queue_name = $1")
            .bind(queue)
            .fetch_one(admin)
            .await
            .map_err(|e| format!("pgq.queue: {e}"))?;

    prefill(url, queue, jobs).await?;
    prefilled().await?;

    // Events not yet behind the consumer: those whose transaction the
    // snapshot of its last finished tick does not show as committed.
    let remaining = format!(
        "SELECT count(*) FROM {table} e WHERE NOT coalesce(txid_visible_in_snapshot(e.ev_txid, \
         (SELECT t.tick_snapshot FROM pgq.subscription s JOIN pgq.tick t \
         ON t.tick_queue = s.sub_queue AND t.tick_id = s.sub_last_tick \
         WHERE s.sub_queue = {queue_id})), false)"
    );
    // The worker's two connections, opened before the clock starts.
    let mut ticker_conn = connect(url).await?;
    let mut consumer_conn = connect(url).await?;
    let (stop, ended) = (AtomicBool::new(false), AtomicBool::new(false));
    let seconds = {
        let work = async {
            let r = tokio::try_join!(
                ticker(&mut ticker_conn, &stop),
                consume(&mut consumer_conn, queue, concurrency, &stop),
            );
            ended.store(true, Ordering::Relaxed);
            r.map(|_| ())
        };
        tokio::pin!(work);
        let seconds = time_drain(work.as_mut(), admin, jobs, &remaining).await;
        stop.store(true, Ordering::Relaxed);
        // A worker that ended early was already awaited by `time_drain`.
        if !ended.load(Ordering::Relaxed) {
            work.await?;
        }
        seconds
    };
    let _ = ticker_conn.close().await;
    let _ = consumer_conn.close().await;
    let seconds = seconds?;
    check_handled(jobs)?;
    match count(admin, &remaining).await? {
        0 => {}
        n => return Err(format!("{n} events left in the queue after shutdown")),
    }
    let open_batches = format!(
        "SELECT count(*) FROM pgq.subscription WHERE sub_queue = {queue_id} AND sub_batch IS NOT NULL"
    );
    if count(admin, &open_batches).await? != 0 {
        return Err("the consumer still holds a batch after shutdown".into());
    }
    no_other_ticker(admin).await?;
    Ok(seconds)
}

/// `sql` with `$1` bound to `queue`: a pgq function returning an integer.
async fn one(admin: &PgPool, sql: &'static str, queue: &str) -> Result<(), String> {
    sqlx::query_scalar::<_, i32>(sql)
        .bind(queue)
        .fetch_one(admin)
        .await
        .map(|_| ())
        .map_err(|e| format!("{sql}: {e}"))
}

async fn connect(url: &str) -> Result<PgConnection, String> {
    PgConnection::connect(url)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))
}

/// Inserts `jobs` events (type `noop`, data `{}`) in transactions of
/// [`BATCH`], each one set-based statement, and ticks after each commit (a
/// tick inside the transaction would not see its events). Uses a connection
/// of its own, closed at the end so that the server counts its commits
/// before the bench reads them.
async fn prefill(url: &str, queue: &str, jobs: usize) -> Result<(), String> {
    let mut conn = connect(url).await?;
    let mut left = jobs;
    while left > 0 {
        let n = left.min(BATCH);
        let rows = i32::try_from(n).map_err(|e| format!("chunk of {n}: {e}"))?;
        let mut tx = conn.begin().await.map_err(|e| format!("begin: {e}"))?;
        let inserted: i64 = sqlx::query_scalar(
            "SELECT count(pgq.insert_event($1, 'noop', '{}')) FROM generate_series(1, $2)",
        )
        .bind(queue)
        .bind(rows)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| format!("pgq.insert_event: {e}"))?;
        tx.commit().await.map_err(|e| format!("commit: {e}"))?;
        if inserted != i64::from(rows) {
            return Err(format!("{inserted} events inserted of {n}"));
        }
        let tick: Option<i64> = sqlx::query_scalar("SELECT pgq.ticker($1)")
            .bind(queue)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| format!("pgq.ticker: {e}"))?;
        if tick.is_none() {
            return Err("pgq.ticker made no tick after a chunk of the prefill".into());
        }
        left -= n;
    }
    conn.close().await.map_err(|e| format!("close: {e}"))
}

/// What `pgqd` would do, faster: `pgq.ticker()` (every queue of the
/// database) every [`TICK_MS`] until `stop`.
async fn ticker(conn: &mut PgConnection, stop: &AtomicBool) -> Result<(), String> {
    while !stop.load(Ordering::Relaxed) {
        sqlx::query_scalar::<_, i64>("SELECT pgq.ticker()")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| format!("pgq.ticker(): {e}"))?;
        tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
    }
    Ok(())
}

/// The consumer loop, as PgQ's Python consumer runs it: next batch, its
/// events, the handlers, finish; each statement its own transaction. Stops
/// between batches, so it never leaves one open.
async fn consume(
    conn: &mut PgConnection,
    queue: &str,
    concurrency: usize,
    stop: &AtomicBool,
) -> Result<(), String> {
    while !stop.load(Ordering::Relaxed) {
        let batch: Option<i64> = sqlx::query_scalar("SELECT pgq.next_batch($1, $1)")
            .bind(queue)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| format!("pgq.next_batch: {e}"))?;
        let Some(batch) = batch else {
            tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
            continue;
        };
        let events: Vec<Option<String>> =
            sqlx::query_scalar("SELECT ev_data FROM pgq.get_batch_events($1)")
                .bind(batch)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| format!("pgq.get_batch_events: {e}"))?;
        handle(events, concurrency).await?;
        let finished: i32 = sqlx::query_scalar("SELECT pgq.finish_batch($1)")
            .bind(batch)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| format!("pgq.finish_batch: {e}"))?;
        if finished != 1 {
            return Err(format!("pgq.finish_batch({batch}) found no such batch"));
        }
    }
    Ok(())
}

/// Runs the handler on every event of a batch, split among `concurrency`
/// tasks on the runtime; returns when all have run.
async fn handle(mut events: Vec<Option<String>>, concurrency: usize) -> Result<(), String> {
    let share = events.len().div_ceil(concurrency.max(1)).max(1);
    let mut tasks = tokio::task::JoinSet::new();
    while !events.is_empty() {
        let part = events.split_off(events.len().saturating_sub(share));
        tasks.spawn(async move { part.into_iter().try_for_each(noop) });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| format!("a handler task failed: {e}"))??;
    }
    Ok(())
}

/// The handler: decodes the payload as the other peers' handlers receive it,
/// and counts the job.
fn noop(data: Option<String>) -> Result<(), String> {
    let data = data.ok_or("an event without data")?;
    serde_json::from_str::<Noop>(&data).map_err(|e| format!("payload {data:?}: {e}"))?;
    HANDLED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
