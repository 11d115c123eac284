//! Usage counters.

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{
    AccountId, Checked, StoreResult, TimeRange, Timestamp, UsageBatch, UsageRow, UsageStore,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

pub(crate) async fn record(t: &Tx<'_>, batch: UsageBatch) -> StoreResult<bool> {
    let fresh = t
        .query_opt(
            "INSERT INTO usage_batches (batch_id, recorded_at) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING batch_id",
            &[&batch.batch_id, &t.now.as_millis()],
        )
        .await
        .db()?;
    if fresh.is_none() {
        return Ok(false);
    }
    // One write per counter row, however many entries the batch holds.
    for (account, metric, window, amount) in batch.totals() {
        let (account, metric, window) = (account.as_str(), metric.as_str(), window.as_millis());
        t.execute(
            "INSERT INTO usage_counters (account, metric, window_start, amount) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (account, metric, window_start) DO UPDATE SET amount = usage_counters.amount + EXCLUDED.amount",
            &[&account, &metric, &window, &amount],
        )
        .await
        .db()?;
    }
    Ok(true)
}

pub(crate) async fn query(
    t: &Tx<'_>,
    account: &AccountId,
    from: Timestamp,
    to: Timestamp,
) -> StoreResult<Vec<UsageRow>> {
    let rows = t
        .query(
            "SELECT metric, window_start, amount FROM usage_counters \
             WHERE account = $1 AND window_start >= $2 AND window_start < $3 ORDER BY window_start, metric",
            &[&account.as_str(), &from.as_millis(), &to.as_millis()],
        )
        .await
        .db()?;
    let mut out: Vec<UsageRow> = rows
        .iter()
        .map(|r| {
            Ok(UsageRow {
                metric: r.col(0)?,
                window_start: r.col(1)?,
                amount: r.col(2)?,
            })
        })
        .collect::<StoreResult<_>>()?;
    out.sort_by_key(|r| (r.window_start, r.metric));
    Ok(out)
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn usage_record(&self, batch: Checked<UsageBatch>) -> StoreResult<bool> {
        let batch = batch.into_inner();
        in_tx!(self, |t| record(&t, batch))
    }

    async fn usage_query(
        &self,
        account: &AccountId,
        range: TimeRange,
    ) -> StoreResult<Vec<UsageRow>> {
        let TimeRange { from, to } = range;
        in_tx!(self, |t| query(&t, account, from, to))
    }
}
