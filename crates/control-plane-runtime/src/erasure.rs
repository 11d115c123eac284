//! Erasing an account: the use case ([`erase`]) and, so that it can be
//! read from here, where each of its parts lives.
//!
//! - Asked for by the admin with `DELETE /v1/accounts/{account}`
//!   (`crates/api/src/routes/admin.rs`), which queues a task of kind
//!   [`control_plane_core::ERASE_TASK`]; only the service may queue that kind.
//! - Run by that task, which the binary registers
//!   (`crates/control-plane/src/tasks.rs`, `register_erase`): it calls
//!   [`erase`] and keeps its [`ErasureProgress`] as the task's progress.
//! - Over the port's [`control_plane_core::ErasureStore`]: `account_erase_begin` shuts the
//!   account's doors, `account_erase_batch` removes its rows; each
//!   adapter implements both in its own `erasure.rs`, and nothing else.
//! - Held by the contract `erasing_an_account_removes_its_rows_and_no_others`
//!   (`crates/control-plane-conformance/src/contracts/retention.rs`).

use std::time::Duration;

use control_plane_core::{
    AccountId, ControlPlaneStore, ErasureProgress, PurgeBatch, StoreResult, ERASE_BATCH_ROWS,
};

/// How long after its start an erasure keeps going: every process writes
/// the usage it metered at least every second (`usage_loop`), so usage
/// counted just before the account's doors shut reaches the store within
/// this and is erased too, instead of landing after the erasure is done.
pub const USAGE_SETTLE: Duration = Duration::from_secs(3);

/// Erases `account`: begins again (a key made since the request is revoked
/// too), then runs batches until one removes nothing, reporting after each,
/// and at least until [`USAGE_SETTLE`] after its start; a run cut short
/// goes on `from` its last report.
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
    let started = tokio::time::Instant::now();
    let batch = PurgeBatch::new(ERASE_BATCH_ROWS)?;
    let mut at = from.unwrap_or_default();
    loop {
        let removed = store.account_erase_batch(account, batch).await?;
        if removed == 0 {
            let settled = started.elapsed();
            if settled < USAGE_SETTLE {
                // Usage metered before the start may still be on its way.
                tokio::time::sleep(USAGE_SETTLE - settled).await;
                continue;
            }
            at.done = true;
            return Ok(at);
        }
        at.rows_removed += removed;
        at.batches += 1;
        report(&at);
    }
}
