//! Issue 73's drain shapes on postgres, the figures the delivery log is to
//! be judged by: today's burn-down (16 drainers, claims of 100) beside the
//! same backlog drained in graphile_worker's shape (one claimer of up to 500
//! feeding 16 slots), with a transaction held open elsewhere for the whole
//! drain, and with one endpoint of sixteen that never answers; and the
//! anchors, the minimal queue and "minimal + attempt row", also with the
//! open transaction. Each row carries the database's commits and WAL bytes
//! per delivery. Rounds run the shapes in rotated order; rates are medians.

use crate::queue::{burn_size, minimal_queue, open_profile, DbCost};
use crate::{
    drain_port, drop_schema, endpoint, fail, flow_endpoint, median, pg_prefill, raw_client,
    record_delivered, Args, BenchResult,
};
use control_plane_core::{ClaimRequest, ClaimedDelivery, DynControlPlaneStore, EndpointId};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shapes, in the order of the table.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Today's burn-down: 16 drainers, each claiming 100 and recording them.
    Drainers,
    /// One claimer of up to 500 whose batches 16 slots record.
    OneClaimer,
    /// Today's burn-down with a transaction held open elsewhere.
    DrainersHeldOpen,
    /// Sixteen endpoints, one of which never answers (its claimed
    /// deliveries stay leased); the rate of the other fifteen.
    Stalled,
    /// The minimal queue (a claim that updates, a delete).
    Minimal,
    /// The minimal queue plus one appended attempt row per job.
    MinimalAttempt,
    /// The same with a transaction held open elsewhere.
    MinimalAttemptHeldOpen,
}

const SHAPES: [Shape; 7] = [
    Shape::Drainers,
    Shape::OneClaimer,
    Shape::DrainersHeldOpen,
    Shape::Stalled,
    Shape::Minimal,
    Shape::MinimalAttempt,
    Shape::MinimalAttemptHeldOpen,
];

impl Shape {
    fn label(self) -> &'static str {
        match self {
            Shape::Drainers => "ours: 16 drainers, claims of 100 (today's burn-down)",
            Shape::OneClaimer => {
                "ours: one claimer of up to 500 feeding 16 slots (graphile_worker's shape)"
            }
            Shape::DrainersHeldOpen => "ours: 16 × 100, a transaction held open elsewhere",
            Shape::Stalled => {
                "ours: 16 × 100 over 16 endpoints, one never answers (the other 15's rate)"
            }
            Shape::Minimal => "minimal queue (16 × 100; update at claim, delete)",
            Shape::MinimalAttempt => "minimal + attempt row (16 × 100)",
            Shape::MinimalAttemptHeldOpen => {
                "minimal + attempt row, a transaction held open elsewhere"
            }
        }
    }
}

/// A transaction held open on a connection of its own, with a snapshot and
/// a transaction id, from [`HeldOpen::begin`] until it is dropped: no row
/// version that dies meanwhile can be pruned or vacuumed (the case that
/// took PgQ from 205,900 to 13,600/s in an earlier peers run).
struct HeldOpen {
    _connection: tokio_postgres::Client,
}

impl HeldOpen {
    async fn begin(url: &str) -> BenchResult<HeldOpen> {
        let c = raw_client(url, "public").await?;
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current()")
            .await
            .map_err(fail)?;
        Ok(HeldOpen { _connection: c })
    }
}

/// The section's table: every shape `a.runs` times in rotated order.
pub(crate) async fn shapes(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let n = burn_size(a, "postgres");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); SHAPES.len()];
    let mut costs: Vec<Option<(f64, f64)>> = vec![None; SHAPES.len()];
    for round in 0..a.runs {
        for k in 0..SHAPES.len() {
            let i = (k + round) % SHAPES.len();
            let Some(&shape) = SHAPES.get(i) else {
                continue;
            };
            let (rate, cost) = run(a, dir, shape, n).await?;
            eprintln!("bench: shape {}: {rate:.0}/s", shape.label());
            if let (Some(r), Some(c)) = (rates.get_mut(i), costs.get_mut(i)) {
                r.push(rate);
                *c = Some(cost);
            }
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    let today = medians.first().copied().unwrap_or(f64::NAN);
    let mut out = format!(
        "| shape ({n} deliveries) | deliveries/s (median of {} rounds, rotated order) | / today's burn-down | commits per delivery (last round) | WAL bytes per delivery (last round) |\n\
         | --- | --- | --- | --- | --- |\n",
        a.runs
    );
    for ((shape, rate), cost) in SHAPES.iter().zip(&medians).zip(&costs) {
        let (commits, wal) = cost.unwrap_or((f64::NAN, f64::NAN));
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {:.2} | {commits:.3} | {wal:.0} |",
            shape.label(),
            rate / today
        );
    }
    Ok(out)
}

/// One round of `shape` over `n` deliveries: its rate and its (commits, WAL
/// bytes) per delivery answered.
async fn run(
    a: &Args,
    dir: &std::path::Path,
    shape: Shape,
    n: usize,
) -> BenchResult<(f64, (f64, f64))> {
    let held = match shape {
        Shape::Minimal => return minimal_queue(a, n, 16, 100, false).await,
        Shape::MinimalAttempt => return minimal_queue(a, n, 16, 100, true).await,
        Shape::MinimalAttemptHeldOpen => {
            let held = HeldOpen::begin(&a.url).await?;
            let r = minimal_queue(a, n, 16, 100, true).await;
            drop(held);
            return r;
        }
        _ => shape == Shape::DrainersHeldOpen,
    };
    let (store, schema) = open_profile(a, "postgres", dir).await?;
    let schema = schema.ok_or("the postgres profile has a schema")?;
    let stalled = if shape == Shape::Stalled {
        Some(stalled_backlog(a, &store, &schema, n).await?)
    } else {
        let e = endpoint(store.as_ref(), "https://example.com/hook").await?;
        pg_prefill(&a.url, &schema, &e, n).await?;
        None
    };
    let held = if held {
        Some(HeldOpen::begin(&a.url).await?)
    } else {
        None
    };
    let before = DbCost::read(&a.url).await?;
    let r = match (shape, stalled) {
        (Shape::OneClaimer, _) => one_claimer(store, 500, 16, n).await.map(|rate| (rate, n)),
        (_, Some((e, answered))) => drain_around(store, e, answered)
            .await
            .map(|rate| (rate, answered)),
        _ => drain_port(store, 16, 100, n).await.map(|rate| (rate, n)),
    };
    let cost = match &r {
        Ok((_, answered)) => DbCost::read(&a.url).await?.since(&before, *answered),
        Err(_) => (f64::NAN, f64::NAN),
    };
    drop(held);
    drop_schema(&a.url, &schema).await?;
    r.map(|(rate, _)| (rate, cost))
}

/// Sixteen endpoints with `n / 16` pending deliveries each; the first keeps
/// a cap of 16 (its claims stop there, as a real endpoint's would) and is
/// the one that never answers. Returns it and how many the others hold.
async fn stalled_backlog(
    a: &Args,
    store: &DynControlPlaneStore,
    schema: &str,
    n: usize,
) -> BenchResult<(EndpointId, usize)> {
    let each = (n / 16).max(1);
    let silent = flow_endpoint(store.as_ref(), "https://example.com/silent", &[], Some(16)).await?;
    pg_prefill(&a.url, schema, &silent, each).await?;
    for k in 1..16 {
        let e = endpoint(store.as_ref(), &format!("https://example.com/hook{k}")).await?;
        // `pg_prefill` makes ids from the current millisecond and a counter.
        tokio::time::sleep(Duration::from_millis(2)).await;
        pg_prefill(&a.url, schema, &e, each).await?;
    }
    Ok((silent.id, each * 15))
}

/// 16 drainers claiming 100 at a time that answer every delivery but those
/// of `silent`, until `answered` are recorded; their rate.
async fn drain_around(
    store: DynControlPlaneStore,
    silent: EndpointId,
    answered: usize,
) -> BenchResult<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16 {
        let (store, done) = (store.clone(), done.clone());
        tasks.spawn(async move {
            let mut idle = 0;
            while (done.load(Ordering::Relaxed) as usize) < answered {
                let claimed = store
                    .delivery_claim(
                        ClaimRequest::new(format!("w{w}"), 100, Duration::from_secs(300))
                            .map_err(fail)?,
                    )
                    .await
                    .map_err(fail)?;
                let answer: Vec<ClaimedDelivery> = claimed
                    .into_iter()
                    .filter(|c| c.delivery.endpoint_id != silent)
                    .collect();
                if answer.is_empty() {
                    idle += 1;
                    if idle > 2_000 {
                        return Err(format!(
                            "stalled drain: {} of {answered} after 10 s of empty claims",
                            done.load(Ordering::Relaxed)
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                let k = record_delivered(store.as_ref(), &answer).await?;
                done.fetch_add(k, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// graphile_worker's shape: one claimer takes up to `batch` at a time and
/// hands each claim to `slots` tasks in equal parts; each slot records its
/// part in one call. Returns deliveries/s over `total`.
async fn one_claimer(
    store: DynControlPlaneStore,
    batch: u32,
    slots: usize,
    total: usize,
) -> BenchResult<f64> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<ClaimedDelivery>>(slots);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..slots {
        let (store, rx, done) = (store.clone(), rx.clone(), done.clone());
        tasks.spawn(async move {
            loop {
                let part = rx.lock().await.recv().await;
                let Some(part) = part else {
                    return Ok::<(), String>(());
                };
                let k = record_delivered(store.as_ref(), &part).await?;
                done.fetch_add(k, Ordering::Relaxed);
            }
        });
    }
    let mut idle = 0;
    let mut handed = 0;
    while handed < total {
        let claimed = store
            .delivery_claim(
                ClaimRequest::new("claimer", batch, Duration::from_secs(60)).map_err(fail)?,
            )
            .await
            .map_err(fail)?;
        if claimed.is_empty() {
            idle += 1;
            if idle > 2_000 {
                return Err(format!(
                    "one claimer: {handed} of {total} handed out, then empty claims for 10 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        idle = 0;
        handed += claimed.len();
        let part = claimed.len().div_ceil(slots).max(1);
        let mut claimed = claimed;
        while !claimed.is_empty() {
            let rest = claimed.split_off(part.min(claimed.len()));
            tx.send(claimed).await.map_err(fail)?;
            claimed = rest;
        }
    }
    drop(tx);
    while let Some(r) = tasks.join_next().await {
        r.map_err(fail)??;
    }
    let n = done.load(Ordering::Relaxed) as usize;
    if n != total {
        return Err(format!("one claimer: recorded {n} of {total}"));
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
