//! Burn-down, steady state, the raw SQL beside the adapter, the minimal queue and the peers.

use crate::{
    drain_port, drain_raw, drop_schema, embedded_store, endpoint, fail, pg_prefill, pg_store,
    prefill, raw_client, record_delivered, repeat, unique, Args, BenchResult,
};
use control_plane_core::{ClaimRequest, ControlPlaneStore, DynControlPlaneStore};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) async fn raw_vs_adapter(a: &Args) -> BenchResult<String> {
    let mut out = String::from(
        "| connections | batch | deliveries drained | raw SQL (deliveries/s, median of the runs) | adapter (deliveries/s, median of the runs) | adapter / raw |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for conns in [1usize, 16] {
        for batch in [1u32, 10, 100] {
            let total = match (a.quick, batch) {
                (true, _) => 300,
                (false, 1) => 3_000,
                (false, 10) => 10_000,
                (false, _) => 20_000,
            };
            let raw = repeat(a.runs, || async {
                let schema = unique("bench_raw");
                let store = pg_store(&a.url, &schema, 4, false).await?;
                let e = endpoint(&store, "https://example.com/hook").await?;
                pg_prefill(&a.url, &schema, &e, total).await?;
                drop(store);
                let r = drain_raw(&a.url, &schema, conns, i64::from(batch), total).await;
                drop_schema(&a.url, &schema).await?;
                r
            })
            .await?;
            let port = repeat(a.runs, || async {
                let schema = unique("bench_port");
                let store = pg_store(&a.url, &schema, conns as u32, false).await?;
                let e = endpoint(&store, "https://example.com/hook").await?;
                pg_prefill(&a.url, &schema, &e, total).await?;
                let r = drain_port(Arc::new(store), conns, batch, total).await;
                drop_schema(&a.url, &schema).await?;
                r
            })
            .await?;
            let _ = writeln!(
                out,
                "| {conns} | {batch} | {total} | {raw:.0} | {port:.0} | {:.2} |",
                port / raw
            );
            eprintln!("bench: raw vs adapter {conns} x {batch}: {raw:.0} vs {port:.0}");
        }
    }
    Ok(out)
}

/// The burn-down backlog: 200,000 deliveries (quick runs keep it tiny, and
/// smaller on embedded, whose debug build is slow).
pub(crate) fn burn_size(a: &Args, profile: &str) -> usize {
    match (a.quick, profile) {
        (false, _) => 200_000,
        (true, "postgres") => 1_000,
        (true, _) => 100,
    }
}

/// One burn-down: `n` deliveries prefilled, then drained through the port
/// (16 workers on postgres, 2 on embedded, claims of 100); deliveries/s.
pub(crate) async fn burn_down(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
    n: usize,
) -> BenchResult<f64> {
    let (store, schema) = open_profile(a, profile, dir).await?;
    let e = endpoint(store.as_ref(), "https://example.com/hook").await?;
    match &schema {
        Some(s) => pg_prefill(&a.url, s, &e, n).await?,
        None => {
            let t = Instant::now();
            prefill(store.as_ref(), n).await?;
            eprintln!(
                "bench: {profile}: published {n} through the port at {:.0}/s",
                n as f64 / t.elapsed().as_secs_f64()
            );
        }
    }
    let workers = if profile == "postgres" { 16 } else { 2 };
    let before = match &schema {
        Some(_) => Some(DbCost::read(&a.url).await?),
        None => None,
    };
    let r = drain_port(store, workers, 100, n).await;
    if let Some(before) = before {
        let cost = DbCost::read(&a.url).await?.since(&before, n);
        eprintln!(
            "bench: burn-down postgres: {:.3} commits and {:.0} WAL bytes per delivery",
            cost.0, cost.1
        );
        *last_cost() = Some(cost);
    }
    if let Some(s) = schema {
        drop_schema(&a.url, &s).await?;
    }
    r
}

/// The database's cost per delivery of the last postgres burn-down:
/// (commits, WAL bytes).
static LAST_COST: std::sync::Mutex<Option<(f64, f64)>> = std::sync::Mutex::new(None);

fn last_cost() -> std::sync::MutexGuard<'static, Option<(f64, f64)>> {
    LAST_COST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the database has done so far: commits of this database and the
/// WAL position, read after its statistics are flushed.
pub(crate) struct DbCost {
    commits: i64,
    wal: i64,
}

impl DbCost {
    pub(crate) async fn read(url: &str) -> BenchResult<DbCost> {
        // Backends flush their statistics about once a second when idle.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let c = raw_client(url, "public").await?;
        let row = c
            .query_one(
                "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint \
                 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .map_err(fail)?;
        Ok(DbCost {
            commits: row.get(0),
            wal: row.get(1),
        })
    }

    /// Commits and WAL bytes per delivery since `before`, over `n`.
    pub(crate) fn since(&self, before: &DbCost, n: usize) -> (f64, f64) {
        let n = n.max(1) as f64;
        (
            (self.commits - before.commits) as f64 / n,
            (self.wal - before.wal) as f64 / n,
        )
    }
}

/// The table, and the postgres burn-down figure for the peers' table.
pub(crate) async fn burn_down_and_steady(
    a: &Args,
    dir: &std::path::Path,
) -> BenchResult<(String, Option<f64>)> {
    let mut out = String::from(
        "| adapter | burn-down: drain of a prefilled backlog (deliveries/s, median of the runs) | database per delivery in the last run: commits / WAL bytes | minimal queue, same size, 16 connections, batches of 100 (jobs/s, median; burn-down / minimal) | steady state: completed while publishing (deliveries/s, one run) | backlog start → end |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    let mut pg_burn = None;
    for &profile in &a.profiles {
        let prefilled = burn_size(a, profile);
        let burn = repeat(a.runs, || burn_down(a, profile, dir, prefilled)).await?;
        let (steady, backlog) = steady_state(a, profile, dir).await?;
        let (minimal, cost) = if profile == "postgres" {
            pg_burn = Some(burn);
            let cost = last_cost().map_or("–".into(), |(commits, wal)| {
                format!("{commits:.3} / {wal:.0}")
            });
            let m = repeat(a.runs, || async {
                Ok(minimal_queue(a, prefilled, 16, 100, false).await?.0)
            })
            .await?;
            (format!("{m:.0} ({:.2})", burn / m), cost)
        } else {
            ("–".into(), "–".into())
        };
        let _ = writeln!(
            out,
            "| {profile} | {burn:.0} | {cost} | {minimal} | {steady:.0} | {backlog} |"
        );
        eprintln!("bench: burn-down {profile}: {burn:.0}/s, steady {steady:.0}/s");
    }
    Ok((out, pg_burn))
}

/// The same burn-down with the queues users would pick instead of ours
/// (`crates/peers`: graphile_worker in its documented fast mode, PgQ with
/// one consumer whose batches 16 tasks handle, apalis with batches of 100),
/// 16 workers, on the same database; `ours` is the postgres burn-down of this
/// run (measured here when that section did not run). Beside each rate, the
/// database's commits and WAL bytes per job in the last run: ours from the
/// drain alone (`burn_down`); a peer's from the end of its prefill (it pauses
/// there, see [`peer_run`]) to its exit, so they also hold its shutdown and
/// clean-up, a few statements against the drain's thousands of transactions.
pub(crate) async fn peers(
    a: &Args,
    bin: &str,
    dir: &std::path::Path,
    ours: Option<f64>,
) -> BenchResult<String> {
    let n = burn_size(a, "postgres");
    let ours = match ours {
        Some(v) => v,
        None => repeat(a.runs, || burn_down(a, "postgres", dir, n)).await?,
    };
    let cost = |c: Option<(f64, f64)>| {
        c.map_or("– | –".to_owned(), |(commits, wal)| {
            format!("{commits:.3} | {wal:.0}")
        })
    };
    let ours_cost = cost(*last_cost());
    let mut out = format!(
        "| queue | jobs drained | jobs/s (median of the runs) | ours / this | commits per job, last run (ours: the drain; peers: the drain, shutdown and clean-up) | WAL bytes per job, same span |\n\
         | --- | --- | --- | --- | --- | --- |\n\
         | control-plane postgres adapter (attempt log written) | {n} | {ours:.0} | 1.00 | {ours_cost} |\n"
    );
    // The anchor issue 73 measures the log shape against: the minimal queue
    // that also appends an attempt row per job, as ours must.
    let last = std::cell::Cell::new(None);
    let rate = repeat(a.runs, || async {
        let (rate, c) = minimal_queue(a, n, 16, 100, true).await?;
        last.set(Some(c));
        Ok(rate)
    })
    .await?;
    let _ = writeln!(
        out,
        "| minimal queue + attempt row (anchor: 16 connections, claims of 100, one attempt row per job) | {n} | {rate:.0} | {:.2} | {} |",
        ours / rate,
        cost(last.get())
    );
    // apalis drains a backlog of 200,000 at about 1,000/s (its fetch slows
    // with the backlog; crates/peers/README.md): one run, not three.
    for (peer, runs) in [("graphile_worker", a.runs), ("pgq", a.runs), ("apalis", 1)] {
        let last = std::cell::Cell::new(None);
        let rate = repeat(runs, || async {
            let (rate, c) = peer_run(a, bin, peer, n).await?;
            last.set(Some(c));
            Ok(rate)
        })
        .await?;
        let runs = if runs == 1 { " (one run)" } else { "" };
        let _ = writeln!(
            out,
            "| {peer}{runs} | {n} | {rate:.0} | {:.2} | {} |",
            ours / rate,
            cost(last.get())
        );
        eprintln!("bench: peer {peer}: {rate:.0}/s (ours {ours:.0}/s)");
    }
    Ok(out)
}

/// One burn-down of `peer` with `n` jobs and 16 workers. The peer runs with
/// `--pause-before-drain`: when it reports its prefill done it waits, the
/// database's counters are read ([`DbCost`]), and it is let go; they are read
/// again after it has exited (its connections closed, so the server has
/// counted all their commits). Returns its jobs/s and the (commits, WAL
/// bytes) per job in between.
async fn peer_run(a: &Args, bin: &str, peer: &str, n: usize) -> BenchResult<(f64, (f64, f64))> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut child = tokio::process::Command::new(bin)
        .args(["--peer", peer, "--database-url", &a.url])
        .args(["--jobs", &n.to_string(), "--concurrency", "16"])
        .arg("--pause-before-drain")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run {bin}: {e}"))?;
    // On an early return these drop: the peer reads the end of its stdin,
    // fails, cleans up and exits.
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(format!("{peer}: no pipes to the child"));
    };
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let (mut before, mut report) = (None, None);
    while let Some(line) = lines.next_line().await.map_err(fail)? {
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("{peer}: {e} in {line:?}"))?;
        if v.get("paused").is_some() {
            before = Some(DbCost::read(&a.url).await?);
            stdin.write_all(b"\n").await.map_err(fail)?;
            stdin.flush().await.map_err(fail)?;
        } else {
            report = Some(v);
        }
    }
    let status = child.wait().await.map_err(fail)?;
    if !status.success() {
        return Err(format!("the {peer} burn-down failed ({status})"));
    }
    let (Some(before), Some(report)) = (before, report) else {
        return Err(format!("{peer}: no pause before the drain, or no report"));
    };
    let cost = DbCost::read(&a.url).await?.since(&before, n);
    let rate = report["jobs_per_s"]
        .as_f64()
        .ok_or_else(|| format!("{peer}: no jobs_per_s in {report}"))?;
    Ok((rate, cost))
}

/// The limit of this database on this machine, for comparison with the
/// burn-down: a minimal queue (one table; a claim of `batch` rows with
/// `FOR UPDATE SKIP LOCKED` that sets a lease, then a delete on completion;
/// no attempt log, no accounts, no endpoints) drained by `conns` connections.
/// With `attempt_row`, the completion also appends one row per job to an
/// attempt log in the same statement: the honest limit of a queue that keeps
/// every attempt, as ours does (issue 73's "minimal + attempt row").
/// Returns jobs/s and the database's (commits, WAL bytes) per job over the
/// drain alone ([`DbCost`]).
pub(crate) async fn minimal_queue(
    a: &Args,
    total: usize,
    conns: usize,
    batch: i64,
    attempt_row: bool,
) -> BenchResult<(f64, (f64, f64))> {
    let schema = unique("bench_minimal");
    let setup = raw_client(&a.url, "public").await?;
    setup
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}; \
             CREATE TABLE jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL, \
             locked_until timestamptz NOT NULL DEFAULT '-infinity'); \
             CREATE TABLE attempts (job_id bigint NOT NULL, result text NOT NULL, status_code int, \
             latency_ms int NOT NULL, recorded_at timestamptz NOT NULL); \
             CREATE INDEX attempts_by_job ON attempts (job_id); \
             INSERT INTO jobs (payload) SELECT '{{}}' FROM generate_series(1, {total}); ANALYZE jobs"
        ))
        .await
        .map_err(fail)?;
    let complete = if attempt_row {
        "WITH j AS (DELETE FROM jobs WHERE id = ANY($1) RETURNING id) \
         INSERT INTO attempts (job_id, result, status_code, latency_ms, recorded_at) \
         SELECT id, 'delivered', 200, 1, now() FROM j"
    } else {
        "DELETE FROM jobs WHERE id = ANY($1)"
    };
    let before = DbCost::read(&a.url).await?;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let c = raw_client(&a.url, &schema).await?;
        let done = done.clone();
        tasks.spawn(async move {
            let claim = c
                .prepare(
                    "UPDATE jobs SET locked_until = now() + interval '60 seconds' WHERE id IN \
                     (SELECT id FROM jobs WHERE locked_until < now() ORDER BY id \
                     FOR UPDATE SKIP LOCKED LIMIT $1) RETURNING id",
                )
                .await
                .map_err(fail)?;
            let complete = c.prepare(complete).await.map_err(fail)?;
            loop {
                let rows = c.query(&claim, &[&batch]).await.map_err(fail)?;
                if rows.is_empty() {
                    return Ok::<(), String>(());
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                c.execute(&complete, &[&ids]).await.map_err(fail)?;
                done.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed) as usize;
    let cost = DbCost::read(&a.url).await?.since(&before, n);
    drop_schema(&a.url, &schema).await?;
    if n != total {
        return Err(format!("the minimal queue drained {n} of {total}"));
    }
    Ok((rate, cost))
}

pub(crate) async fn open_profile(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
) -> BenchResult<(DynControlPlaneStore, Option<String>)> {
    if profile == "postgres" {
        let schema = unique("bench_pg");
        let store = pg_store(&a.url, &schema, 20, true).await?;
        Ok((Arc::new(store), Some(schema)))
    } else {
        Ok((Arc::new(embedded_store(dir).await?), None))
    }
}

/// Publishers and drainers at once for a fixed time: completions per second
/// and the backlog at the start and the end.
pub(crate) async fn steady_state(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
) -> BenchResult<(f64, String)> {
    let (store, schema) = open_profile(a, profile, dir).await?;
    endpoint(store.as_ref(), "https://example.com/hook").await?;
    let backlog = match (a.quick, profile) {
        (false, _) => 5_000,
        (true, "postgres") => 200,
        (true, _) => 50,
    };
    prefill(store.as_ref(), backlog).await?;
    let seconds = if a.quick { 2 } else { 10 };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let workers = if profile == "postgres" { 12 } else { 2 };
    for w in 0..workers {
        let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
        tasks.spawn(async move { claim_and_complete(store.as_ref(), w, &stop, &done).await });
    }
    // Publishers: batches of 50, paced to keep the backlog near its start.
    for _ in 0..2 {
        let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
        let published = Arc::new(AtomicU64::new(0));
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ahead = published.load(Ordering::Relaxed) as i64
                    - done.load(Ordering::Relaxed) as i64 / 2;
                if ahead > 500 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                prefill(store.as_ref(), 50).await?;
                published.fetch_add(50, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            Ok::<(), String>(())
        });
    }
    let before = done.load(Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let completed = done.load(Ordering::Relaxed) - before;
    let rate = completed as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    let pending = store
        .delivery_count_by_state()
        .await
        .map_err(fail)?
        .into_iter()
        .filter(|(s, _)| !s.is_final())
        .map(|(_, n)| n)
        .sum::<u64>();
    if let Some(s) = schema {
        drop_schema(&a.url, &s).await?;
    }
    Ok((rate, format!("{backlog} → {pending}")))
}

/// One worker of [`steady_state`]: claims up to 100 and records them
/// delivered in one batch, until `stop`; counts them in `done`.
async fn claim_and_complete(
    store: &dyn ControlPlaneStore,
    w: usize,
    stop: &std::sync::atomic::AtomicBool,
    done: &AtomicU64,
) -> BenchResult<()> {
    while !stop.load(Ordering::Relaxed) {
        let claimed = store
            .delivery_claim(
                ClaimRequest::new(format!("w{w}"), 100, Duration::from_secs(60)).map_err(fail)?,
            )
            .await
            .map_err(fail)?;
        if claimed.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let n = record_delivered(store, &claimed).await?;
        done.fetch_add(n, Ordering::Relaxed);
    }
    Ok(())
}
