//! Broker destinations beside HTTP (issue 59): deliveries per second to one
//! destination through one dispatcher of 64 slots, and each attempt's
//! send-to-acknowledgement time (the attempt log's latency) at p50 and p99.
//! RabbitMQ, NATS and Redis are the machine's own, on 127.0.0.1.

use crate::delivery::{receiver, wait_delivered};
use crate::queue::open_profile;
use crate::{acct, drop_schema, endpoint, fail, prefill, unique, Args, BenchResult};
use control_plane_core::{nearest_rank, AttemptQuery, ControlPlaneStore, PageRequest};
use dispatcher::{Cidr, Dispatcher, DispatcherConfig};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use workspace_tests::Receiver;

/// The destinations measured: HTTP to a local receiver, then each broker.
const KINDS: [&str; 4] = ["http", "amqp", "nats", "redis"];

/// A channel on the machine's RabbitMQ, and the connection it lives on.
async fn amqp_channel() -> BenchResult<(lapin::Connection, lapin::Channel)> {
    let conn = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
    .map_err(fail)?;
    let ch = conn.create_channel().await.map_err(fail)?;
    Ok((conn, ch))
}

/// A destination of `kind` made ready to take messages (a queue, a stream),
/// its endpoint URL, and what keeps it alive (the receiver).
async fn destination(kind: &str) -> BenchResult<(String, Option<Arc<Receiver>>)> {
    let name = unique("cpbench");
    match kind {
        "http" => {
            let (url, r) = receiver(Duration::ZERO).await?;
            Ok((url, Some(r)))
        }
        "amqp" => {
            let (_conn, ch) = amqp_channel().await?;
            let args = lapin::types::FieldTable::default();
            let opts = lapin::options::QueueDeclareOptions {
                auto_delete: false,
                ..Default::default()
            };
            ch.queue_declare(name.as_str().into(), opts, args)
                .await
                .map_err(fail)?;
            Ok((
                format!("amqp://127.0.0.1:5672/%2f?exchange=&routing_key={name}"),
                None,
            ))
        }
        "nats" => {
            let client = async_nats::connect("nats://127.0.0.1:4222")
                .await
                .map_err(fail)?;
            let js = async_nats::jetstream::new(client);
            js.create_stream(async_nats::jetstream::stream::Config {
                name: name.to_uppercase(),
                subjects: vec![format!("{name}.events")],
                storage: async_nats::jetstream::stream::StorageType::Memory,
                ..Default::default()
            })
            .await
            .map_err(fail)?;
            Ok((format!("nats://127.0.0.1:4222?subject={name}.events"), None))
        }
        _ => Ok((
            format!("redis://127.0.0.1:6379/0?stream={name}&maxlen=100000"),
            None,
        )),
    }
}

/// Removes what [`destination()`] made on a broker.
async fn remove(kind: &str, url: &str) -> BenchResult<()> {
    let after = |key: &str| {
        url.split(key)
            .nth(1)
            .and_then(|s| s.split(['&', '.']).next())
            .unwrap_or_default()
            .to_string()
    };
    match kind {
        "amqp" => {
            let (_conn, ch) = amqp_channel().await?;
            let queue = after("routing_key=");
            ch.queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await
            .map_err(fail)?;
        }
        "nats" => {
            let client = async_nats::connect("nats://127.0.0.1:4222")
                .await
                .map_err(fail)?;
            let js = async_nats::jetstream::new(client);
            js.delete_stream(after("subject=").to_uppercase())
                .await
                .map_err(fail)?;
        }
        "redis" => {
            let stream = after("stream=");
            let client = redis::Client::open("redis://127.0.0.1:6379/0").map_err(fail)?;
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .map_err(fail)?;
            let _: i64 = redis::cmd("DEL")
                .arg(&stream)
                .query_async(&mut c)
                .await
                .map_err(fail)?;
        }
        _ => {}
    }
    Ok(())
}

/// Every attempt's latency (ms) of the account, sorted.
async fn latencies(store: &dyn ControlPlaneStore) -> BenchResult<Vec<u64>> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = PageRequest::new(1000, after).map_err(fail)?;
        let got = store
            .attempt_search(AttemptQuery::new(acct(), page))
            .await
            .map_err(fail)?;
        out.extend(got.items.iter().map(|a| a.latency_ms));
        match got.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn percentile(sorted: &[u64], percent: u64) -> u64 {
    nearest_rank(percent, sorted.len() as u64)
        .and_then(|i| sorted.get(usize::try_from(i).ok()?).copied())
        .unwrap_or(0)
}

/// One run: `total` deliveries to a destination of `kind` on `profile`.
async fn one(
    a: &Args,
    dir: &std::path::Path,
    profile: &str,
    kind: &str,
    total: usize,
) -> BenchResult<(f64, u64, u64)> {
    let (store, schema) = open_profile(a, profile, dir).await?;
    let (url, _receiver) = destination(kind).await?;
    endpoint(store.as_ref(), &url).await?;
    prefill(store.as_ref(), total).await?;
    let d = Dispatcher::new(
        store.clone(),
        DispatcherConfig {
            worker: "bench".into(),
            concurrency: 64,
            max_batch: 100,
            poll_interval: Duration::from_millis(50),
            allowed_targets: vec![Cidr::parse("127.0.0.0/8").ok_or("cidr")?],
            ..DispatcherConfig::default()
        },
    )?;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let start = Instant::now();
    let run = tokio::spawn(async move { d.run(stopped).await });
    wait_delivered(store.as_ref(), total, &format!("{kind} on {profile}")).await?;
    let rate = total as f64 / start.elapsed().as_secs_f64();
    stop.cancel();
    let _ = run.await;
    let lat = latencies(store.as_ref()).await?;
    remove(kind, &url).await?;
    if let Some(s) = schema {
        drop_schema(&a.url, &s).await?;
    }
    Ok((rate, percentile(&lat, 50), percentile(&lat, 99)))
}

pub(crate) async fn brokers(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let mut out = String::from(
        "| adapter | destination | deliveries/s (one dispatcher, 64 slots) | send-to-ack p50 (ms) | p99 (ms) |\n| --- | --- | --- | --- | --- |\n",
    );
    let total = if a.quick { 200 } else { 10_000 };
    for &profile in &a.profiles {
        for kind in KINDS {
            let (rate, p50, p99) = one(a, dir, profile, kind, total).await?;
            let _ = writeln!(out, "| {profile} | {kind} | {rate:.0} | {p50} | {p99} |");
            eprintln!("bench: {kind} on {profile}: {rate:.0}/s, p50 {p50} ms, p99 {p99} ms");
        }
    }
    Ok(out)
}
