//! Erasure at volume (issue 57): an account holding a large finished
//! history (events, deliveries, attempts, rollups, written by SQL as in the
//! history section) and a live backlog, erased through the port in batches
//! of 1000 rows per table, as the `control-plane.erase` task runs it. A
//! batch must cost the same at the end as at the start: each statement is
//! bounded by an index led by the account or the endpoint.

use crate::{
    acct, drop_schema, endpoint, fail, history, median, pg_prefill, pg_store, raw_client, unique,
    Args, BenchResult,
};
use control_plane_core::ERASE_BATCH_ROWS;
use control_plane_core::{
    AccountId, Check, Checked, ControlPlaneStore, DeliveryListRequest, EndpointCreateRequest,
    PageRequest, PublishRequest, PurgeBatch, Secret,
};
use std::time::Instant;

/// Erases account `bench` batch by batch: (rows, batches, seconds, median
/// ms of the first ten batches, of the last ten).
async fn run(store: &dyn ControlPlaneStore) -> BenchResult<(u64, usize, f64, f64, f64)> {
    let account = acct();
    let batch = PurgeBatch::new(ERASE_BATCH_ROWS).map_err(fail)?;
    let start = Instant::now();
    store.account_erase_begin(&account).await.map_err(fail)?;
    let (mut rows, mut times) = (0u64, Vec::new());
    loop {
        let t = Instant::now();
        let n = store
            .account_erase_batch(&account, batch)
            .await
            .map_err(fail)?;
        if n == 0 {
            break;
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        rows += n;
    }
    let total = start.elapsed().as_secs_f64();
    let k = times.len().min(10);
    let first = median(times[..k].to_vec());
    let last = median(times[times.len() - k..].to_vec());
    Ok((rows, times.len(), total, first, last))
}

/// A neighbour account's events, which must all be there afterwards.
async fn neighbour(store: &dyn ControlPlaneStore) -> BenchResult<()> {
    let other = AccountId::new("neighbour").map_err(fail)?;
    let req = EndpointCreateRequest::new(
        other.clone(),
        "https://example.com/n",
        Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    );
    store
        .endpoint_create(req.checked().map_err(fail)?)
        .await
        .map_err(fail)?;
    let reqs = (0..100)
        .map(|i| PublishRequest::new(other.clone(), "n.event", serde_json::json!({"i": i})))
        .collect();
    store
        .event_publish_batch(Checked::all(reqs).map_err(fail)?)
        .await
        .map_err(fail)?;
    Ok(())
}

/// How many deliveries of the neighbour account are left.
async fn neighbour_left(store: &dyn ControlPlaneStore) -> BenchResult<usize> {
    let other = AccountId::new("neighbour").map_err(fail)?;
    let page = PageRequest::new(1000, None).map_err(fail)?;
    Ok(store
        .delivery_list(DeliveryListRequest::all(other, page))
        .await
        .map_err(fail)?
        .items
        .len())
}

fn row(profile: &str, size: i64, r: (u64, usize, f64, f64, f64), kept: usize) -> String {
    let (rows, batches, total, first, last) = r;
    format!(
        "| {profile} | {size} | {rows} | {batches} | {total:.1} | {:.0} | {first:.1} | {last:.1} | {:.2} | {kept} / 100 |\n",
        rows as f64 / total,
        last / first
    )
}

/// Erasure of an account of `--history-rows / 20` finished deliveries (a
/// quarter of that embedded) and a tenth as many pending, on both adapters.
pub(crate) async fn erase(a: &Args, dir: &std::path::Path) -> BenchResult<String> {
    let size: i64 = if a.quick { 20_000 } else { a.history_rows / 20 };
    let mut out = String::from(
        "| profile | finished deliveries | rows removed | batches | seconds | rows/s | first 10 batches, median ms | last 10, median ms | last / first | neighbour's deliveries kept |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    {
        let schema = unique("bench_erase");
        let store = pg_store(&a.url, &schema, 4, false).await?;
        let e = endpoint(&store, "https://example.com/hook").await?;
        history::pg_history(&raw_client(&a.url, &schema).await?, e.id, size).await?;
        pg_prefill(
            &a.url,
            &schema,
            &e,
            usize::try_from(size / 10).map_err(fail)?,
        )
        .await?;
        neighbour(&store).await?;
        let r = run(&store).await?;
        let kept = neighbour_left(&store).await?;
        eprintln!("bench: erase postgres {r:?}, neighbour kept {kept}");
        out.push_str(&row("postgres", size, r, kept));
        drop(store);
        drop_schema(&a.url, &schema).await?;
    }
    {
        let size = size / 4;
        let (store, _, dir) = history::embedded_with_history(dir, "erase", size).await?;
        neighbour(&store).await?;
        let r = run(&store).await?;
        let kept = neighbour_left(&store).await?;
        eprintln!("bench: erase embedded {r:?}, neighbour kept {kept}");
        out.push_str(&row("embedded", size, r, kept));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(out)
}
