//! What the publish-time checks cost: publishes through the port with no
//! check, with a filter on each of ten endpoints, and with a registered
//! 30-property schema, alternated in fresh stores, the same 2 KiB payload
//! (which passes every check, so each publish writes ten deliveries).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use control_plane_core::Check as _;
use control_plane_core::{
    EndpointCreateRequest, EventFilter, EventTypePut, PublishRequest, Secret,
};
use serde_json::{json, Map, Value};

use crate::queue::open_profile;
use crate::{acct, drop_schema, fail, median, percentile, Args, BenchResult};

const ENDPOINTS: usize = 10;
const PUBLISHERS: usize = 16;
const TYPE: &str = "bench.checked";

#[derive(Clone, Copy, PartialEq)]
enum Check {
    None,
    Filter,
    Schema,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::None => "no check",
            Check::Filter => "a filter on each of 10 endpoints",
            Check::Schema => "a 30-property schema",
        }
    }
}

/// 29 strings of 64 characters and an amount: about 2.2 KiB of JSON.
fn payload() -> Value {
    let mut m = Map::new();
    for i in 0..29 {
        m.insert(format!("p{i:02}"), json!("x".repeat(64)));
    }
    m.insert("amount".into(), json!(150));
    Value::Object(m)
}

fn schema() -> Value {
    let mut props = Map::new();
    for i in 0..29 {
        props.insert(
            format!("p{i:02}"),
            json!({"type": "string", "maxLength": 100}),
        );
    }
    props.insert("amount".into(), json!({"type": "integer", "minimum": 0}));
    let required: Vec<&String> = props.keys().collect();
    json!({"type": "object", "required": required, "properties": props, "additionalProperties": false})
}

/// One run: events/s and every publish's latency (ms).
async fn run_once(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
    check: Check,
) -> BenchResult<(f64, Vec<f64>)> {
    let (store, schema_name) = open_profile(a, profile, dir).await?;
    for _ in 0..ENDPOINTS {
        let mut req = EndpointCreateRequest::new(
            acct(),
            "http://127.0.0.1:9/hook",
            Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        );
        if check == Check::Filter {
            req.filter =
                Some(EventFilter::parse(json!({"data.amount": {"$gte": 100}})).map_err(fail)?);
        }
        store
            .endpoint_create(req.checked().map_err(fail)?)
            .await
            .map_err(fail)?;
    }
    if check == Check::Schema {
        let put = EventTypePut {
            schema: Some(schema()),
            ..EventTypePut::new(acct(), TYPE, "bench")
        };
        store
            .event_type_put(put.checked().map_err(fail)?)
            .await
            .map_err(fail)?;
    }
    let seconds = if a.quick { 1 } else { 5 };
    let until = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PUBLISHERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            while Instant::now() < until {
                let t0 = Instant::now();
                let p = store
                    .event_publish(
                        PublishRequest::new(acct(), TYPE, payload())
                            .checked()
                            .map_err(fail)?,
                    )
                    .await
                    .map_err(fail)?;
                if p.deliveries.len() != ENDPOINTS {
                    return Err(format!(
                        "{} deliveries, not {ENDPOINTS}",
                        p.deliveries.len()
                    ));
                }
                took.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, String>(took)
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await.map_err(fail)??);
    }
    let rate = took.len() as f64 / start.elapsed().as_secs_f64();
    drop(store);
    if let Some(s) = schema_name {
        drop_schema(&a.url, &s).await?;
    }
    Ok((rate, took))
}

/// The table: per adapter and check, the median rate of the runs (rounds
/// alternate the three checks), its ratio to no check, and the latency
/// percentiles over every run's publishes.
pub(crate) async fn publish_checks(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let mut out = String::new();
    // The schema check alone, in this process: what validation costs one
    // publish before any store is involved.
    let compiled = control_plane_core::compile_schema(&schema().to_string()).map_err(fail)?;
    let body = payload();
    compiled.check(TYPE, &body).map_err(fail)?;
    let mut each = Vec::new();
    for _ in 0..if a.quick { 100 } else { 10_000 } {
        let t0 = Instant::now();
        compiled.check(TYPE, &body).map_err(fail)?;
        each.push(t0.elapsed().as_secs_f64() * 1_000_000.0);
    }
    let _ = writeln!(
        out,
        "The schema check alone (compiled schema cached, one thread): p50 {:.1} µs, p99 {:.1} µs per publish.\n",
        percentile(&mut each, 0.5),
        percentile(&mut each, 0.99),
    );
    out.push_str(
        "| adapter | check | events/s (median) | vs no check | publish p50 (ms) | publish p99 (ms) |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    let checks = [Check::None, Check::Filter, Check::Schema];
    for &profile in &a.profiles {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); checks.len()];
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); checks.len()];
        for _ in 0..a.runs {
            for (i, &c) in checks.iter().enumerate() {
                let (rate, took) = run_once(a, profile, dir, c).await?;
                rates[i].push(rate);
                times[i].extend(took);
            }
        }
        let base = median(rates[0].clone());
        for (i, &c) in checks.iter().enumerate() {
            let rate = median(rates[i].clone());
            let _ = writeln!(
                out,
                "| {profile} | {} | {rate:.0} | {:.2} | {:.2} | {:.2} |",
                c.name(),
                rate / base,
                percentile(&mut times[i], 0.5),
                percentile(&mut times[i], 0.99),
            );
            eprintln!("bench: checks {profile} {}: {rate:.0} events/s", c.name());
        }
    }
    Ok(out)
}
