//! The read paths of issue 54 with a small and a large finished history, on
//! both adapters: what a metrics scrape, `status`, the listings, an
//! endpoint's stats and the dashboard's pages cost at 10,000 finished
//! deliveries and at millions (ADR 0032). The history is written with SQL
//! straight into the tables (1 % dead, one attempt each, one account, one
//! endpoint), as a year of traffic would have left it.

use crate::{
    acct, drop_schema, endpoint, fail, median, now_ms, pg_store, raw_client, unique, Args,
    BenchResult,
};
use control_plane_core::{
    Check, Checked, DeliveryListRequest, DeliveryState, DynControlPlaneStore,
    EndpointCreateRequest, EndpointId, EndpointKey, PageRequest, PollRequest, PublishRequest,
    Secret, SystemClock, Timestamp,
};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store_embedded::{EmbeddedConfig, EmbeddedStore};

/// What the read paths read: the endpoint with the history, and a poll
/// endpoint (ADR 0051) whose consumer has read everything, with its cursor.
#[derive(Clone, Copy)]
struct Target {
    endpoint: EndpointId,
    poll: EndpointId,
    cursor: i64,
}

/// One read path: its name and a call of it.
type ReadPath = (
    &'static str,
    fn(
        DynControlPlaneStore,
        Target,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = BenchResult<()>> + Send>>,
);

fn read_paths() -> Vec<ReadPath> {
    let store: Vec<ReadPath> = vec![
        ("metrics scrape (`GET /metrics`)", |s, _| {
            Box::pin(async move {
                api::Metrics::default().render(&s).await.map_err(fail)?;
                Ok(())
            })
        }),
        ("`status` (counts by state)", |s, _| {
            Box::pin(async move {
                s.delivery_count_by_state().await.map_err(fail)?;
                Ok(())
            })
        }),
        ("deliveries `?state=pending`, first page", |s, _| {
            Box::pin(async move { list(&s, DeliveryState::Pending).await })
        }),
        ("deliveries, every state, first page", |s, _| {
            Box::pin(async move {
                s.delivery_list(DeliveryListRequest::all(acct(), PageRequest::first(50)))
                    .await
                    .map_err(fail)?;
                Ok(())
            })
        }),
        ("dead letters, first page", |s, _| {
            Box::pin(async move { list(&s, DeliveryState::Dead).await })
        }),
        ("endpoint stats (hour and day)", |s, e| {
            Box::pin(async move {
                let now = Timestamp::from_millis(now_ms());
                for window in [3600, 86_400] {
                    s.attempt_stats(
                        EndpointKey::new(&acct(), e.endpoint),
                        now.minus(Duration::from_secs(window)),
                    )
                    .await
                    .map_err(fail)?;
                }
                Ok(())
            })
        }),
        ("poll endpoint, a caught-up consumer's read", |s, e| {
            Box::pin(async move {
                let req = PollRequest::new(acct(), e.poll, Some(e.cursor), 100).map_err(fail)?;
                s.delivery_poll(req).await.map_err(fail)?;
                Ok(())
            })
        }),
    ];
    store.into_iter().chain(dashboard_paths()).collect()
}

/// The dashboard's read paths (`api::query`), pages of issues 54 and 75.
fn dashboard_paths() -> Vec<ReadPath> {
    vec![
        ("dashboard, endpoints page", |s, _| {
            Box::pin(async move {
                let now = Timestamp::from_millis(now_ms());
                api::query::endpoint_health(&s, &acct(), now)
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
        ("dashboard, overview", |s, _| {
            Box::pin(async move {
                let now = Timestamp::from_millis(now_ms());
                api::query::overview(&s, &acct(), now)
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
        ("dashboard, endpoints page's counts", |s, _| {
            Box::pin(async move {
                api::query::state_counts(&s, &acct())
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
        ("dashboard, endpoint page", |s, e| {
            Box::pin(async move {
                let now = Timestamp::from_millis(now_ms());
                api::query::endpoint_page(&s, EndpointKey::new(&acct(), e.endpoint), now, 10)
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
        ("dashboard, deliveries page (why each waits)", |s, _| {
            Box::pin(async move {
                let req = DeliveryListRequest::all(acct(), PageRequest::first(50));
                api::query::delivery_page(&s, req, 10)
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
        ("dashboard, bulk replay's confirmation", |s, _| {
            Box::pin(async move {
                let filter = control_plane_core::ReplayFilter::all(acct());
                api::query::replay_preview(&s, &filter)
                    .await
                    .map_err(|e| e.message)?;
                Ok(())
            })
        }),
    ]
}

async fn list(s: &DynControlPlaneStore, state: DeliveryState) -> BenchResult<()> {
    let page = s
        .delivery_list(DeliveryListRequest {
            state: Some(state),
            ..DeliveryListRequest::all(acct(), PageRequest::first(50))
        })
        .await
        .map_err(fail)?;
    // The history holds 1 % dead: a dead-letter page that comes back empty
    // measured nothing (the smallest history of `--quick` has 25).
    if state == DeliveryState::Dead && page.items.is_empty() {
        return Err("no dead letters listed".into());
    }
    Ok(())
}

/// The medians (ms) of every read path on `store`, after two warm-ups.
/// First a poll endpoint is made and read to the end, so that its read
/// path is a caught-up consumer's.
async fn measure(store: DynControlPlaneStore, e: EndpointId, runs: usize) -> BenchResult<Vec<f64>> {
    let poll = poll_endpoint(&store, "bench.poll").await?;
    let publish = PublishRequest::new(acct(), "bench.poll", serde_json::json!({"n": 1}));
    store
        .event_publish(publish.checked().map_err(fail)?)
        .await
        .map_err(fail)?;
    let read = PollRequest::new(acct(), poll.id, None, 100).map_err(fail)?;
    let cursor = store.delivery_poll(read).await.map_err(fail)?.cursor;
    let target = Target {
        endpoint: e,
        poll: poll.id,
        cursor,
    };
    let mut out = Vec::new();
    for (_, read) in read_paths() {
        let mut ms = Vec::new();
        for i in 0..runs + 2 {
            let t = Instant::now();
            read(store.clone(), target).await?;
            if i >= 2 {
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        out.push(median(ms));
    }
    out.push(backlog_reads(&store, runs).await?);
    Ok(out)
}

/// A new poll endpoint (ADR 0051) of the bench's account receiving
/// `event_type`.
async fn poll_endpoint(
    store: &DynControlPlaneStore,
    event_type: &str,
) -> BenchResult<control_plane_core::Endpoint> {
    let mut req = EndpointCreateRequest::poll(
        acct(),
        Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    );
    req.event_types = vec![event_type.into()];
    store
        .endpoint_create(req.checked().map_err(fail)?)
        .await
        .map_err(fail)
}

/// The row after the read paths: a poll endpoint's consumer reading a
/// backlog, a page at a time ([`backlog_reads`]).
const BACKLOG_READ: &str = "poll endpoint, a read of 100 from a backlog of 10,000";

/// The median (ms) of reads of 100 that follow their cursor through a
/// backlog of 10,000 events of a new poll endpoint (each read hands out and
/// delivers its 100).
async fn backlog_reads(store: &DynControlPlaneStore, runs: usize) -> BenchResult<f64> {
    let poll = poll_endpoint(store, "bench.backlog").await?;
    for _ in 0..10 {
        let reqs: Vec<PublishRequest> = (0..1000)
            .map(|n| PublishRequest::new(acct(), "bench.backlog", serde_json::json!({"n": n})))
            .collect();
        store
            .event_publish_batch(Checked::all(reqs).map_err(fail)?)
            .await
            .map_err(fail)?;
    }
    let (mut cursor, mut ms) = (None, Vec::new());
    for i in 0..runs + 2 {
        let read = PollRequest::new(acct(), poll.id, cursor, 100).map_err(fail)?;
        let t = Instant::now();
        let page = store.delivery_poll(read).await.map_err(fail)?;
        if i >= 2 {
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        cursor = Some(page.cursor);
    }
    Ok(median(ms))
}

/// `size` finished deliveries of one endpoint, written by SQL (postgres).
pub(crate) async fn pg_history(
    c: &tokio_postgres::Client,
    e: EndpointId,
    size: i64,
) -> BenchResult<()> {
    let now = now_ms();
    c.execute(
        "WITH ev AS (INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
         SELECT gen_random_uuid(), 'bench', 'old', '{}', NULL, $2 FROM generate_series(1, $3::bigint) \
         RETURNING id), \
         d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
         SELECT gen_random_uuid(), 'bench', $1, ev.id, -row_number() OVER (), $2 FROM ev RETURNING id, seq) \
         INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, finished_at) \
         SELECT id, CASE WHEN seq % 100 = 0 THEN 'dead' ELSE 'delivered' END, 1, 8, $2, $2 FROM d",
        &[&e.0, &now, &size],
    )
    .await
    .map_err(fail)?;
    c.execute(
        "INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, latency_ms, \
         will_retry, next_attempt_at, recorded_at) SELECT gen_random_uuid(), $1, 'bench', 1, 'delivered', 200, \
         NULL, 1 + g % 300, false, NULL, $2 - (g % 86400) * 1000 FROM generate_series(1, $3::bigint) g",
        &[&e.0, &now, &size],
    )
    .await
    .map_err(fail)?;
    // What the adapter keeps beside the history (ADR 0032), where the
    // schema has it: the tallies, and the rollup of the attempts above.
    let has = |t: &str| format!("SELECT to_regclass('{t}') IS NOT NULL");
    if c.query_one(&has("delivery_tallies"), &[])
        .await
        .map_err(fail)?
        .get::<_, bool>(0)
    {
        c.execute(
            "INSERT INTO delivery_tallies (account, state, n) \
             SELECT 'bench', state, count(*) FROM delivery_done GROUP BY state",
            &[],
        )
        .await
        .map_err(fail)?;
    }
    // Migration 17 keeps a dead row's account and sequence on it (the
    // dead letters' partial index), where the schema has them.
    let dead_keys = "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'delivery_done' AND column_name = 'seq')";
    if c.query_one(dead_keys, &[])
        .await
        .map_err(fail)?
        .get::<_, bool>(0)
    {
        c.execute(
            "UPDATE delivery_done x SET account = d.account, seq = d.seq FROM deliveries d \
             WHERE x.state = 'dead' AND d.id = x.delivery_id",
            &[],
        )
        .await
        .map_err(fail)?;
    }
    if c.query_one(&has("attempt_rollup"), &[])
        .await
        .map_err(fail)?
        .get::<_, bool>(0)
    {
        c.execute(
            "INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
             SELECT endpoint_id, recorded_at - recorded_at % 60000, result, \
             (SELECT count(*) FROM unnest($1::bigint[]) b WHERE b < latency_ms), count(*) \
             FROM attempts GROUP BY 1, 2, 3, 4",
            &[&bounds()],
        )
        .await
        .map_err(fail)?;
    }
    c.batch_execute("ANALYZE").await.map_err(fail)?;
    Ok(())
}

/// The latency buckets' bounds, as the migrations list them.
fn bounds() -> Vec<i64> {
    (0..control_plane_core::LATENCY_BUCKETS - 1)
        .map(|b| i64::try_from(control_plane_core::latency_bucket_bound(b)).unwrap_or(i64::MAX))
        .collect()
}

/// `size` finished deliveries of endpoint `e`, written by SQL into the
/// DuckDB file at `path` while no store has it open.
fn duck_history(path: &std::path::Path, e: EndpointId, size: i64) -> BenchResult<()> {
    let c = duckdb::Connection::open(path).map_err(fail)?;
    let now = now_ms();
    let e = e.to_string();
    c.execute(
        "INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
         SELECT printf('00000000-0000-4000-9000-%012d', i), 'bench', 'old', '{}', NULL, $1 FROM range($2) t(i)",
        duckdb::params![now, size],
    )
    .map_err(fail)?;
    c.execute(
        "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, max_attempts, due_at, \
         created_at, updated_at) SELECT printf('00000000-0000-4000-8000-%012d', i), 'bench', $1, \
         printf('00000000-0000-4000-9000-%012d', i), 1 + i, \
         CASE WHEN i % 100 = 0 THEN 'dead' ELSE 'delivered' END, 1, 8, $2, $2, $2 FROM range($3) t(i)",
        duckdb::params![e, now, size],
    )
    .map_err(fail)?;
    // The history is older than what the store numbers next, as the
    // writer's counter would have it: sequence numbers 1 to `size`, below
    // the live deliveries the bench publishes after.
    c.execute(
        "UPDATE counters SET value = $1 WHERE name = 'delivery_seq'",
        duckdb::params![size],
    )
    .map_err(fail)?;
    c.execute(
        "INSERT INTO attempts (id, delivery_id, endpoint_id, account, attempt, result, status_code, latency_ms, \
         will_retry, recorded_at) SELECT -1 - i, printf('00000000-0000-4000-8000-%012d', i), $1, 'bench', 1, 'delivered', 200, 1 + i % 300, false, \
         $2 - (i % 86400) * 1000 FROM range($3) t(i)",
        duckdb::params![e, now, size],
    )
    .map_err(fail)?;
    let table = |name: &str| -> BenchResult<bool> {
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = $1",
                [name],
                |r| r.get(0),
            )
            .map_err(fail)?;
        Ok(n > 0)
    };
    // The copy of the dead deliveries the embedded store pages its dead
    // letters from (embedded migration 13), where the schema has it.
    if table("dead_letters")? {
        c.execute(
            "INSERT INTO dead_letters (account, seq, id, endpoint_id, event_id, attempts, max_attempts, \
             due_at, lease_expires_at, last_error, created_at, updated_at) \
             SELECT account, seq, id, endpoint_id, event_id, attempts, max_attempts, due_at, \
             lease_expires_at, last_error, created_at, updated_at FROM deliveries WHERE state = 'dead' ORDER BY seq",
            [],
        )
        .map_err(fail)?;
        let n: i64 = c
            .query_row("SELECT count(*) FROM dead_letters", [], |r| r.get(0))
            .map_err(fail)?;
        eprintln!("bench: history embedded: {n} dead letters written");
    }
    if table("attempt_rollup")? {
        let values: Vec<String> = bounds().iter().map(|b| format!("({b})")).collect();
        c.execute(
            &format!(
                "INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
                 SELECT endpoint_id, m, result, bucket, count(*) FROM (SELECT endpoint_id, \
                 recorded_at - recorded_at % 60000 AS m, result, \
                 (SELECT count(*) FROM (VALUES {}) b(v) WHERE b.v < a.latency_ms) AS bucket \
                 FROM attempts a) r GROUP BY ALL",
                values.join(",")
            ),
            [],
        )
        .map_err(fail)?;
    }
    c.execute("CHECKPOINT", []).map_err(fail)?;
    Ok(())
}

/// The medians of every read path at `size` finished deliveries, postgres.
async fn pg_at(a: &Args, size: i64, runs: usize) -> BenchResult<Vec<f64>> {
    let schema = unique("bench_history");
    let store = pg_store(&a.url, &schema, 4, false).await?;
    let e = endpoint(&store, "https://example.com/hook").await?;
    pg_history(&raw_client(&a.url, &schema).await?, e.id, size).await?;
    let store: DynControlPlaneStore = Arc::new(store);
    let medians = measure(store.clone(), e.id, runs).await;
    drop(store);
    drop_schema(&a.url, &schema).await?;
    medians
}

/// An embedded store in a new directory under `dir` (named after
/// `prefix`) whose one endpoint has `size` finished deliveries written by
/// [`duck_history`]: the store, the endpoint and the directory to remove.
pub(crate) async fn embedded_with_history(
    dir: &std::path::Path,
    prefix: &str,
    size: i64,
) -> BenchResult<(EmbeddedStore, EndpointId, std::path::PathBuf)> {
    let dir = dir.join(unique(prefix));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let path = dir.join("bench.duckdb");
    let open = || EmbeddedStore::open(EmbeddedConfig::new(path.clone()), Arc::new(SystemClock));
    let store = open().await.map_err(fail)?;
    let e = endpoint(&store, "https://example.com/hook").await?;
    drop(store);
    let fill = path.clone();
    tokio::task::spawn_blocking(move || duck_history(&fill, e.id, size))
        .await
        .map_err(fail)??;
    Ok((open().await.map_err(fail)?, e.id, dir))
}

/// The medians of every read path at `size` finished deliveries, embedded.
async fn embedded_at(dir: &std::path::Path, size: i64, runs: usize) -> BenchResult<Vec<f64>> {
    let (store, e, dir) = embedded_with_history(dir, "history", size).await?;
    let store: DynControlPlaneStore = Arc::new(store);
    let medians = measure(store.clone(), e, runs).await;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    medians
}

/// Every read path of issue 54 at 10,000 finished deliveries and at
/// `--history-rows` (postgres) and a quarter of it (embedded).
pub(crate) async fn history(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let runs = if a.quick { 3 } else { 7 };
    let large = if a.quick { 100_000 } else { a.history_rows };
    let mut out = String::new();
    for profile in &a.profiles {
        let large = if *profile == "embedded" {
            large / 4
        } else {
            large
        };
        let small = 10_000.min(large / 10);
        let mut rows = Vec::new();
        for size in [small, large] {
            eprintln!("bench: history {profile} {size}");
            let medians = if *profile == "postgres" {
                pg_at(a, size, runs).await?
            } else {
                embedded_at(dir, size, runs).await?
            };
            rows.push(medians);
        }
        let _ = writeln!(
            out,
            "\n{profile}: medians of {runs} after 2 warm-ups (ms)\n\n| read path | {small} finished | {large} finished | ratio |\n| --- | --- | --- | --- |"
        );
        let names = read_paths().into_iter().map(|(name, _)| name);
        for (i, name) in names.chain([BACKLOG_READ]).enumerate() {
            let (s, l) = (rows[0][i], rows[1][i]);
            let _ = writeln!(
                out,
                "| {name} | {s:.2} | {l:.2} | {:.2} |",
                l / s.max(0.001)
            );
        }
    }
    Ok(out)
}
