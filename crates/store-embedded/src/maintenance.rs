//! Retention: purging old rows in small batches.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::maintenance::Purged;
use control_plane_core::*;
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;

/// One statement per kind of row: at most `$2` rows at or before the cutoff `$1`.
const PURGES: &[(Purged, &str)] = &[
    (
        Purged::Deliveries,
        "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state = 'delivered' \
         AND updated_at <= $1 ORDER BY updated_at LIMIT $2)",
    ),
    (
        Purged::Deliveries,
        "DELETE FROM deliveries WHERE id IN (SELECT d.id FROM deliveries d JOIN endpoints e \
         ON e.id = d.endpoint_id WHERE e.deleted_at IS NOT NULL AND d.state = 'dead' \
         AND d.updated_at <= $1 LIMIT $2)",
    ),
    (
        Purged::Attempts,
        "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE recorded_at <= $1 \
         ORDER BY recorded_at, id LIMIT $2)",
    ),
    (
        Purged::Events,
        "DELETE FROM events WHERE id IN (SELECT e.id FROM events e WHERE e.created_at <= $1 \
         AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id) ORDER BY e.created_at LIMIT $2)",
    ),
    (
        Purged::Tasks,
        "DELETE FROM tasks WHERE (account, id) IN (SELECT (account, id) FROM tasks \
         WHERE state = 'completed' AND updated_at <= $1 ORDER BY updated_at LIMIT $2)",
    ),
    (
        Purged::Alerts,
        "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts WHERE created_at <= $1 ORDER BY id LIMIT $2)",
    ),
    (
        Purged::UsageWindows,
        "DELETE FROM usage_counters WHERE (account, metric, window_start) IN \
         (SELECT (account, metric, window_start) FROM usage_counters WHERE window_start <= $1 LIMIT $2)",
    ),
    (
        Purged::UsageBatches,
        "DELETE FROM usage_batches WHERE batch_id IN \
         (SELECT batch_id FROM usage_batches WHERE recorded_at <= $1 LIMIT $2)",
    ),
    (
        Purged::IdempotencyRecords,
        "DELETE FROM idempotency WHERE (scope, key) IN \
         (SELECT (scope, key) FROM idempotency WHERE expires_at <= $1 LIMIT $2)",
    ),
    (
        Purged::PreviousSecrets,
        "UPDATE endpoints SET previous_secret = NULL, previous_expires_at = NULL WHERE id IN \
         (SELECT id FROM endpoints WHERE previous_expires_at <= $1 LIMIT $2)",
    ),
    (
        Purged::Sessions,
        "DELETE FROM sessions WHERE id_hash IN \
         (SELECT id_hash FROM sessions WHERE expires_at <= $1 LIMIT $2)",
    ),
];

/// One small batch per table. The embedded store has one writer, so the
/// batch bounds how long that writer is busy.
pub(crate) fn purge(
    t: &mut Tx<'_>,
    retention: Duration,
    batch: PurgeBatch,
) -> StoreResult<PurgeReport> {
    let mut report = PurgeReport::default();
    for (what, sql) in PURGES {
        let n = t
            .execute(
                sql,
                params![what.cutoff(t.now, retention), i64::from(batch.rows())],
            )
            .db()?;
        report.count(*what, n as u64);
        if matches!(what, Purged::PreviousSecrets) && n > 0 {
            t.senders.clear();
        }
    }
    Ok(report)
}

#[async_trait]
impl MaintenanceStore for EmbeddedStore {
    async fn maintenance_purge(
        &self,
        retention: Duration,
        batch: PurgeBatch,
    ) -> StoreResult<PurgeReport> {
        self.work_tx(move |t| purge(t, retention, batch)).await
    }
}
