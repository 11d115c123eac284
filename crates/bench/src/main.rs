//! The benchmark harness behind `cargo xtask bench`: the postgres adapter
//! beside the same SQL issued raw, burn-down and steady state on both
//! adapters, end-to-end delivery through the dispatcher to a local receiver,
//! wake-up latency with and without LISTEN/NOTIFY, growth, and the memory of
//! `control-plane serve`. It prints markdown tables; `--quick` shrinks every
//! size for a smoke run that asserts nothing about speed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::DatabaseUrl;
use control_plane_core::*;
use dispatcher::Cidr;
use dispatcher::{Dispatcher, DispatcherConfig};
use store_embedded::{EmbeddedConfig, EmbeddedStore};
use store_postgres::{PostgresConfig, PostgresStore};
use tokio_util::sync::CancellationToken;
use workspace_tests::{answer_after, api_call, Receiver};

mod checks;

type BenchResult<T> = Result<T, String>;

fn fail<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

struct Args {
    quick: bool,
    only: Option<String>,
    /// The adapters of the burn-down and end-to-end sections.
    profiles: Vec<&'static str>,
    url: String,
    runs: usize,
    serve_bin: Option<String>,
    /// `crates/peers`' binary: runs the peers' burn-down when given.
    peers_bin: Option<String>,
    /// The larger history of the growth section (issue 35's target: ten
    /// million rows).
    growth_rows: i64,
}

fn args() -> BenchResult<Args> {
    let mut a = Args {
        quick: false,
        only: None,
        profiles: vec!["postgres", "embedded"],
        url: std::env::var("CONTROLPLANE_TEST_DATABASE_URL").unwrap_or_default(),
        runs: 3,
        serve_bin: None,
        peers_bin: None,
        growth_rows: 10_000_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--database-url" => a.url = it.next().ok_or("--database-url needs a value")?,
            "--serve-bin" => a.serve_bin = it.next(),
            "--peers-bin" => a.peers_bin = it.next(),
            "--only" => a.only = it.next(),
            "--profile" => {
                a.profiles = match it.next().as_deref() {
                    Some("postgres") => vec!["postgres"],
                    Some("embedded") => vec!["embedded"],
                    other => {
                        return Err(format!(
                            "--profile takes postgres or embedded, not {other:?}"
                        ))
                    }
                }
            }
            "--runs" => {
                a.runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--runs needs a number")?
            }
            "--growth-rows" => {
                a.growth_rows = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 10_000)
                    .ok_or("--growth-rows needs a number above 10000")?
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.url.is_empty() {
        return Err(
            "no database: pass --database-url or set CONTROLPLANE_TEST_DATABASE_URL".into(),
        );
    }
    if a.quick {
        a.runs = 1;
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(report) => {
            println!("{report}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

// ------------------------------------------------------------------ helpers

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn repeat<F, Fut>(runs: usize, mut f: F) -> BenchResult<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = BenchResult<f64>>,
{
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        v.push(f().await?);
    }
    Ok(median(v))
}

fn acct() -> AccountId {
    AccountId::new("bench").unwrap_or_else(|_| unreachable!())
}

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh postgres store in its own schema.
async fn pg_store(url: &str, schema: &str, pool: u32, listen: bool) -> BenchResult<PostgresStore> {
    let mut cfg = PostgresConfig::new(DatabaseUrl::new(url));
    cfg.schema = Some(schema.to_string());
    cfg.pool_size = pool;
    cfg.listen = listen;
    PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .map_err(fail)
}

async fn raw_client(url: &str, schema: &str) -> BenchResult<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(fail)?;
    tokio::spawn(conn);
    client
        // The session the adapter's connections get (store-postgres).
        .batch_execute(&format!(
            "SET search_path TO {schema}; SET plan_cache_mode = force_custom_plan"
        ))
        .await
        .map_err(fail)?;
    Ok(client)
}

async fn drop_schema(url: &str, schema: &str) -> BenchResult<()> {
    let c = raw_client(url, "public").await?;
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
        .map_err(fail)
}

async fn embedded_store(dir: &std::path::Path) -> BenchResult<EmbeddedStore> {
    EmbeddedStore::open(
        EmbeddedConfig::new(dir.join(format!("{}.duckdb", unique("b")))),
        Arc::new(SystemClock),
    )
    .await
    .map_err(fail)
}

/// The throughput sections' one endpoint: every delivery may be in flight
/// at once, so they measure the store and the dispatcher, not the cap.
async fn endpoint(store: &dyn ControlPlaneStore, url: &str) -> BenchResult<Endpoint> {
    flow_endpoint(store, url, &[], Some(10_000)).await
}

async fn flow_endpoint(
    store: &dyn ControlPlaneStore,
    url: &str,
    types: &[&str],
    max_in_flight: Option<u32>,
) -> BenchResult<Endpoint> {
    let mut req = EndpointCreateRequest::new(
        acct(),
        url,
        Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    );
    req.event_types = types.iter().map(|t| t.to_string()).collect();
    req.max_in_flight = max_in_flight;
    store.endpoint_create(req).await.map_err(fail)
}

/// Publishes `n` events (one delivery each) in batches of 500.
async fn prefill(store: &dyn ControlPlaneStore, n: usize) -> BenchResult<()> {
    let mut left = n;
    while left > 0 {
        let b = left.min(500);
        let reqs = (0..b)
            .map(|i| PublishRequest::new(acct(), "bench.event", serde_json::json!({"i": i})))
            .collect();
        store.event_publish_batch(reqs).await.map_err(fail)?;
        left -= b;
    }
    Ok(())
}

/// A postgres backlog of `n` pending deliveries written with
/// `generate_series` (what the port would write, much faster; its ids
/// time-ordered as the port's are), then analyzed as autovacuum would after
/// such an insert. Burn-down measures the drain.
async fn pg_prefill(url: &str, schema: &str, e: &Endpoint, n: usize) -> BenchResult<()> {
    let c = raw_client(url, schema).await?;
    let now = now_ms();
    let n = i64::try_from(n).map_err(fail)?;
    c.execute(
        "WITH g AS (SELECT (lpad(to_hex($2::bigint), 12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid AS id \
         FROM generate_series(1, $3::bigint) g), \
         ev AS (INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
         SELECT id, 'bench', 'bench.event', '{\"type\":\"bench.event\",\"data\":{}}', NULL, $2 \
         FROM g ORDER BY id RETURNING id), \
         d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
         SELECT ev.id, 'bench', $1, ev.id, nextval('delivery_seq'), $2 FROM ev \
         RETURNING id, endpoint_id, seq) \
         INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, \
         due_at, updated_at) SELECT endpoint_id, seq, id, 'bench', 'pending', 0, 8, $2, $2 FROM d",
        &[&e.id.0, &now, &n],
    )
    .await
    .map_err(fail)?;
    c.batch_execute("ANALYZE").await.map_err(fail)
}

fn delivered() -> DeliveryOutcome {
    DeliveryOutcome::Delivered(AttemptReport {
        status_code: Some(200),
        error: None,
        latency_ms: 1,
        response_body: None,
    })
}

/// Drains through the port with `workers` tasks claiming `batch` at a time;
/// returns deliveries per second.
async fn drain_port(
    store: DynControlPlaneStore,
    workers: usize,
    batch: u32,
    total: usize,
) -> BenchResult<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (store, done) = (store.clone(), done.clone());
        tasks.spawn(async move {
            let mut idle = 0;
            loop {
                let claimed = store
                    .delivery_claim(ClaimRequest::new(
                        format!("w{w}"),
                        batch,
                        Duration::from_secs(60),
                    ))
                    .await
                    .map_err(fail)?;
                if claimed.is_empty() {
                    idle += 1;
                    if idle > 3 {
                        return Ok::<(), String>(());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                // What a worker's completion batcher does: one batch per claim.
                let batch: Vec<_> = claimed
                    .iter()
                    .map(|c| (c.lease.clone(), delivered()))
                    .collect();
                let n = batch.len() as u64;
                for r in store.delivery_record_outcomes(batch).await.map_err(fail)? {
                    r.map_err(fail)?;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    let n = done.load(Ordering::Relaxed) as usize;
    if n != total {
        return Err(format!("drained {n} of {total}"));
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn now_ms() -> i64 {
    SystemClock.now().as_millis()
}

/// Drains with the adapter's claim and batch-complete statements issued raw
/// on `conns` connections: one transaction per claim, one statement per
/// completion batch.
async fn drain_raw(
    url: &str,
    schema: &str,
    conns: usize,
    batch: i64,
    total: usize,
) -> BenchResult<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..conns {
        clients.push(raw_client(url, schema).await?);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (w, mut client) in clients.into_iter().enumerate() {
        let done = done.clone();
        tasks.spawn(async move {
            let claim = client
                .prepare(&store_postgres::claim_statement())
                .await
                .map_err(fail)?;
            let complete = client
                .prepare(store_postgres::RECORD_DELIVERED)
                .await
                .map_err(fail)?;
            let worker = format!("raw{w}");
            // The claim goes endpoint by endpoint: every endpoint, up to a batch each.
            let endpoints: Vec<uuid::Uuid> = client
                .query("SELECT id FROM endpoints", &[])
                .await
                .map_err(fail)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let counts: Vec<i64> = vec![batch; endpoints.len()];
            let heads: Vec<Option<i64>> = vec![None; endpoints.len()];
            let caps: Vec<i64> = vec![i64::from(u32::MAX); endpoints.len()];
            let mut idle = 0;
            loop {
                let now = now_ms();
                let tx = client.transaction().await.map_err(fail)?;
                let rows = tx
                    .query(
                        &claim,
                        &[
                            &now,
                            &endpoints,
                            &(now + 60_000),
                            &worker,
                            &counts,
                            &heads,
                            &caps,
                        ],
                    )
                    .await
                    .map_err(fail)?;
                tx.commit().await.map_err(fail)?;
                if rows.is_empty() {
                    idle += 1;
                    if idle > 3 {
                        return Ok::<(), String>(());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
                // Column 19 of the claim is the lease token.
                let tokens: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(19)).collect();
                let errors: Vec<Option<String>> = vec![None; ids.len()];
                let codes: Vec<Option<i64>> = vec![Some(200); ids.len()];
                let latencies: Vec<i64> = vec![1; ids.len()];
                let bodies: Vec<Option<String>> = vec![None; ids.len()];
                let n = client
                    .execute(
                        &complete,
                        &[
                            &ids,
                            &tokens,
                            &errors,
                            &codes,
                            &latencies,
                            &now_ms(),
                            &bodies,
                        ],
                    )
                    .await
                    .map_err(fail)?;
                done.fetch_add(n, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    let n = done.load(Ordering::Relaxed) as usize;
    if n != total {
        return Err(format!("raw drained {n} of {total}"));
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

// ----------------------------------------------------------------- sections

async fn machine(a: &Args) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Read back from the server: a throwaway cluster runs with fsync off.
    let (version, fsync_on, sync_commit) = match raw_client(&a.url, "public").await {
        Ok(c) => (
            show(&c, "server_version").await,
            show(&c, "fsync").await,
            show(&c, "synchronous_commit").await,
        ),
        Err(e) => (e, "unknown".into(), "unknown".into()),
    };
    let fsync = pg_test_fsync().unwrap_or_else(|| "not measured (pg_test_fsync not found)".into());
    format!(
        "| cores | PostgreSQL | fsync | synchronous_commit | pg_test_fsync fdatasync (one 8 kB write) |\n\
         | --- | --- | --- | --- | --- |\n| {cores} | {version} | {fsync_on} | {sync_commit} | {fsync} |\n"
    )
}

/// A server setting as the server reports it.
async fn show(c: &tokio_postgres::Client, name: &str) -> String {
    c.query_one(&format!("SHOW {name}"), &[])
        .await
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

fn pg_test_fsync() -> Option<String> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|d| d.path().join("bin/pg_test_fsync"))
        .find(|p| p.exists())?;
    let file = std::env::temp_dir().join(unique("fsync"));
    let out = std::process::Command::new(bin)
        .arg("-s")
        .arg("1")
        .arg("-f")
        .arg(&file)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("fdatasync"))?;
    let usecs = line.split_whitespace().rev().nth(1)?;
    Some(format!("{usecs} µs/op"))
}

async fn raw_vs_adapter(a: &Args) -> BenchResult<String> {
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
fn burn_size(a: &Args, profile: &str) -> usize {
    match (a.quick, profile) {
        (false, _) => 200_000,
        (true, "postgres") => 1_000,
        (true, _) => 100,
    }
}

/// One burn-down: `n` deliveries prefilled, then drained through the port
/// (16 workers on postgres, 2 on embedded, claims of 100); deliveries/s.
async fn burn_down(a: &Args, profile: &str, dir: &std::path::Path, n: usize) -> BenchResult<f64> {
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
    let r = drain_port(store, workers, 100, n).await;
    if let Some(s) = schema {
        drop_schema(&a.url, &s).await?;
    }
    r
}

/// The table, and the postgres burn-down figure for the peers' table.
async fn burn_down_and_steady(
    a: &Args,
    dir: &std::path::Path,
) -> BenchResult<(String, Option<f64>)> {
    let mut out = String::from(
        "| adapter | burn-down: drain of a prefilled backlog (deliveries/s, median of the runs) | minimal queue, same size, 16 connections, batches of 100 (jobs/s, median; burn-down / minimal) | steady state: completed while publishing (deliveries/s, one run) | backlog start → end |\n| --- | --- | --- | --- | --- |\n",
    );
    let mut pg_burn = None;
    for &profile in &a.profiles {
        let prefilled = burn_size(a, profile);
        let burn = repeat(a.runs, || burn_down(a, profile, dir, prefilled)).await?;
        let (steady, backlog) = steady_state(a, profile, dir).await?;
        let minimal = if profile == "postgres" {
            pg_burn = Some(burn);
            let m = repeat(a.runs, || minimal_queue(a, prefilled, 16, 100)).await?;
            format!("{m:.0} ({:.2})", burn / m)
        } else {
            "–".into()
        };
        let _ = writeln!(
            out,
            "| {profile} | {burn:.0} | {minimal} | {steady:.0} | {backlog} |"
        );
        eprintln!("bench: burn-down {profile}: {burn:.0}/s, steady {steady:.0}/s");
    }
    Ok((out, pg_burn))
}

/// The same burn-down with the queues users would pick instead of ours
/// (`crates/peers`: graphile_worker in its documented fast mode, apalis with
/// batches of 100), 16 workers, on the same database; `ours` is the postgres
/// burn-down of this run (measured here when that section did not run).
async fn peers(
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
    let mut out = format!(
        "| queue | jobs drained | jobs/s (median of the runs) | ours / this |\n| --- | --- | --- | --- |\n\
         | control-plane postgres adapter (attempt log written) | {n} | {ours:.0} | 1.00 |\n"
    );
    // apalis drains a backlog of 200,000 at about 1,000/s (its fetch slows
    // with the backlog; crates/peers/README.md): one run, not three.
    for (peer, runs) in [("graphile_worker", a.runs), ("apalis", 1)] {
        let rate = repeat(runs, || async {
            let run = tokio::process::Command::new(bin)
                .args(["--peer", peer, "--database-url", &a.url])
                .args(["--jobs", &n.to_string(), "--concurrency", "16"])
                .stderr(std::process::Stdio::inherit())
                .output()
                .await
                .map_err(|e| format!("cannot run {bin}: {e}"))?;
            if !run.status.success() {
                return Err(format!("the {peer} burn-down failed ({})", run.status));
            }
            let report: serde_json::Value = serde_json::from_slice(&run.stdout).map_err(fail)?;
            report["jobs_per_s"]
                .as_f64()
                .ok_or_else(|| format!("{peer}: no jobs_per_s in {report}"))
        })
        .await?;
        let runs = if runs == 1 { " (one run)" } else { "" };
        let _ = writeln!(
            out,
            "| {peer}{runs} | {n} | {rate:.0} | {:.2} |",
            ours / rate
        );
        eprintln!("bench: peer {peer}: {rate:.0}/s (ours {ours:.0}/s)");
    }
    Ok(out)
}

/// The limit of this database on this machine, for comparison with the
/// burn-down: a minimal queue (one table; a claim of `batch` rows with
/// `FOR UPDATE SKIP LOCKED` that sets a lease, then a delete on completion;
/// no attempt log, no accounts, no endpoints) drained by `conns` connections.
async fn minimal_queue(a: &Args, total: usize, conns: usize, batch: i64) -> BenchResult<f64> {
    let schema = unique("bench_minimal");
    let setup = raw_client(&a.url, "public").await?;
    setup
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}; \
             CREATE TABLE jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL, \
             locked_until timestamptz NOT NULL DEFAULT '-infinity'); \
             INSERT INTO jobs (payload) SELECT '{{}}' FROM generate_series(1, {total}); ANALYZE jobs"
        ))
        .await
        .map_err(fail)?;
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
            let complete = c
                .prepare("DELETE FROM jobs WHERE id = ANY($1)")
                .await
                .map_err(fail)?;
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
    drop_schema(&a.url, &schema).await?;
    let n = done.load(Ordering::Relaxed) as usize;
    if n != total {
        return Err(format!("the minimal queue drained {n} of {total}"));
    }
    Ok(rate)
}

async fn open_profile(
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
async fn steady_state(
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
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let claimed = store
                    .delivery_claim(ClaimRequest::new(
                        format!("w{w}"),
                        100,
                        Duration::from_secs(60),
                    ))
                    .await
                    .map_err(fail)?;
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let batch: Vec<_> = claimed
                    .iter()
                    .map(|c| (c.lease.clone(), delivered()))
                    .collect();
                let n = batch.len() as u64;
                for r in store.delivery_record_outcomes(batch).await.map_err(fail)? {
                    r.map_err(fail)?;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        });
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

// --------------------------------------------------------------- end to end

/// A receiver (the test-support one) at `/hook` that answers `200` after
/// `delay`.
async fn receiver(delay: Duration) -> BenchResult<(String, Arc<Receiver>)> {
    receiver_answering(delay, 200).await
}

/// A receiver at `/hook` that records each request, waits `delay`, then
/// answers `status`.
async fn receiver_answering(delay: Duration, status: u16) -> BenchResult<(String, Arc<Receiver>)> {
    let (r, base) = Receiver::start(answer_after(delay, status)).await;
    Ok((format!("{base}/hook"), r))
}

fn dispatcher_for(store: DynControlPlaneStore, poll: Duration) -> BenchResult<Dispatcher> {
    let loopback = Cidr::parse("127.0.0.0/8").ok_or("cidr")?;
    Dispatcher::new(
        store,
        DispatcherConfig {
            worker: "bench".into(),
            concurrency: 256,
            max_batch: 100,
            poll_interval: poll,
            allowed_targets: vec![loopback],
            ..DispatcherConfig::default()
        },
    )
}

async fn end_to_end(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let mut out = String::from(
        "| adapter | deliveries through the dispatcher to a local receiver (deliveries/s, median of the runs) |\n| --- | --- |\n",
    );
    for &profile in &a.profiles {
        let total = match (a.quick, profile) {
            (false, _) => 20_000,
            (true, "postgres") => 300,
            (true, _) => 100,
        };
        let rate = repeat(a.runs, || async {
            let (store, schema) = open_profile(a, profile, dir).await?;
            let (url, seen) = receiver(Duration::ZERO).await?;
            let e = endpoint(store.as_ref(), &url).await?;
            match &schema {
                Some(s) => pg_prefill(&a.url, s, &e, total).await?,
                None => prefill(store.as_ref(), total).await?,
            }
            let d = dispatcher_for(store.clone(), Duration::from_millis(50))?;
            let stop = CancellationToken::new();
            let stopped = stop.clone();
            let start = Instant::now();
            let run = tokio::spawn(async move { d.run(stopped).await });
            loop {
                let counts = store.delivery_count_by_state().await.map_err(fail)?;
                let delivered = counts
                    .iter()
                    .find(|(s, _)| *s == DeliveryState::Delivered)
                    .map_or(0, |(_, n)| *n);
                if delivered as usize >= total {
                    break;
                }
                if start.elapsed() > Duration::from_secs(600) {
                    return Err(format!(
                        "end to end on {profile}: {delivered} of {total} after 10 min"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let rate = total as f64 / start.elapsed().as_secs_f64();
            stop.cancel();
            let _ = run.await;
            let received = seen.count();
            if received < total {
                return Err(format!("the receiver got {received} of {total}"));
            }
            if let Some(s) = schema {
                drop_schema(&a.url, &s).await?;
            }
            Ok(rate)
        })
        .await?;
        let _ = writeln!(out, "| {profile} | {rate:.0} |");
        eprintln!("bench: end to end {profile}: {rate:.0}/s");
    }
    Ok(out)
}

/// One isolation scenario: `neighbours` endpoints, each with a backlog,
/// whose receivers answer `status` after `delay`, in the healthy endpoint's
/// account or another one, beside a dispatcher of `slots` send slots.
struct Neighbours {
    name: &'static str,
    slots: usize,
    neighbours: usize,
    delay: Duration,
    status: u16,
    other_account: bool,
}

/// The isolation scenarios of issue 34, at the default 64 slots and at 16.
fn neighbour_scenarios() -> Vec<Neighbours> {
    let slow = Duration::from_secs(2);
    // Never answers within the request timeout (15 s).
    let silent = Duration::from_secs(3600);
    let mut out = Vec::new();
    for slots in [64, 16] {
        let at = |name, neighbours, delay, status, other_account| Neighbours {
            name,
            slots,
            neighbours,
            delay,
            status,
            other_account,
        };
        out.push(at("none (alone)", 0, Duration::ZERO, 200, false));
        out.push(at("1 slow (2 s answers), backlog", 1, slow, 200, false));
        if slots == 64 {
            out.push(at(
                "1 failing (500), backlog",
                1,
                Duration::ZERO,
                500,
                false,
            ));
        }
        out.push(at("4 slow, same account", 4, slow, 200, false));
        out.push(at("16 slow, same account", 16, slow, 200, false));
        out.push(at(
            "20 never answering, other account",
            20,
            silent,
            200,
            true,
        ));
    }
    out
}

/// A healthy endpoint's publish-to-arrival latency, alone and beside slow,
/// failing or silent neighbours with backlogs (issue 34, ADR 0019), through
/// one dispatcher with the default per-endpoint cap (16) and 64 or 16 send
/// slots; and how many requests the neighbours received meanwhile.
async fn fairness(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let mut out = String::from(
        "| adapter | slots | neighbours | healthy publish-to-arrival p50 (ms) | p99 (ms) | neighbours' requests/s |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    let backlog: usize = if a.quick { 100 } else { 500 };
    let samples = if a.quick { 20 } else { 100 };
    let scenarios = neighbour_scenarios();
    let scenarios: Vec<&Neighbours> = if a.quick {
        scenarios
            .iter()
            .filter(|s| s.slots == 64 && s.neighbours <= 4)
            .collect()
    } else {
        scenarios.iter().collect()
    };
    for &profile in &a.profiles {
        for sc in &scenarios {
            let (store, schema) = open_profile(a, profile, dir).await?;
            let (healthy_url, seen) = receiver(Duration::ZERO).await?;
            flow_endpoint(store.as_ref(), &healthy_url, &["healthy"], None).await?;
            let mut noisy = Vec::new();
            let other = AccountId::new("other").map_err(fail)?;
            let account = if sc.other_account { other } else { acct() };
            for n in 0..sc.neighbours {
                let (url, r) = receiver_answering(sc.delay, sc.status).await?;
                noisy.push(r);
                let ty = format!("noisy{n}");
                let mut req = EndpointCreateRequest::new(
                    account.clone(),
                    &url,
                    Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                );
                req.event_types = vec![ty.clone()];
                store.endpoint_create(req).await.map_err(fail)?;
                let reqs = (0..backlog)
                    .map(|i| {
                        PublishRequest::new(
                            account.clone(),
                            ty.clone(),
                            serde_json::json!({ "i": i }),
                        )
                    })
                    .collect();
                store.event_publish_batch(reqs).await.map_err(fail)?;
            }
            let loopback = Cidr::parse("127.0.0.0/8").ok_or("cidr")?;
            let d = Dispatcher::new(
                store.clone(),
                DispatcherConfig {
                    worker: "fair".into(),
                    concurrency: sc.slots,
                    max_batch: 100,
                    poll_interval: Duration::from_millis(1000),
                    allowed_targets: vec![loopback],
                    ..DispatcherConfig::default()
                },
            )?;
            let stop = CancellationToken::new();
            let stopped = stop.clone();
            let run = tokio::spawn(async move { d.run(stopped).await });
            // Let the neighbours fill the slots and the worker learn them:
            // longer than the slow-answer threshold (1 s) plus one answer.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let noisy_before: usize = noisy.iter().map(|r| r.count()).sum();
            let window = Instant::now();
            let mut sent = Vec::new();
            for i in 0..samples {
                let p = store
                    .event_publish(PublishRequest::new(
                        acct(),
                        "healthy",
                        serde_json::json!({ "i": i }),
                    ))
                    .await
                    .map_err(fail)?;
                for id in p.deliveries {
                    sent.push((id.to_string(), Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let noisy_after: usize = noisy.iter().map(|r| r.count()).sum();
            let noisy_rate =
                noisy_after.saturating_sub(noisy_before) as f64 / window.elapsed().as_secs_f64();
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let arrived = seen.arrivals();
                lat = sent
                    .iter()
                    .filter_map(|(id, at)| {
                        arrived
                            .iter()
                            .find(|(seen_id, _)| seen_id == id)
                            .map(|(_, t)| t.saturating_duration_since(*at).as_secs_f64() * 1000.0)
                    })
                    .collect();
                if lat.len() == sent.len() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop.cancel();
            let _ = run.await;
            if let Some(s) = schema {
                drop_schema(&a.url, &s).await?;
            }
            let (name, slots) = (sc.name, sc.slots);
            if lat.len() < sent.len() {
                return Err(format!(
                    "fairness on {profile} at {slots} slots beside {name}: {} of {} healthy deliveries arrived in 2 min",
                    lat.len(),
                    sent.len()
                ));
            }
            let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
            let _ = writeln!(
                out,
                "| {profile} | {slots} | {name} | {p50:.1} | {p99:.1} | {noisy_rate:.1} |"
            );
            eprintln!(
                "bench: fairness {profile} {slots} slots beside {name}: p50 {p50:.1} ms, p99 {p99:.1} ms, neighbours {noisy_rate:.1}/s"
            );
        }
    }
    Ok(out)
}

/// Enqueue-to-first-attempt latency across two replicas (publish on one
/// store, dispatch from another): with LISTEN/NOTIFY, and polling only.
async fn wakeup_latency(a: &Args) -> BenchResult<String> {
    let n = if a.quick { 10 } else { 200 };
    let mut out = String::from("| wake-up | p50 (ms) | p99 (ms) |\n| --- | --- | --- |\n");
    for (label, listen) in [("LISTEN/NOTIFY", true), ("polling every 1 s", false)] {
        let schema = unique("bench_lat");
        let publisher = pg_store(&a.url, &schema, 4, true).await?;
        let worker: DynControlPlaneStore = Arc::new(pg_store(&a.url, &schema, 8, listen).await?);
        let (url, seen) = receiver(Duration::ZERO).await?;
        endpoint(&publisher, &url).await?;
        let d = dispatcher_for(worker.clone(), Duration::from_secs(1))?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let run = tokio::spawn(async move { d.run(stopped).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            let p = publisher
                .event_publish(PublishRequest::new(
                    acct(),
                    "bench.latency",
                    serde_json::json!({}),
                ))
                .await
                .map_err(fail)?;
            let id = p.deliveries.first().ok_or("no delivery")?.to_string();
            let arrived = loop {
                if let Some(at) = seen.arrival_of(&id) {
                    break at;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err("a delivery did not arrive within 10 s".into());
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            };
            lat.push((arrived - t0).as_secs_f64() * 1000.0);
            // Spread publishes so that each one meets an idle worker; against
            // polling, at a random phase of the 1 s period (a fixed spacing
            // would sample a few phases only).
            let phase = if listen {
                0
            } else {
                u64::try_from(uuid::Uuid::new_v4().as_u128() % 1000).unwrap_or(0)
            };
            tokio::time::sleep(Duration::from_millis(20 + phase)).await;
        }
        stop.cancel();
        let _ = run.await;
        let p50 = percentile(&mut lat, 0.5);
        let p99 = percentile(&mut lat, 0.99);
        let _ = writeln!(out, "| {label} | {p50:.1} | {p99:.1} |");
        eprintln!("bench: latency {label}: p50 {p50:.1} ms, p99 {p99:.1} ms");
        drop(publisher);
        drop(worker);
        drop_schema(&a.url, &schema).await?;
    }
    Ok(out)
}

// ------------------------------------------------------------------- growth

/// Claim latency and attempt-log listing latency with small and large
/// delivered history (postgres; history inserted with `generate_series`).
async fn growth(a: &Args) -> BenchResult<String> {
    let sizes: [i64; 2] = if a.quick {
        [1_000, 10_000]
    } else {
        [10_000, a.growth_rows]
    };
    let mut out = String::from(
        "| history rows | claim of 1 due delivery, median (ms) | attempt-log page of 50, median (ms) |\n| --- | --- | --- |\n",
    );
    let mut claims = Vec::new();
    let mut lists = Vec::new();
    for size in sizes {
        let schema = unique("bench_growth");
        let store = pg_store(&a.url, &schema, 4, false).await?;
        let e = endpoint(&store, "https://example.com/hook").await?;
        let c = raw_client(&a.url, &schema).await?;
        let now = now_ms();
        c.execute(
            "WITH ev AS (INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
             SELECT gen_random_uuid(), 'bench', 'old', '{}', NULL, $2 FROM generate_series(1, $3::bigint) \
             RETURNING id), \
             d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
             SELECT gen_random_uuid(), 'bench', $1, ev.id, -row_number() OVER (), $2 FROM ev RETURNING id) \
             INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, finished_at) \
             SELECT id, 'delivered', 1, 8, $2, $2 FROM d",
            &[&e.id.0, &now, &size],
        )
        .await
        .map_err(fail)?;
        c.execute(
            "INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, latency_ms, \
             will_retry, next_attempt_at, recorded_at) SELECT gen_random_uuid(), $1, 'bench', 1, 'delivered', 200, \
             NULL, 1, false, NULL, $2 FROM generate_series(1, $3::bigint) g",
            &[&e.id.0, &now, &size],
        )
        .await
        .map_err(fail)?;
        c.batch_execute("ANALYZE").await.map_err(fail)?;
        let rounds = if a.quick { 20 } else { 200 };
        let mut claim_ms = Vec::new();
        let mut list_ms = Vec::new();
        for _ in 0..rounds {
            prefill(&store, 1).await?;
            let t = Instant::now();
            let got = store
                .delivery_claim(ClaimRequest::new("g", 1, Duration::from_secs(60)))
                .await
                .map_err(fail)?;
            claim_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            for g in got {
                store
                    .delivery_record_outcome(&g.lease, delivered())
                    .await
                    .map_err(fail)?;
            }
            let t = Instant::now();
            store
                .attempt_list_for_endpoint(&acct(), e.id, PageRequest::first(50))
                .await
                .map_err(fail)?;
            list_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (cm, lm) = (median(claim_ms), median(list_ms));
        claims.push(cm);
        lists.push(lm);
        let _ = writeln!(out, "| {size} | {cm:.2} | {lm:.2} |");
        eprintln!("bench: growth {size}: claim {cm:.2} ms, list {lm:.2} ms");
        drop(store);
        drop_schema(&a.url, &schema).await?;
    }
    let _ = writeln!(
        out,
        "| ratio large / small | {:.2} | {:.2} |",
        claims[1] / claims[0],
        lists[1] / lists[0]
    );
    Ok(out)
}

// -------------------------------------------------------------- user path

/// `control-plane <command>` with none of this harness's own
/// `CONTROLPLANE_*` variables (the binary refuses unknown ones, such as the
/// test database URL) and, given a schema, on that postgres schema.
fn control_plane(
    a: &Args,
    command: &str,
    schema: Option<&str>,
) -> BenchResult<tokio::process::Command> {
    let bin = a.serve_bin.as_deref().ok_or("no --serve-bin given")?;
    let mut c = tokio::process::Command::new(bin);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        c.env_remove(k);
    }
    c.arg(command)
        .env("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(schema) = schema {
        c.env("CONTROLPLANE_STORE", "postgres")
            .env("CONTROLPLANE_DATABASE_URL", &a.url)
            .env("CONTROLPLANE_DATABASE_SCHEMA", schema)
            .env("CONTROLPLANE_SECRET_KEY_FILE", key_file(schema)?);
    }
    Ok(c)
}

/// The key file the processes on `schema` share, written on first use.
fn key_file(schema: &str) -> BenchResult<std::path::PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("{schema}.key"));
    if !path.exists() {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        writeln!(f, "{}", control_plane_core::SecretKey::generate().to_text())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(path)
}

/// `control-plane serve` on `profile`, its API's base address, and (on
/// postgres) its schema. Its log goes to `dir/<name>.log`.
async fn start_serve(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
    name: &str,
) -> BenchResult<(tokio::process::Child, String, Option<String>)> {
    use tokio::io::AsyncBufReadExt;
    let schema = (profile == "postgres").then(|| unique("bench_http"));
    let mut serve = control_plane(a, "serve", schema.as_deref())?;
    if schema.is_none() {
        serve.env(
            "CONTROLPLANE_EMBEDDED_PATH",
            dir.join(format!("{name}.duckdb")),
        );
    }
    let mut child = serve
        .env("CONTROLPLANE_LISTEN", "127.0.0.1:0")
        .env("CONTROLPLANE_ADMIN_TOKEN", BENCH_ADMIN)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(fail)?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut log = std::fs::File::create(dir.join(format!("{name}.log"))).map_err(fail)?;
    let base = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .map_err(|_| "`control-plane serve` did not get ready within 60 s")?
            .map_err(fail)?
            .ok_or("`control-plane serve` exited before it was ready")?;
        if let Some(addr) = line.split("API on ").nth(1) {
            break addr.trim().to_string();
        }
    };
    // Keep draining the log so that the service never blocks on stderr.
    tokio::spawn(async move {
        use std::io::Write;
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = writeln!(log, "{line}");
        }
    });
    Ok((child, base, schema))
}

const BENCH_ADMIN: &str = "bench-admin-token-0123456789abcdef";

/// The path a user drives: `clients` concurrent HTTP clients (keep-alive)
/// each publishing one event per call to one endpoint for a while, delivered
/// by the same process to a local receiver.
async fn user_path(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut out = String::from(
        "| adapter | clients | events accepted/s | deliveries completed/s | publish p50 (ms) | publish p99 (ms) | publish-to-arrival p50 (ms) | p99 (ms) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let seconds = if a.quick { 1 } else { 10 };
    for &profile in &a.profiles {
        // The quick run (CI's smoke test, under 2 minutes in all) skips 64.
        let clients_each: &[usize] = if a.quick { &[1, 16] } else { &[1, 16, 64] };
        for &clients in clients_each {
            let name = format!("http-{profile}-{clients}");
            let (mut child, base, schema) = start_serve(a, profile, dir, &name).await?;
            let (hook, seen) = receiver(Duration::ZERO).await?;
            let http = reqwest::Client::new();
            let (s, v) = api_call(
                &http,
                &base,
                BENCH_ADMIN,
                "POST",
                "/v1/accounts/bench/endpoints",
                Some(serde_json::json!({"url": hook, "max_in_flight": 64})),
            )
            .await;
            if s != 201 {
                return Err(format!("creating the endpoint answered {s}: {v}"));
            }
            let body = serde_json::json!({"type": "bench.http", "payload": {"n": 1}});
            let start = Instant::now();
            let until = start + Duration::from_secs(seconds);
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (http, base, body) = (http.clone(), base.clone(), body.clone());
                tasks.push(tokio::spawn(async move {
                    let mut sent: Vec<(String, Instant, f64)> = Vec::new();
                    while Instant::now() < until {
                        let t0 = Instant::now();
                        let (s, v) = api_call(
                            &http,
                            &base,
                            BENCH_ADMIN,
                            "POST",
                            "/v1/accounts/bench/events",
                            Some(body.clone()),
                        )
                        .await;
                        if s != 202 {
                            return Err(format!("publishing answered {s}: {v}"));
                        }
                        let id = v["deliveries"][0].as_str().unwrap_or_default().to_string();
                        sent.push((id, t0, t0.elapsed().as_secs_f64() * 1000.0));
                    }
                    Ok::<_, String>(sent)
                }));
            }
            let mut sent = Vec::new();
            for t in tasks {
                sent.extend(t.await.map_err(fail)??);
            }
            let publishing = start.elapsed().as_secs_f64();
            let total = sent.len();
            while seen.count() < total {
                if start.elapsed() > Duration::from_secs(seconds + 120) {
                    return Err(format!(
                        "user path {profile} x{clients}: {} of {total} arrived",
                        seen.count()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let arrivals: std::collections::HashMap<String, Instant> =
                seen.arrivals().into_iter().collect();
            let last = arrivals.values().max().copied().unwrap_or(start);
            let mut publish: Vec<f64> = sent.iter().map(|(_, _, ms)| *ms).collect();
            let mut to_arrival: Vec<f64> = sent
                .iter()
                .filter_map(|(id, t0, _)| {
                    arrivals
                        .get(id)
                        .map(|at| (*at - *t0).as_secs_f64() * 1000.0)
                })
                .collect();
            let accepted = total as f64 / publishing;
            let completed = total as f64 / (last - start).as_secs_f64();
            let _ = writeln!(
                out,
                "| {profile} | {clients} | {accepted:.0} | {completed:.0} | {:.1} | {:.1} | {:.1} | {:.1} |",
                percentile(&mut publish, 0.5),
                percentile(&mut publish, 0.99),
                percentile(&mut to_arrival, 0.5),
                percentile(&mut to_arrival, 0.99),
            );
            eprintln!("bench: user path {profile} x{clients}: {accepted:.0} events/s accepted, {completed:.0} deliveries/s");
            let _ = child.kill().await;
            if let Some(s) = schema {
                drop_schema(&a.url, &s).await?;
            }
        }
    }
    Ok(out)
}

// ----------------------------------------------------------------- replicas

/// One backlog on postgres (on one endpoint, then spread over four) drained
/// by `control-plane worker` processes: one process of 64 sends against four
/// of 16 each (the same total concurrency).
async fn replicas(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let total: usize = if a.quick { 1_000 } else { 20_000 };
    let mut out = String::from(
        "| endpoints | worker processes | sends in flight each | deliveries/s after the first 5 % arrived (median of the runs) |\n| --- | --- | --- | --- |\n",
    );
    let spreads: &[usize] = if a.quick { &[1] } else { &[1, 4] };
    for &endpoints in spreads {
        let mut rates = Vec::new();
        for (procs, each) in [(1usize, 64usize), (4, 16)] {
            let rate = repeat(a.runs, || async {
                let schema = unique("bench_replicas");
                let store = pg_store(&a.url, &schema, 2, false).await?;
                let (url, seen) = receiver(Duration::ZERO).await?;
                for _ in 0..endpoints {
                    let e = endpoint(&store, &url).await?;
                    pg_prefill(&a.url, &schema, &e, total / endpoints).await?;
                }
                let began = Instant::now();
                let mut children = Vec::new();
                for i in 0..procs {
                    children.push(
                        control_plane(a, "worker", Some(&schema))?
                            .env("CONTROLPLANE_CONCURRENCY", each.to_string())
                            .env("CONTROLPLANE_ENDPOINT_CONCURRENCY", "64")
                            .stderr(
                                std::fs::File::create(dir.join(format!("worker-{i}.log")))
                                    .map_err(fail)?,
                            )
                            .spawn()
                            .map_err(fail)?,
                    );
                }
                // The clock starts once the first 5 % have arrived: the rate
                // of running processes, not of their start-up (four debug
                // processes connecting at once on two cores take a while).
                let mut window = None;
                while seen.count() < total {
                    if began.elapsed() > Duration::from_secs(600) {
                        return Err(format!(
                            "replicas: {} of {total} after 10 min",
                            seen.count()
                        ));
                    }
                    if window.is_none() && seen.count() >= total / 20 {
                        window = Some((Instant::now(), seen.count()));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let (start, base) = window.unwrap_or((began, 0));
                let rate = (total - base) as f64 / start.elapsed().as_secs_f64();
                for mut c in children {
                    let _ = c.kill().await;
                }
                drop(store);
                drop_schema(&a.url, &schema).await?;
                Ok(rate)
            })
            .await?;
            let _ = writeln!(out, "| {endpoints} | {procs} | {each} | {rate:.0} |");
            eprintln!("bench: replicas {endpoints} endpoints, {procs} x {each}: {rate:.0}/s");
            rates.push(rate);
        }
        let _ = writeln!(
            out,
            "| {endpoints} | ratio 4 / 1 | | {:.2} |",
            rates[1] / rates[0]
        );
    }
    Ok(out)
}

// ------------------------------------------------------------------- memory

/// Bytes of each answer's body in the memory run: the dispatcher keeps
/// 4 KiB of each (`CONTROLPLANE_RESPONSE_BODY_BYTES`'s default).
const MEMORY_ANSWER_BYTES: usize = 4096;

/// Peak RSS of `control-plane serve` (postgres profile, so that 10,000
/// deliveries are claimed within seconds) with `n` deliveries in flight to a
/// receiver that holds every request for a while, then answers each with a
/// 4 KiB body: once with all of them open, and again after the answers (their
/// bodies kept and recorded).
async fn memory(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    if a.serve_bin.is_none() {
        return Ok("not measured: no --serve-bin given\n".into());
    }
    let n: usize = if a.quick { 200 } else { 10_000 };
    // Within the request timeout (half the 60 s lease, at most 15 s), so
    // that every request is answered.
    let hold = Duration::from_secs(if a.quick { 2 } else { 12 });
    let answer: workspace_tests::Answer = Arc::new(move |_, _| {
        Box::pin(async move {
            tokio::time::sleep(hold).await;
            axum::response::IntoResponse::into_response("b".repeat(MEMORY_ANSWER_BYTES))
        })
    });
    let (seen, base) = Receiver::start(answer).await;
    let url = format!("{base}/hook");
    let schema = unique("bench_mem");
    {
        let store = pg_store(&a.url, &schema, 2, false).await?;
        let e = endpoint(&store, &url).await?;
        pg_prefill(&a.url, &schema, &e, n).await?;
    }
    let mut child = control_plane(a, "serve", Some(&schema))?
        .env("CONTROLPLANE_LISTEN", "127.0.0.1:0")
        .env("CONTROLPLANE_ADMIN_TOKEN", BENCH_ADMIN)
        .env("CONTROLPLANE_CONCURRENCY", n.to_string())
        .env("CONTROLPLANE_LEASE", "60s")
        .stderr(std::fs::File::create(dir.join("serve.log")).map_err(fail)?)
        .spawn()
        .map_err(fail)?;
    let pid = child.id().ok_or("no pid")?;
    let start = Instant::now();
    let mut in_flight_max = 0;
    while start.elapsed() < Duration::from_secs(120) {
        let got = seen.count();
        in_flight_max = in_flight_max.max(got);
        if got >= n {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            drop_schema(&a.url, &schema).await?;
            return Ok(format!(
                "not measured: `control-plane serve` exited early ({status}): {}\n",
                log.lines().last().unwrap_or("")
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let peak_of = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            })
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    let peak = peak_of();
    // The answers come `hold` after their requests; then every body is
    // drained, kept and recorded.
    tokio::time::sleep(hold + Duration::from_secs(10)).await;
    let after = peak_of();
    let _ = child.kill().await;
    let row = raw_client(&a.url, &schema)
        .await?
        .query_one(
            "SELECT count(*) FILTER (WHERE length(response_body) = $1), count(*), \
             coalesce(max(length(response_body)), 0) FROM attempts",
            &[&i32::try_from(MEMORY_ANSWER_BYTES).map_err(fail)?],
        )
        .await
        .map_err(fail)?;
    let kept: i64 = row.get(0);
    eprintln!(
        "bench: memory: {} attempts recorded, longest body kept {} bytes",
        row.get::<_, i64>(1),
        row.get::<_, i32>(2)
    );
    drop_schema(&a.url, &schema).await?;
    eprintln!(
        "bench: memory: {in_flight_max} requests open at once, peak RSS {peak:.1} MiB, \
         {after:.1} MiB after their {MEMORY_ANSWER_BYTES}-byte answers ({kept} kept)"
    );
    Ok(format!(
        "| deliveries in flight (requests open at the receiver at once) | peak RSS of `control-plane serve` with them open (MiB) | peak RSS after their answers of {MEMORY_ANSWER_BYTES} bytes (MiB) | attempts recorded with the whole body |\n| --- | --- | --- | --- |\n| {in_flight_max} | {peak:.1} | {after:.1} | {kept} |\n"
    ))
}

// ---------------------------------------------------------------------- run

async fn run(a: &Args) -> BenchResult<String> {
    let dir = std::env::temp_dir().join(unique("cp-bench"));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n\n## Machine\n\n{}",
        if a.quick {
            "Quick run (`--quick`): sizes shrunk, one run each; no figure here means anything."
        } else {
            "Medians of the runs (3 by default) where a table says so; the others are one run each."
        },
        machine(a).await
    );
    let want = |name: &str| {
        a.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    if want("raw") {
        let _ = writeln!(
            out,
            "## Claim and complete: raw SQL beside the postgres adapter\n\n{}",
            raw_vs_adapter(a).await?
        );
    }
    let mut pg_burn = None;
    if want("burn") {
        let (table, burn) = burn_down_and_steady(a, &dir).await?;
        pg_burn = burn;
        let _ = writeln!(out, "## Burn-down and steady state\n\n{table}");
    }
    if let Some(bin) = &a.peers_bin {
        let _ = writeln!(
            out,
            "## Peers: the same burn-down with the queues users would pick instead\n\n{}",
            peers(a, bin, &dir, pg_burn).await?
        );
    }
    if want("e2e") {
        let _ = writeln!(out, "## End to end\n\n{}", end_to_end(a, &dir).await?);
    }
    if want("http") {
        let _ = writeln!(
            out,
            "## The user's path: HTTP publishes, one event per call, delivered by the same process (one run each)\n\n{}",
            user_path(a, &dir).await?
        );
    }
    if want("checks") {
        let _ = writeln!(
            out,
            "## Publish-time checks (port, 16 publishers, one event per call, 10 deliveries each; runs alternated)\n\n{}",
            checks::publish_checks(a, &dir).await?
        );
    }
    if want("replicas") {
        let _ = writeln!(
            out,
            "## Replicas (postgres, one backlog, equal total concurrency)\n\n{}",
            replicas(a, &dir).await?
        );
    }
    if want("fairness") {
        let _ = writeln!(
            out,
            "## Fairness (a healthy endpoint beside slow, failing or silent neighbours with backlogs, one dispatcher of 64 or 16 slots, default endpoint cap 16; one run, percentiles over its samples)\n\n{}",
            fairness(a, &dir).await?
        );
    }
    if want("latency") {
        let _ = writeln!(
            out,
            "## Enqueue to first attempt (postgres, across two replicas; one run, percentiles over its samples)\n\n{}",
            wakeup_latency(a).await?
        );
    }
    if want("growth") {
        let _ = writeln!(out, "## Growth (postgres; one run)\n\n{}", growth(a).await?);
    }
    if want("memory") {
        let _ = writeln!(out, "## Memory (one run)\n\n{}", memory(a, &dir).await?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}
