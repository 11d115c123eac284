//! Claim and attempt-log latency with a small and a large history (postgres).

use crate::{
    acct, delivered, drop_schema, endpoint, fail, median, now_ms, pg_store, prefill, raw_client,
    unique, Args, BenchResult,
};
use control_plane_core::{AttemptLogStore, AttemptQuery, ClaimRequest, DeliveryStore, PageRequest};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Claim latency and attempt-log listing latency with small and large
/// delivered history (postgres; history inserted with `generate_series`).
pub(crate) async fn growth(a: &Args) -> BenchResult<String> {
    let sizes: [i64; 2] = if a.quick {
        [1_000, 10_000]
    } else {
        [10_000, a.growth_rows]
    };
    let mut out = String::from(
        "| history rows | claim of 1 due delivery, median (ms) | attempt-log page of 50, median (ms) |\n| --- | --- | --- |\n",
    );
    let mut claims = Vec::new();
    let mut lists = Vec::new();
    for size in sizes {
        let schema = unique("bench_growth");
        let store = pg_store(&a.url, &schema, 4, false).await?;
        let e = endpoint(&store, "https://example.com/hook").await?;
        let c = raw_client(&a.url, &schema).await?;
        let now = now_ms();
        c.execute(
            "WITH ev AS (INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
             SELECT gen_random_uuid(), 'bench', 'old', '{}', NULL, $2 FROM generate_series(1, $3::bigint) \
             RETURNING id), \
             d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
             SELECT gen_random_uuid(), 'bench', $1, ev.id, -row_number() OVER (), $2 FROM ev RETURNING id) \
             INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, finished_at) \
             SELECT id, 'delivered', 1, 8, $2, $2 FROM d",
            &[&e.id.0, &now, &size],
        )
        .await
        .map_err(fail)?;
        c.execute(
            "INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, latency_ms, \
             will_retry, next_attempt_at, recorded_at) SELECT gen_random_uuid(), $1, 'bench', 1, 'delivered', 200, \
             NULL, 1, false, NULL, $2 FROM generate_series(1, $3::bigint) g",
            &[&e.id.0, &now, &size],
        )
        .await
        .map_err(fail)?;
        c.batch_execute("ANALYZE").await.map_err(fail)?;
        let rounds = if a.quick { 20 } else { 200 };
        let mut claim_ms = Vec::new();
        let mut list_ms = Vec::new();
        for _ in 0..rounds {
            prefill(&store, 1).await?;
            let t = Instant::now();
            let got = store
                .delivery_claim(ClaimRequest::new("g", 1, Duration::from_secs(60)).map_err(fail)?)
                .await
                .map_err(fail)?;
            claim_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            for g in got {
                store
                    .delivery_record_outcome(&g.lease, delivered())
                    .await
                    .map_err(fail)?;
            }
            let t = Instant::now();
            store
                .attempt_search(AttemptQuery::new(acct(), PageRequest::first(50)).of_endpoint(e.id))
                .await
                .map_err(fail)?;
            list_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (cm, lm) = (median(claim_ms), median(list_ms));
        claims.push(cm);
        lists.push(lm);
        let _ = writeln!(out, "| {size} | {cm:.2} | {lm:.2} |");
        eprintln!("bench: growth {size}: claim {cm:.2} ms, list {lm:.2} ms");
        drop(store);
        drop_schema(&a.url, &schema).await?;
    }
    let _ = writeln!(
        out,
        "| ratio large / small | {:.2} | {:.2} |",
        claims[1] / claims[0],
        lists[1] / lists[0]
    );
    Ok(out)
}
