//! Maintenance driven by a single-flight tick.

use std::time::Duration;

use crate::error::{StoreError, StoreResult};
use crate::store::ControlPlaneStore;

/// The tick maintenance runs under.
pub const MAINTENANCE_TICK: &str = "maintenance";

/// Runs one maintenance pass if no replica ran one in the last `every`:
/// claims the tick, purges in batches of `batch` until a batch finds nothing
/// (at most 1,000 batches), stores the report as the tick's state and frees
/// the tick. `None` when another replica holds it or it is not due.
///
/// # Errors
/// What the store returns; the tick then expires after its lease.
pub async fn run_maintenance(
    store: &dyn ControlPlaneStore,
    retention: Duration,
    batch: u32,
    every: Duration,
) -> StoreResult<Option<PurgeReport>> {
    let Some(lease) = store
        .tick_claim(MAINTENANCE_TICK, Duration::from_secs(300), every)
        .await?
    else {
        return Ok(None);
    };
    let mut total = PurgeReport::default();
    for _ in 0..1000 {
        let r = store.maintenance_purge(retention, batch).await?;
        total.deliveries += r.deliveries;
        total.attempts += r.attempts;
        total.idempotency_records += r.idempotency_records;
        if r.total() == 0 {
            break;
        }
    }
    let state = serde_json::json!({
        "deliveries": total.deliveries,
        "attempts": total.attempts,
        "idempotency_records": total.idempotency_records,
    });
    store.tick_complete(&lease, state).await?;
    Ok(Some(total))
}

/// Checks a purge batch size: 1 to 10,000 rows per table and call.
pub fn validate_purge_batch(batch: u32) -> StoreResult<()> {
    if !(1..=10_000).contains(&batch) {
        return Err(StoreError::InvalidInput(format!(
            "purge batch must be 1 to 10000, got {batch}"
        )));
    }
    Ok(())
}

/// Rows removed by one maintenance batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Delivered deliveries older than the retention.
    pub deliveries: u64,
    /// Attempt-log rows older than the retention.
    pub attempts: u64,
    /// Expired idempotency records.
    pub idempotency_records: u64,
}

impl PurgeReport {
    /// Total rows removed.
    pub fn total(&self) -> u64 {
        self.deliveries + self.attempts + self.idempotency_records
    }
}
