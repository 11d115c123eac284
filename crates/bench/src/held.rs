//! Held work stays free (issue 54): publishes and claims of a healthy
//! endpoint with no other work, and beside a disabled endpoint holding a
//! large backlog, alternated in fresh stores, on both adapters. In a debug
//! build this also shows what a newcomer's `cargo run` pays for held work.

use crate::queue::open_profile;
use crate::{acct, delivered, drop_schema, fail, flow_endpoint, median, Args, BenchResult};
use control_plane_core::{
    Check, Checked, ClaimRequest, DynControlPlaneStore, Enablement, EndpointId, PublishRequest,
};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const PUBLISHERS: usize = 8;

/// One run: (publishes/s, completions/s) of the healthy endpoint while
/// `held` deliveries wait on a disabled one, and how long the store's first
/// claim took (ms). That claim comes before the timed window: on the
/// embedded store it builds the live index (ADR 0028) from every live row,
/// held ones included, once per opening, which is not the steady state the
/// rates measure.
async fn run_once(
    a: &Args,
    profile: &str,
    dir: &std::path::Path,
    held: usize,
) -> BenchResult<(f64, f64, f64)> {
    let (store, schema) = open_profile(a, profile, dir).await?;
    flow_endpoint(
        store.as_ref(),
        "https://example.com/live",
        &["live.t"],
        Some(10_000),
    )
    .await?;
    let parked = flow_endpoint(
        store.as_ref(),
        "https://example.com/held",
        &["held.t"],
        None,
    )
    .await?;
    store
        .endpoint_set_enabled(
            control_plane_core::EndpointKey::new(&acct(), parked.id),
            Enablement::Disabled {
                reason: Some("bench: held work".into()),
            },
        )
        .await
        .map_err(fail)?;
    for start in (0..held).step_by(500) {
        let reqs = (start..held.min(start + 500))
            .map(|i| PublishRequest::new(acct(), "held.t", serde_json::json!({ "i": i })))
            .collect();
        store
            .event_publish_batch(Checked::all(reqs).map_err(fail)?)
            .await
            .map_err(fail)?;
    }
    let first = Instant::now();
    let got = store
        .delivery_claim(ClaimRequest::new("held", 1, Duration::from_secs(60)).map_err(fail)?)
        .await
        .map_err(fail)?;
    let first_ms = first.elapsed().as_secs_f64() * 1000.0;
    if !got.is_empty() {
        return Err("the first claim found work before any was published".into());
    }
    let seconds = if a.quick { 1 } else { 5 };
    let start = Instant::now();
    let (published, completed) =
        drive(&store, parked.id, start + Duration::from_secs(seconds)).await?;
    let took = start.elapsed().as_secs_f64();
    drop(store);
    if let Some(s) = schema {
        drop_schema(&a.url, &s).await?;
    }
    Ok((published as f64 / took, completed as f64 / took, first_ms))
}

/// Publishers of the healthy endpoint and one claimer until `until`: how
/// many events were published and deliveries completed.
async fn drive(
    store: &DynControlPlaneStore,
    parked: EndpointId,
    until: Instant,
) -> BenchResult<(u64, u64)> {
    let mut publishers = Vec::new();
    for _ in 0..PUBLISHERS {
        let store = store.clone();
        publishers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let req = PublishRequest::new(acct(), "live.t", serde_json::json!({"ok": true}));
                store
                    .event_publish(req.checked().map_err(fail)?)
                    .await
                    .map_err(fail)?;
                n += 1;
            }
            Ok::<_, String>(n)
        }));
    }
    let claimer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let got = store
                    .delivery_claim(
                        ClaimRequest::new("held", 100, Duration::from_secs(60)).map_err(fail)?,
                    )
                    .await
                    .map_err(fail)?;
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                for g in got {
                    if g.delivery.endpoint_id == parked {
                        return Err("a held delivery was claimed".to_string());
                    }
                    store
                        .delivery_record_outcome(&g.lease, delivered())
                        .await
                        .map_err(fail)?;
                    n += 1;
                }
            }
            Ok::<_, String>(n)
        })
    };
    let mut published = 0;
    for p in publishers {
        published += p.await.map_err(fail)??;
    }
    let completed = claimer.await.map_err(fail)??;
    Ok((published, completed))
}

/// The table: per adapter, the median rates with and without held work
/// (rounds alternate), and their ratio.
pub(crate) async fn held_work(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let held = if a.quick { 5_000 } else { a.held_rows };
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut out = format!(
        "{build} build; {PUBLISHERS} publishers and one claimer of the healthy endpoint (claims of 100, each outcome recorded), {} s a run, {} runs alternated\n\n| adapter | held deliveries | publishes/s | completions/s | publishes vs none | completions vs none | first claim after opening (ms, before the timed window) |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        if a.quick { 1 } else { 5 },
        a.runs
    );
    for &profile in &a.profiles {
        let mut rates = [
            (Vec::new(), Vec::new(), Vec::new()),
            (Vec::new(), Vec::new(), Vec::new()),
        ];
        for _ in 0..a.runs {
            for (i, n) in [0, held].into_iter().enumerate() {
                let (p, c, first) = run_once(a, profile, dir, n).await?;
                rates[i].0.push(p);
                rates[i].1.push(c);
                rates[i].2.push(first);
            }
        }
        let none = (median(rates[0].0.clone()), median(rates[0].1.clone()));
        for (i, n) in [0, held].into_iter().enumerate() {
            let (p, c) = (median(rates[i].0.clone()), median(rates[i].1.clone()));
            let first = median(rates[i].2.clone());
            let _ = writeln!(
                out,
                "| {profile} | {n} | {p:.0} | {c:.0} | {:.2} | {:.2} | {first:.1} |",
                p / none.0,
                c / none.1.max(0.001)
            );
            eprintln!("bench: held {profile} {n}: {p:.0} publishes/s, {c:.0} completions/s");
        }
    }
    Ok(out)
}
