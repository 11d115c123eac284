//! End to end through the dispatcher, fairness beside bad neighbours, and wake-up latency.

use crate::queue::open_profile;
use crate::{
    acct, drop_schema, endpoint, fail, flow_endpoint, percentile, pg_prefill, pg_store, prefill,
    repeat, unique, Args, BenchResult,
};
use control_plane_core::{
    AccountId, Check, ControlPlaneStore, DeliveryState, DynControlPlaneStore,
    EndpointCreateRequest, EventStore, PublishRequest, Secret,
};
use dispatcher::{Cidr, Dispatcher, DispatcherConfig};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use workspace_tests::{answer_after, Receiver};

/// A receiver (the test-support one) at `/hook` that answers `200` after
/// `delay`.
pub(crate) async fn receiver(delay: Duration) -> BenchResult<(String, Arc<Receiver>)> {
    receiver_answering(delay, 200).await
}

/// A receiver at `/hook` that records each request, waits `delay`, then
/// answers `status`.
pub(crate) async fn receiver_answering(
    delay: Duration,
    status: u16,
) -> BenchResult<(String, Arc<Receiver>)> {
    let (r, base) = Receiver::start(answer_after(delay, status)).await;
    Ok((format!("{base}/hook"), r))
}

pub(crate) fn dispatcher_for(
    store: DynControlPlaneStore,
    poll: Duration,
) -> BenchResult<Dispatcher> {
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

/// Waits until the store counts `total` deliveries delivered; an error
/// naming `what` after 10 minutes.
pub(crate) async fn wait_delivered(
    store: &dyn ControlPlaneStore,
    total: usize,
    what: &str,
) -> BenchResult<()> {
    let start = Instant::now();
    loop {
        let counts = store.delivery_count_by_state().await.map_err(fail)?;
        let delivered = counts
            .iter()
            .find(|(s, _)| *s == DeliveryState::Delivered)
            .map_or(0, |(_, n)| *n);
        if delivered as usize >= total {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(format!("{what}: {delivered} of {total} after 10 min"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn end_to_end(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
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
            wait_delivered(store.as_ref(), total, &format!("end to end on {profile}")).await?;
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
pub(crate) struct Neighbours {
    name: &'static str,
    slots: usize,
    neighbours: usize,
    delay: Duration,
    status: u16,
    other_account: bool,
}

/// The isolation scenarios of issue 34, at the default 64 slots and at 16.
pub(crate) fn neighbour_scenarios() -> Vec<Neighbours> {
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
pub(crate) async fn fairness(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
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
            let noisy = add_neighbours(store.as_ref(), sc, backlog).await?;
            let (stop, run) = start_dispatcher(store.clone(), sc.slots)?;
            // Let the neighbours fill the slots and the worker learn them:
            // longer than the slow-answer threshold (1 s) plus one answer.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let noisy_before: usize = noisy.iter().map(|r| r.count()).sum();
            let window = Instant::now();
            let mut sent = Vec::new();
            for i in 0..samples {
                let p = store
                    .event_publish(
                        PublishRequest::new(acct(), "healthy", serde_json::json!({ "i": i }))
                            .checked()
                            .map_err(fail)?,
                    )
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
            let mut lat = arrival_latencies(&seen, &sent, Duration::from_secs(120)).await;
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

/// A dispatcher of `slots` on `store` with the default endpoint cap, run
/// until the token is cancelled.
fn start_dispatcher(
    store: DynControlPlaneStore,
    slots: usize,
) -> BenchResult<(
    CancellationToken,
    tokio::task::JoinHandle<dispatcher::DispatchReport>,
)> {
    let loopback = Cidr::parse("127.0.0.0/8").ok_or("cidr")?;
    let d = Dispatcher::new(
        store,
        DispatcherConfig {
            worker: "fair".into(),
            concurrency: slots,
            max_batch: 100,
            poll_interval: Duration::from_millis(1000),
            allowed_targets: vec![loopback],
            ..DispatcherConfig::default()
        },
    )?;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    Ok((stop, tokio::spawn(async move { d.run(stopped).await })))
}

/// Creates `sc`'s neighbours, each with its own receiver and a backlog of
/// `backlog` events; their receivers.
async fn add_neighbours(
    store: &dyn ControlPlaneStore,
    sc: &Neighbours,
    backlog: usize,
) -> BenchResult<Vec<Arc<Receiver>>> {
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
        store
            .endpoint_create(req.checked().map_err(fail)?)
            .await
            .map_err(fail)?;
        let reqs = (0..backlog)
            .map(|i| {
                PublishRequest::new(account.clone(), ty.clone(), serde_json::json!({ "i": i }))
            })
            .collect();
        store
            .event_publish_batch(control_plane_core::Checked::all(reqs).map_err(fail)?)
            .await
            .map_err(fail)?;
    }
    Ok(noisy)
}

/// Publish-to-arrival latencies (ms) of the deliveries `sent` (id, when)
/// that `seen` received, waiting up to `wait` for all of them.
async fn arrival_latencies(
    seen: &Receiver,
    sent: &[(String, Instant)],
    wait: Duration,
) -> Vec<f64> {
    let deadline = Instant::now() + wait;
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
    lat
}

/// Enqueue-to-first-attempt latency across two replicas (publish on one
/// store, dispatch from another): with LISTEN/NOTIFY, and polling only.
pub(crate) async fn wakeup_latency(a: &Args) -> BenchResult<String> {
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
                .event_publish(
                    PublishRequest::new(acct(), "bench.latency", serde_json::json!({}))
                        .checked()
                        .map_err(fail)?,
                )
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
