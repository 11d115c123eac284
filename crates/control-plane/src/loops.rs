//! The background loops every process runs beside its components:
//! maintenance on its single-flight tick, and the usage meter's flush.

use std::sync::Arc;
use std::time::Duration;

use control_plane_core::run_maintenance;
use control_plane_core::{Clock, DynControlPlaneStore, PurgeBatch, SystemClock};
use control_plane_runtime::UsageMeter;
use tokio_util::sync::CancellationToken;

/// Runs maintenance on its tick every minute (a single replica does the
/// work): purges finished history older than `retention`, in batches.
pub async fn maintenance_loop(
    store: DynControlPlaneStore,
    retention: Duration,
    stop: CancellationToken,
) {
    let every = Duration::from_secs(60);
    while !stop.is_cancelled() {
        match run_maintenance(store.as_ref(), retention, PurgeBatch::DEFAULT, every).await {
            Ok(Some(report)) if report.total() > 0 => {
                tracing::info!(?report, "maintenance purged finished history");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("maintenance failed: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// Writes metered usage every second until `stop`, then once more.
pub async fn usage_loop(
    store: DynControlPlaneStore,
    usage: Arc<UsageMeter>,
    stop: CancellationToken,
) {
    loop {
        let stopping = stop.is_cancelled();
        if let Err(e) = usage.flush(store.as_ref(), SystemClock.now()).await {
            tracing::warn!("usage not recorded yet (kept for the next try): {e}");
        }
        if stopping {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.cancelled() => {}
        }
    }
}
