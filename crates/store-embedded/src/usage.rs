//! Usage counters.

use async_trait::async_trait;
use control_plane_core::{
    AccountId, Checked, StoreResult, TimeRange, UsageBatch, UsageRow, UsageStore,
};
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::RowExt;

pub(crate) fn record(t: &mut Tx<'_>, batch: UsageBatch) -> StoreResult<bool> {
    let seen: i64 = t
        .query_row(
            "SELECT count(*) FROM usage_batches WHERE batch_id = $1",
            params![batch.batch_id],
            |r| r.get(0),
        )
        .db()?;
    if seen > 0 {
        return Ok(false);
    }
    t.execute(
        "INSERT INTO usage_batches VALUES ($1, $2)",
        params![batch.batch_id, t.now.as_millis()],
    )
    .db()?;
    for (account, metric, window, amount) in batch.totals() {
        let (account, metric, window) = (account.as_str(), metric.as_str(), window.as_millis());
        let updated = t
            .execute(
                "UPDATE usage_counters SET amount = amount + $1 WHERE account = $2 AND metric = $3 AND window_start = $4",
                params![amount, account, metric, window],
            )
            .db()?;
        if updated == 0 {
            t.execute(
                "INSERT INTO usage_counters VALUES ($1, $2, $3, $4)",
                params![account, metric, window, amount],
            )
            .db()?;
        }
    }
    Ok(true)
}

pub(crate) fn query(
    t: &Tx<'_>,
    account: &AccountId,
    from: control_plane_core::Timestamp,
    to: control_plane_core::Timestamp,
) -> StoreResult<Vec<UsageRow>> {
    let mut st = t
        .prepare(
            "SELECT metric, window_start, amount FROM usage_counters \
             WHERE account = $1 AND window_start >= $2 AND window_start < $3",
        )
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), from.as_millis(), to.as_millis()],
            |r| Ok((r.get::<_, String>(0)?, r.col(1)?, r.get::<_, i64>(2)?)),
        )
        .db()?;
    let mut out = Vec::new();
    for row in rows {
        let (metric, window_start, amount) = row.db()?;
        out.push(UsageRow {
            metric: metric.parse()?,
            window_start,
            amount: u64::try_from(amount).unwrap_or(0),
        });
    }
    out.sort_by_key(|r| (r.window_start, r.metric));
    Ok(out)
}

#[async_trait]
impl UsageStore for EmbeddedStore {
    async fn usage_record(&self, batch: Checked<UsageBatch>) -> StoreResult<bool> {
        let batch = batch.into_inner();
        self.work_tx(move |t| record(t, batch)).await
    }

    async fn usage_query(
        &self,
        account: &AccountId,
        range: TimeRange,
    ) -> StoreResult<Vec<UsageRow>> {
        let TimeRange { from, to } = range;
        let account = account.clone();
        self.tx(move |t| query(t, &account, from, to)).await
    }
}
