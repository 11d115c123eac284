//! Erasure of an account (`DELETE /v1/accounts/{account}`): its keys and
//! dashboard sessions are revoked and its endpoints disabled at once
//! ([`crate::MaintenanceStore::account_erase_begin`]), then every row it
//! owns goes in bounded batches ([`crate::MaintenanceStore::account_erase_batch`]),
//! run by [`erase`] as a resumable workflow task of kind [`ERASE_TASK`].

use serde::{Deserialize, Serialize};

use crate::{AccountId, ControlPlaneStore, PurgeBatch, StoreResult};

/// The workflow task kind of an erasure; its task is the one row of the
/// account that the erasure keeps, so that its progress and result stay
/// readable.
pub const ERASE_TASK: &str = "control-plane.erase";

/// What the start of an erasure did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureBegun {
    /// Account keys revoked.
    pub keys_revoked: u64,
    /// Dashboard sessions signed in with those keys, ended.
    pub sessions_ended: u64,
    /// Endpoints disabled, so that nothing more is sent.
    pub endpoints_disabled: u64,
}

/// How far an erasure has got: the task's progress, and its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasureProgress {
    /// Rows removed so far.
    pub rows_removed: u64,
    /// Batches run so far.
    pub batches: u64,
    /// Whether nothing of the account is left.
    pub done: bool,
}

/// Rows one erasure batch removes at most, per table.
pub const ERASE_BATCH_ROWS: u32 = 1000;

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
