//! Erasing an account ([`control_plane_core::erasure`]): the use case the
//! `control-plane.erase` task runs, over the port.

use control_plane_core::erasure::{ErasureProgress, ERASE_BATCH_ROWS};
use control_plane_core::{AccountId, ControlPlaneStore, PurgeBatch, StoreResult};

/// Erases `account`: begins again (a key made since the request is revoked
/// too), then runs batches until one removes nothing, reporting after each;
/// a run cut short goes on `from` its last report.
///
/// # Errors
/// The store's; the batches committed before stay done.
pub async fn erase(
    store: &dyn ControlPlaneStore,
    account: &AccountId,
    from: Option<ErasureProgress>,
    mut report: impl FnMut(&ErasureProgress) + Send,
) -> StoreResult<ErasureProgress> {
    store.account_erase_begin(account).await?;
    let batch = PurgeBatch::new(ERASE_BATCH_ROWS)?;
    let mut at = from.unwrap_or_default();
    loop {
        let removed = store.account_erase_batch(account, batch).await?;
        if removed == 0 {
            at.done = true;
            return Ok(at);
        }
        at.rows_removed += removed;
        at.batches += 1;
        report(&at);
    }
}
