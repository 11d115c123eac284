//! Retention: purging old rows in small batches.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::*;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

/// One batch per table, each its own short autocommit statement.
pub(crate) async fn purge(t: &Tx<'_>, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
    control_plane_core::maintenance::validate_purge_batch(batch)?;
    let cutoff = t.now.minus(retention).as_millis();
    let n = i64::from(batch);
    let deliveries = t
        .execute(
            "WITH c AS (SELECT id FROM deliveries WHERE state = 'delivered' AND updated_at <= $1 \
                        ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM deliveries d USING c WHERE d.id = c.id",
            &[&cutoff, &n],
        )
        .await
        .db()?;
    let attempts = t
        .execute(
            "WITH c AS (SELECT id FROM attempts WHERE recorded_at <= $1 ORDER BY recorded_at, id LIMIT $2) \
             DELETE FROM attempts a USING c WHERE a.id = c.id",
            &[&cutoff, &n],
        )
        .await
        .db()?;
    let idempotency_records = t
        .execute(
            "WITH c AS (SELECT scope, key FROM idempotency WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM idempotency i USING c WHERE i.scope = c.scope AND i.key = c.key",
            &[&t.now.as_millis(), &n],
        )
        .await
        .db()?;
    Ok(PurgeReport {
        deliveries,
        attempts,
        idempotency_records,
    })
}

#[async_trait]
impl MaintenanceStore for PostgresStore {
    async fn maintenance_purge(&self, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
        in_tx!(self, |t| purge(&t, retention, batch))
    }
}
