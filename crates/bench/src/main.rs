//! The benchmark harness behind `cargo xtask bench`: the postgres adapter
//! beside the same SQL issued raw, burn-down and steady state on both
//! adapters, end-to-end delivery through the dispatcher to a local receiver,
//! wake-up latency with and without LISTEN/NOTIFY, growth, and the memory of
//! `control-plane serve`. It prints markdown tables; `--quick` shrinks every
//! size for a smoke run that asserts nothing about speed; `--serve-env
//! CONTROLPLANE_KEY=VALUE` (repeatable) sets a variable of every
//! `control-plane` process it starts (to compare settings on one build).

use std::fmt::Write as _;

/// The allocator of the `control-plane` binary (ADR 0029), with its
/// `override` feature serving the bundled DuckDB too: the embedded store is
/// measured in this process as the service runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::growth::growth;
use control_plane_core::{
    AccountId, AttemptReport, Check, ClaimRequest, ClaimedDelivery, Clock, ControlPlaneStore,
    DeliveryOutcome, DynControlPlaneStore, Endpoint, EndpointCreateRequest, PublishRequest, Secret,
    SystemClock,
};
use control_plane_store_kit::DatabaseUrl;
use store_embedded::{EmbeddedConfig, EmbeddedStore};
use store_postgres::{PostgresConfig, PostgresStore};

mod brokers;
mod checks;
mod delivery;
mod erase;
mod growth;
mod held;
mod history;
mod limits;
mod queue;
mod serve;
mod shapes;

use crate::delivery::{end_to_end, fairness, wakeup_latency};
use crate::queue::{burn_down_and_steady, peers, raw_vs_adapter};
use crate::serve::{memory, replicas, user_path};

type BenchResult<T> = Result<T, String>;

fn fail<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

#[derive(Clone)]
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
    /// The larger history of the history section, postgres (issue 54's
    /// target: twenty million; the embedded store gets a quarter of it).
    history_rows: i64,
    /// The held deliveries of the held-work section (100,000 by default;
    /// past the embedded live index's limit, 250,000, its claims scan).
    held_rows: usize,
    /// Extra variables for the `control-plane` processes a section starts.
    serve_env: Vec<(String, String)>,
}

/// `v` as a number of at least `least`, or `refusal`.
fn number<T: std::str::FromStr + PartialOrd>(
    v: Option<String>,
    least: T,
    refusal: &str,
) -> BenchResult<T> {
    v.and_then(|v| v.parse().ok())
        .filter(|n| *n >= least)
        .ok_or_else(|| refusal.to_string())
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
        history_rows: 20_000_000,
        held_rows: 100_000,
        serve_env: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--database-url" => a.url = it.next().ok_or("--database-url needs a value")?,
            "--serve-bin" => a.serve_bin = it.next(),
            "--peers-bin" => a.peers_bin = it.next(),
            "--only" => a.only = it.next(),
            "--serve-env" => {
                let pair = it.next().ok_or("--serve-env needs KEY=VALUE")?;
                let (k, v) = pair
                    .split_once('=')
                    .filter(|(k, _)| k.starts_with("CONTROLPLANE_"))
                    .ok_or("--serve-env takes CONTROLPLANE_KEY=VALUE")?;
                a.serve_env.push((k.to_string(), v.to_string()));
            }
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
            "--runs" => a.runs = number(it.next(), 1, "--runs needs a number")?,
            "--growth-rows" => {
                a.growth_rows = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 10_000)
                    .ok_or("--growth-rows needs a number above 10000")?
            }
            "--history-rows" => {
                a.history_rows = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n >= 400_000)
                    .ok_or("--history-rows needs a number of at least 400000")?
            }
            "--held-rows" => {
                a.held_rows = number(
                    it.next(),
                    1_000,
                    "--held-rows needs a number of at least 1000",
                )?
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
    store
        .endpoint_create(req.checked().map_err(fail)?)
        .await
        .map_err(fail)
}

/// Publishes `n` events (one delivery each) in batches of 500.
async fn prefill(store: &dyn ControlPlaneStore, n: usize) -> BenchResult<()> {
    let mut left = n;
    while left > 0 {
        let b = left.min(500);
        let reqs = (0..b)
            .map(|i| PublishRequest::new(acct(), "bench.event", serde_json::json!({"i": i})))
            .collect();
        store
            .event_publish_batch(control_plane_core::Checked::all(reqs).map_err(fail)?)
            .await
            .map_err(fail)?;
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

/// Records every delivery of `claimed` delivered, in one batch; how many.
async fn record_delivered(
    store: &dyn ControlPlaneStore,
    claimed: &[ClaimedDelivery],
) -> BenchResult<u64> {
    let batch: Vec<_> = claimed
        .iter()
        .map(|c| (c.lease.clone(), delivered()))
        .collect();
    let n = batch.len() as u64;
    for r in store.delivery_record_outcomes(batch).await.map_err(fail)? {
        r.map_err(fail)?;
    }
    Ok(n)
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
                    .delivery_claim(
                        ClaimRequest::new(format!("w{w}"), batch, Duration::from_secs(60))
                            .map_err(fail)?,
                    )
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
                let n = record_delivered(store.as_ref(), &claimed).await?;
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
        tasks.spawn(async move { raw_worker(&mut client, w, batch, &done).await });
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

/// One connection of [`drain_raw`]: claims and completes with the adapter's
/// own statements, issued raw, until the queue stays empty; counts what it
/// completed in `done`.
async fn raw_worker(
    client: &mut tokio_postgres::Client,
    w: usize,
    batch: i64,
    done: &AtomicU64,
) -> BenchResult<()> {
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
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        idle = 0;
        let n = complete_raw(client, &complete, &rows).await?;
        done.fetch_add(n, Ordering::Relaxed);
    }
}

/// Records the claimed `rows` delivered in 1 ms with the adapter's own
/// statement; how many it recorded.
async fn complete_raw(
    client: &tokio_postgres::Client,
    complete: &tokio_postgres::Statement,
    rows: &[tokio_postgres::Row],
) -> BenchResult<u64> {
    let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
    // Column 19 of the claim is the lease token.
    let tokens: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(19)).collect();
    let errors: Vec<Option<String>> = vec![None; ids.len()];
    let codes: Vec<Option<i64>> = vec![Some(200); ids.len()];
    let latencies: Vec<i64> = vec![1; ids.len()];
    let bodies: Vec<Option<String>> = vec![None; ids.len()];
    let buckets: Vec<i16> = vec![control_plane_core::latency_bucket(1); ids.len()];
    let at = now_ms();
    let minute = control_plane_core::rollup_minute(control_plane_core::Timestamp::from_millis(at));
    client
        .execute(
            complete,
            &[
                &ids,
                &tokens,
                &errors,
                &codes,
                &latencies,
                &at,
                &bodies,
                &buckets,
                &minute,
                &store_postgres::LEASED,
            ],
        )
        .await
        .map_err(fail)
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

// ---------------------------------------------------------------------- run

/// What the report says first: how to read it, and the machine.
async fn preamble(a: &Args) -> String {
    format!(
        "{}\n\n## Machine\n\n{}\n",
        if a.quick {
            "Quick run (`--quick`): sizes shrunk, one run each; no figure here means anything."
        } else {
            "Medians of the runs (3 by default) where a table says so; the others are one run each."
        },
        machine(a).await
    )
}

async fn run(a: &Args) -> BenchResult<String> {
    let dir = std::env::temp_dir().join(unique("cp-bench"));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let mut out = preamble(a).await;
    let want = |name: &str| {
        a.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    out.push_str(&queues(a, &dir, &want).await?);
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
    if want("brokers") {
        let _ = writeln!(
            out,
            "## Destinations: HTTP beside RabbitMQ, NATS JetStream and Redis streams (issue 59; one run each, 10,000 deliveries)\n\n{}",
            brokers::brokers(a, &dir).await?
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
    out.push_str(&sizes(a, &dir, &want).await?);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// The queue sections: raw SQL beside the adapter, burn-down and steady
/// state, the peers, and issue 73's drain shapes.
async fn queues(
    a: &Args,
    dir: &std::path::Path,
    want: &dyn Fn(&str) -> bool,
) -> BenchResult<String> {
    let mut out = String::new();
    if want("raw") {
        let _ = writeln!(
            out,
            "## Claim and complete: raw SQL beside the postgres adapter\n\n{}",
            raw_vs_adapter(a).await?
        );
    }
    let mut pg_burn = None;
    if want("burn") {
        let (table, burn) = burn_down_and_steady(a, dir).await?;
        pg_burn = burn;
        let _ = writeln!(out, "## Burn-down and steady state\n\n{table}");
    }
    if let Some(bin) = &a.peers_bin {
        let _ = writeln!(
            out,
            "## Peers: the same burn-down with the queues users would pick instead\n\n{}",
            peers(a, bin, dir, pg_burn).await?
        );
    }
    if want("shapes") && a.profiles.contains(&"postgres") {
        let _ = writeln!(
            out,
            "## Drain shapes (postgres): issue 73's figures, each with the database's cost per delivery\n\n{}",
            shapes::shapes(a, dir).await?
        );
    }
    Ok(out)
}

/// The sections about size: growth, history and memory.
async fn sizes(
    a: &Args,
    dir: &std::path::Path,
    want: &dyn Fn(&str) -> bool,
) -> BenchResult<String> {
    let mut out = String::new();
    if want("growth") {
        let _ = writeln!(out, "## Growth (postgres; one run)\n\n{}", growth(a).await?);
    }
    if want("held") {
        let _ = writeln!(
            out,
            "## Held work (a disabled endpoint's backlog beside a healthy one; issue 54)\n\n{}",
            held::held_work(a, dir).await?
        );
    }
    if want("history") {
        let _ = writeln!(
            out,
            "## Reads and the size of the history (issue 54; one run each)\n{}",
            history::history(a, dir).await?
        );
    }
    if want("limits") {
        let _ = writeln!(
            out,
            "## Limits: half-open connections and costly schemas (issue 54; one run)\n\n{}",
            limits::limits(a, dir).await?
        );
    }
    if want("erase") {
        let _ = writeln!(
            out,
            "## Erasure of an account at volume (issue 57; one run)\n\n{}",
            erase::erase(a, dir).await?
        );
    }
    if want("memory") {
        let _ = writeln!(out, "## Memory (one run)\n\n{}", memory(a, dir).await?);
    }
    Ok(out)
}
