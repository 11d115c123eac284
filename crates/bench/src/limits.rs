//! What one client or one tenant can take from `control-plane serve`
//! (issue 54): a healthy client's latency beside many half-open
//! connections and how soon the server closes them, and the memory and
//! answer time of event-type registrations with costly schemas.

use crate::serve::{start_serve, BENCH_ADMIN};
use crate::{fail, percentile};
use crate::{unique, Args, BenchResult};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `n` sequential `GET /healthz` on one kept-alive client: p50, p99 (ms).
async fn healthy(client: &reqwest::Client, base: &str, n: usize) -> BenchResult<(f64, f64)> {
    let mut ms = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .map_err(fail)?;
        if !r.status().is_success() {
            return Err(format!("healthz answered {}", r.status()));
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((percentile(&mut ms, 0.5), percentile(&mut ms, 0.99)))
}

/// Half-open connections against the embedded profile's API.
async fn half_open(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let n = if a.quick { 500 } else { 10_000 };
    let header_timeout = Duration::from_secs(if a.quick { 3 } else { 10 });
    let (child, base, _) = start_serve_with(a, dir, header_timeout).await?;
    let client = reqwest::Client::new();
    let addr = base.trim_start_matches("http://").to_string();
    let (p50, p99) = healthy(&client, &base, 500).await?;
    let opened = Instant::now();
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = tokio::net::TcpStream::connect(&addr).await.map_err(fail)?;
        if i % 2 == 0 {
            c.write_all(b"POST /v1/accounts/a/events HTTP/1.1\r\nhost: x\r\n")
                .await
                .map_err(fail)?;
        }
        held.push(c);
    }
    let (with50, with99) = healthy(&client, &base, 500).await?;
    // Each held connection: the time the server closed it.
    let mut closes = Vec::new();
    for mut c in held {
        let deadline = header_timeout + Duration::from_secs(5);
        let left = deadline.saturating_sub(opened.elapsed());
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(left, c.read(&mut buf)).await {
            closes.push(opened.elapsed().as_secs_f64());
        }
    }
    drop(child);
    let last = closes.iter().copied().fold(0.0, f64::max);
    Ok(format!(
        "| half-open connections (half with half a head, half silent) | healthy `GET /healthz` p50 / p99 without (ms) | with them (ms) | closed by the server | the last closed after (s; header timeout {} s) |\n| --- | --- | --- | --- | --- |\n| {n} | {p50:.2} / {p99:.2} | {with50:.2} / {with99:.2} | {} | {last:.1} |\n",
        header_timeout.as_secs(),
        closes.len()
    ))
}

/// `control-plane serve` on the embedded profile with `header_timeout`.
async fn start_serve_with(
    a: &Args,
    dir: &std::path::Path,
    header_timeout: Duration,
) -> BenchResult<(tokio::process::Child, String, Option<String>)> {
    // start_serve reads its variables from this process's view of them.
    let mut a = a.clone();
    a.serve_env = vec![(
        "CONTROLPLANE_HTTP_HEADER_TIMEOUT".into(),
        format!("{}s", header_timeout.as_secs()),
    )];
    start_serve(&a, "embedded", dir, &unique("limits")).await
}

/// The current and peak resident set of `pid`, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A schema of `patterns` string properties, each with a bounded-repetition
/// pattern (the shape issue 54 registered).
fn costly_schema(patterns: usize, repeat: usize) -> serde_json::Value {
    let props: serde_json::Map<String, serde_json::Value> = (0..patterns)
        .map(|i| {
            (
                format!("f{i}"),
                serde_json::json!({"type": "string", "pattern": format!("^[ab]{{0,{repeat}}}c{i}$")}),
            )
        })
        .collect();
    serde_json::json!({"type": "object", "properties": props})
}

/// One account registers costly schemas up to its quotas.
async fn schemas(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let (child, base, _) = start_serve(a, "embedded", dir, &unique("schemas")).await?;
    let pid = child.id().ok_or("no pid")?;
    let client = reqwest::Client::new();
    let put = |name: String, schema: serde_json::Value| {
        client
            .put(format!("{base}/v1/accounts/tenant/event-types/{name}"))
            .bearer_auth(BENCH_ADMIN)
            .header("content-type", "application/json")
            .body(serde_json::json!({"description": "costly", "schema": schema}).to_string())
            .send()
    };
    // The registration: 1,829 patterns, refused before compiling.
    let t = Instant::now();
    let r = put("issue.schema".into(), costly_schema(1_829, 900))
        .await
        .map_err(fail)?;
    let refused = (r.status().as_u16(), t.elapsed().as_secs_f64() * 1000.0);
    let before = rss_mib(pid).0;
    let mut ms = Vec::new();
    let mut statuses = std::collections::BTreeMap::new();
    let count = if a.quick { 10 } else { 200 };
    for i in 0..count {
        // As many patterns as a schema may hold, as long as they compile.
        let t = Instant::now();
        let r = put(format!("costly.t{i}"), costly_schema(32, 40 + i % 20))
            .await
            .map_err(fail)?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    let (after, peak) = rss_mib(pid);
    drop(child);
    let answers: Vec<String> = statuses.iter().map(|(s, n)| format!("{n} × {s}")).collect();
    Ok(format!(
        "| registration | answer | time (ms) |\n| --- | --- | --- |\n| 1,829 patterns (issue 54's schema) | {} | {:.1} |\n| {count} schemas of 32 patterns each, one account | {} | p50 {:.1}, max {:.1} |\n\nRSS of `control-plane serve` before them {before:.1} MiB, after {after:.1} MiB (growth {:.1} MiB), peak {peak:.1} MiB.\n",
        refused.0,
        refused.1,
        answers.join(", "),
        percentile(&mut ms.clone(), 0.5),
        ms.iter().copied().fold(0.0, f64::max),
        after - before,
    ))
}

/// Both measurements.
pub(crate) async fn limits(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    if a.serve_bin.is_none() {
        return Ok("not measured: no --serve-bin given\n".into());
    }
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    Ok(format!(
        "{build} build of the bench; the service as built beside it.\n\n{}\n{}",
        half_open(a, dir).await?,
        schemas(a, dir).await?
    ))
}
