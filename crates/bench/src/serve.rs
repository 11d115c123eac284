//! Sections that run `control-plane serve`: the user's HTTP path, replicas and memory.

use crate::delivery::receiver;
use crate::{
    drop_schema, endpoint, fail, percentile, pg_prefill, pg_store, raw_client, repeat, unique,
    Args, BenchResult,
};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workspace_tests::{api_call, Receiver};

/// `control-plane <command>` with none of this harness's own
/// `CONTROLPLANE_*` variables (the binary refuses unknown ones, such as the
/// test database URL) and, given a schema, on that postgres schema.
pub(crate) fn control_plane(
    a: &Args,
    command: &str,
    schema: Option<&str>,
) -> BenchResult<tokio::process::Command> {
    let bin = a.serve_bin.as_deref().ok_or("no --serve-bin given")?;
    let mut c = tokio::process::Command::new(bin);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        c.env_remove(k);
    }
    c.envs(a.serve_env.iter().map(|(k, v)| (k, v)));
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
pub(crate) fn key_file(schema: &str) -> BenchResult<std::path::PathBuf> {
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
        writeln!(
            f,
            "{}",
            control_plane_store_kit::SecretKey::generate().to_text()
        )
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(path)
}

/// `control-plane serve` on `profile`, its API's base address, and (on
/// postgres) its schema. Its log goes to `dir/<name>.log`.
pub(crate) async fn start_serve(
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

pub(crate) const BENCH_ADMIN: &str = "bench-admin-token-0123456789abcdef";

/// The path a user drives: `clients` concurrent HTTP clients (keep-alive)
/// each publishing one event per call to one endpoint for a while, delivered
/// by the same process to a local receiver.
pub(crate) async fn user_path(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
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
                    publish_until(&http, &base, &body, until).await
                }));
            }
            let mut sent = Vec::new();
            for t in tasks {
                sent.extend(t.await.map_err(fail)??);
            }
            let publishing = start.elapsed().as_secs_f64();
            let total = sent.len();
            let by = start + Duration::from_secs(seconds + 120);
            if !all_arrived(&seen, total, by).await {
                let got = seen.count();
                return Err(format!(
                    "user path {profile} x{clients}: {got} of {total} arrived"
                ));
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

/// Whether `seen` received `total` requests by `by`.
async fn all_arrived(seen: &Receiver, total: usize, by: Instant) -> bool {
    while seen.count() < total {
        if Instant::now() > by {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// One client of [`user_path`]: publishes `body` one event per call until
/// `until`; each event's delivery id, when its call began, and how long it
/// took (ms).
async fn publish_until(
    http: &reqwest::Client,
    base: &str,
    body: &serde_json::Value,
    until: Instant,
) -> BenchResult<Vec<(String, Instant, f64)>> {
    let mut sent: Vec<(String, Instant, f64)> = Vec::new();
    while Instant::now() < until {
        let t0 = Instant::now();
        let (s, v) = api_call(
            http,
            base,
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
    Ok(sent)
}

// ----------------------------------------------------------------- replicas

/// One backlog on postgres (on one endpoint, then spread over four) drained
/// by `control-plane worker` processes at the same total concurrency: one
/// process of 64 sends, two of 32, four of 16; with the database's own cost
/// per delivery (commits, WAL bytes) over each run, which must not grow with
/// the number of processes.
pub(crate) async fn replicas(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let total: usize = if a.quick { 1_000 } else { 20_000 };
    let mut out = String::from(
        "| endpoints | worker processes | sends in flight each | deliveries/s after the first 5 % arrived (median of the runs) | vs 1 process | database per delivery in the last run: commits / WAL bytes |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    let spreads: &[usize] = if a.quick { &[1] } else { &[1, 4] };
    for &endpoints in spreads {
        let mut one = None;
        for (procs, each) in [(1usize, 64usize), (2, 32), (4, 16)] {
            let last = std::cell::Cell::new((0.0, 0.0));
            let rate = repeat(a.runs, || async {
                let (rate, cost) = replica_run(a, dir, endpoints, procs, each, total).await?;
                last.set(cost);
                Ok(rate)
            })
            .await?;
            let cost = last.get();
            let base = *one.get_or_insert(rate);
            let _ = writeln!(
                out,
                "| {endpoints} | {procs} | {each} | {rate:.0} | {:.2} | {:.3} / {:.0} |",
                rate / base,
                cost.0,
                cost.1
            );
            eprintln!(
                "bench: replicas {endpoints} endpoints, {procs} x {each}: {rate:.0}/s, {:.3} commits and {:.0} WAL bytes per delivery",
                cost.0, cost.1
            );
        }
    }
    Ok(out)
}

/// One replicas run: deliveries/s once the first 5 % arrived, and the
/// database's commits and WAL bytes per delivery over the whole drain.
async fn replica_run(
    a: &Args,
    dir: &std::path::Path,
    endpoints: usize,
    procs: usize,
    each: usize,
    total: usize,
) -> BenchResult<(f64, (f64, f64))> {
    let schema = unique("bench_replicas");
    let store = pg_store(&a.url, &schema, 2, false).await?;
    let (url, seen) = receiver(Duration::ZERO).await?;
    for _ in 0..endpoints {
        let e = endpoint(&store, &url).await?;
        pg_prefill(&a.url, &schema, &e, total / endpoints).await?;
    }
    let before = crate::queue::DbCost::read(&a.url).await?;
    let began = Instant::now();
    let mut children = Vec::new();
    for i in 0..procs {
        children.push(
            control_plane(a, "worker", Some(&schema))?
                .env("CONTROLPLANE_CONCURRENCY", each.to_string())
                .env("CONTROLPLANE_ENDPOINT_CONCURRENCY", "64")
                .stderr(std::fs::File::create(dir.join(format!("worker-{i}.log"))).map_err(fail)?)
                .spawn()
                .map_err(fail)?,
        );
    }
    // The clock starts once the first 5 % have arrived: the rate of running
    // processes, not of their start-up (four debug processes connecting at
    // once on two cores take a while).
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
    // Every outcome recorded (the live rows gone) before the cost is read.
    let c = raw_client(&a.url, &schema).await?;
    while c
        .query_one("SELECT count(*) FROM delivery_queue", &[])
        .await
        .map_err(fail)?
        .get::<_, i64>(0)
        > 0
    {
        if began.elapsed() > Duration::from_secs(600) {
            return Err("replicas: outcomes still unrecorded after 10 min".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for mut c in children {
        let _ = c.kill().await;
    }
    let cost = crate::queue::DbCost::read(&a.url)
        .await?
        .since(&before, total);
    drop(store);
    drop_schema(&a.url, &schema).await?;
    Ok((rate, cost))
}

// ------------------------------------------------------------------- memory

/// Bytes of each answer's body in the memory run: the dispatcher keeps
/// 4 KiB of each (`CONTROLPLANE_RESPONSE_BODY_BYTES`'s default).
pub(crate) const MEMORY_ANSWER_BYTES: usize = 4096;

/// Peak RSS of `control-plane serve` (postgres profile, so that 10,000
/// deliveries are claimed within seconds) with `n` deliveries in flight to a
/// receiver that holds every request for a while, then answers each with a
/// 4 KiB body: once with all of them open, and again after the answers (their
/// bodies kept and recorded).
pub(crate) async fn memory(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
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
    let peak_of = || peak_rss_mib(pid);
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

/// The peak resident set of process `pid` so far (`VmHWM`), in MiB; 0 when
/// it cannot be read.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}
