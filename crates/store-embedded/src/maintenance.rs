//! Retention: purging old rows in small batches.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::*;
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;

/// One small batch per table. The embedded store has one writer, so the
/// batch bounds how long that writer is busy.
pub(crate) fn purge(t: &mut Tx<'_>, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
    control_plane_core::maintenance::validate_purge_batch(batch)?;
    let cutoff = t.now.minus(retention).as_millis();
    let n = i64::from(batch);
    let deliveries = t
        .execute(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state = 'delivered' \
             AND updated_at <= $1 ORDER BY updated_at LIMIT $2)",
            params![cutoff, n],
        )
        .db()?;
    let attempts = t
        .execute(
            "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE recorded_at <= $1 ORDER BY recorded_at, id LIMIT $2)",
            params![cutoff, n],
        )
        .db()?;
    let idempotency_records = t
        .execute(
            "DELETE FROM idempotency WHERE (scope, key) IN (SELECT (scope, key) FROM idempotency WHERE expires_at <= $1 LIMIT $2)",
            params![t.now.as_millis(), n],
        )
        .db()?;
    Ok(PurgeReport {
        deliveries: deliveries as u64,
        attempts: attempts as u64,
        idempotency_records: idempotency_records as u64,
    })
}

#[async_trait]
impl MaintenanceStore for EmbeddedStore {
    async fn maintenance_purge(&self, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
        self.tx(move |t| purge(t, retention, batch)).await
    }
}
