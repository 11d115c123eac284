//! Burn-down benchmark of a peer job queue on PostgreSQL (see README.md).
//!
//! `peers --peer <graphile_worker|pgq|apalis> --database-url <URL> --jobs <N> --concurrency <C> [--pause-before-drain]`
//! prefills N no-op jobs (not timed), then times the peer's worker from its
//! start until all N are handled and the peer's tables show none left, and
//! prints one line of JSON on stdout.

mod apalis_pg;
mod graphile;
mod pgq;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::AssertSqlSafe;

/// Jobs handled by this process; the handlers of every peer only bump it.
static HANDLED: AtomicUsize = AtomicUsize::new(0);

/// Set by `--pause-before-drain` (see [`prefilled`]).
static PAUSE: AtomicBool = AtomicBool::new(false);

/// Jobs per call of the peer's batch add API while prefilling.
const PREFILL_CHUNK: usize = 10_000;

/// The payload of every job: serialises as `{}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Noop {}

#[derive(Clone, Copy)]
enum Peer {
    GraphileWorker,
    Pgq,
    Apalis,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::GraphileWorker => "graphile_worker",
            Peer::Pgq => "pgq",
            Peer::Apalis => "apalis",
        }
    }
}

struct Args {
    peer: Peer,
    url: String,
    jobs: usize,
    concurrency: usize,
}

#[derive(Serialize)]
struct Report {
    peer: &'static str,
    jobs: usize,
    concurrency: usize,
    seconds: f64,
    jobs_per_s: f64,
}

const USAGE: &str = "usage: peers --peer <graphile_worker|pgq|apalis> --database-url <URL> --jobs <N> --concurrency <C> [--pause-before-drain]";

fn parse_args() -> Result<Args, String> {
    let (mut peer, mut url, mut jobs, mut concurrency) = (None, None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--pause-before-drain" {
            PAUSE.store(true, Ordering::Relaxed);
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--peer" => {
                peer = Some(match value.as_str() {
                    "graphile_worker" => Peer::GraphileWorker,
                    "pgq" => Peer::Pgq,
                    "apalis" => Peer::Apalis,
                    other => return Err(format!("unknown peer {other:?}\n{USAGE}")),
                })
            }
            "--database-url" => url = Some(value),
            "--jobs" => jobs = Some(positive(&flag, &value)?),
            "--concurrency" => concurrency = Some(positive(&flag, &value)?),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let missing = |name: &str| format!("missing {name}\n{USAGE}");
    Ok(Args {
        peer: peer.ok_or_else(|| missing("--peer"))?,
        url: url.ok_or_else(|| missing("--database-url"))?,
        jobs: jobs.ok_or_else(|| missing("--jobs"))?,
        concurrency: concurrency.ok_or_else(|| missing("--concurrency"))?,
    })
}

fn positive(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} must be a positive integer, got {value:?}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("peers: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<String, String> {
    let a = parse_args()?;
    let seconds = match a.peer {
        Peer::GraphileWorker => graphile::run(&a.url, a.jobs, a.concurrency).await,
        Peer::Pgq => pgq::run(&a.url, a.jobs, a.concurrency).await,
        Peer::Apalis => apalis_pg::run(&a.url, a.jobs, a.concurrency).await,
    }
    .map_err(|e| format!("{}: {e}", a.peer.name()))?;
    let report = Report {
        peer: a.peer.name(),
        jobs: a.jobs,
        concurrency: a.concurrency,
        seconds: (seconds * 1000.0).round() / 1000.0,
        jobs_per_s: (a.jobs as f64 / seconds * 10.0).round() / 10.0,
    };
    serde_json::to_string(&report).map_err(|e| format!("cannot encode the report: {e}"))
}

/// A small pool of our own for set-up, the queue checks and clean-up.
async fn admin_pool(url: &str) -> Result<PgPool, String> {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))
}

async fn execute(pool: &PgPool, sql: String) -> Result<(), String> {
    sqlx::raw_sql(AssertSqlSafe(sql.clone()))
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| format!("{sql}: {e}"))
}

async fn count(pool: &PgPool, sql: &str) -> Result<i64, String> {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .map_err(|e| format!("{sql}: {e}"))
}

/// A schema name no earlier run used.
fn unique_schema(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// Called by each peer between its prefill and the start of its worker.
/// With `--pause-before-drain` it prints `{"paused":"prefilled"}` on stdout
/// and waits for a line on stdin, so that the caller (the bench harness) can
/// read the database's commit and WAL counters with the prefill done and
/// nothing of the peer running; the report line follows at the end as usual.
async fn prefilled() -> Result<(), String> {
    if !PAUSE.load(Ordering::Relaxed) {
        return Ok(());
    }
    tokio::task::spawn_blocking(|| {
        use std::io::{BufRead, Write};
        let mut out = std::io::stdout().lock();
        writeln!(out, "{{\"paused\":\"prefilled\"}}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write to stdout: {e}"))?;
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) => Err("stdin closed during the pause before the drain".to_owned()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("cannot read stdin: {e}")),
        }
    })
    .await
    .map_err(|e| format!("the pause before the drain failed: {e}"))?
}

/// Starts the clock and polls the peer's worker (`run`) until
/// [`wait_until_done`]; the worker stopping first is an error. The caller
/// then stops the worker and awaits `run` to its end.
async fn time_drain<F, E>(
    run: std::pin::Pin<&mut F>,
    pool: &PgPool,
    jobs: usize,
    remaining_sql: &str,
) -> Result<f64, String>
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let start = Instant::now();
    tokio::select! {
        r = run => Err(match r {
            Ok(()) => "the worker stopped before the jobs were done".to_owned(),
            Err(e) => format!("the worker failed: {e}"),
        }),
        s = wait_until_done(pool, jobs, remaining_sql, start) => s,
    }
}

/// Waits until `jobs` handlers have run and `remaining_sql` (a count of the
/// jobs the peer has not yet recorded as completed) returns 0; returns the
/// seconds since `start`.
async fn wait_until_done(
    pool: &PgPool,
    jobs: usize,
    remaining_sql: &str,
    start: Instant,
) -> Result<f64, String> {
    // Generous: fails only a run slower than 200 jobs/s.
    let deadline = start + Duration::from_secs(120) + Duration::from_millis(5 * jobs as u64);
    loop {
        let handled = HANDLED.load(Ordering::Relaxed);
        if handled >= jobs {
            if count(pool, remaining_sql).await? == 0 {
                return Ok(start.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {:.0} s with {handled} of {jobs} jobs handled",
                start.elapsed().as_secs_f64()
            ));
        }
    }
}

/// After the worker has shut down: every job ran exactly once.
fn check_handled(jobs: usize) -> Result<(), String> {
    match HANDLED.load(Ordering::Relaxed) {
        n if n == jobs => Ok(()),
        n => Err(format!("{n} handler runs for {jobs} jobs")),
    }
}
