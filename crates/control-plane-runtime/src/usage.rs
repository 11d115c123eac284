//! The usage meter: accumulates per-account usage in memory and writes it
//! as usage batches ([`control_plane_core::UsageStore`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use control_plane_core::{
    AccountId, Check, StoreResult, Timestamp, UsageBatch, UsageEntry, UsageMetric, UsageStore,
};

/// Accumulates per-account usage in memory and writes it as usage batches.
///
/// A batch that fails to record is kept and retried under the same batch id,
/// so a retry never counts twice; a crash loses what was not yet flushed
/// (at most one flush interval).
#[derive(Debug, Default)]
pub struct UsageMeter {
    pending: Mutex<BTreeMap<(AccountId, UsageMetric), u64>>,
    unsent: Mutex<Option<UsageBatch>>,
}

impl UsageMeter {
    /// Adds `amount` of `metric` to `account`.
    pub fn add(&self, account: &AccountId, metric: UsageMetric, amount: u64) {
        if amount == 0 {
            return;
        }
        if let Ok(mut p) = self.pending.lock() {
            *p.entry((account.clone(), metric)).or_default() += amount;
        }
    }

    /// Writes what accumulated as one batch stamped `now`; returns the number
    /// of entries written (0 when there was nothing).
    ///
    /// # Errors
    /// The store's error; the batch is kept and retried, with the same id, by
    /// the next call.
    pub async fn flush(&self, store: &dyn UsageStore, now: Timestamp) -> StoreResult<usize> {
        let batch = {
            let unsent = self.unsent.lock().ok().and_then(|mut u| u.take());
            match unsent {
                Some(b) => b,
                None => {
                    let taken = self
                        .pending
                        .lock()
                        .map(|mut p| std::mem::take(&mut *p))
                        .unwrap_or_default();
                    if taken.is_empty() {
                        return Ok(0);
                    }
                    UsageBatch {
                        batch_id: format!("meter-{}", uuid::Uuid::new_v4()),
                        entries: taken
                            .into_iter()
                            .map(|((account, metric), amount)| UsageEntry {
                                account,
                                metric,
                                at: now,
                                amount,
                            })
                            .collect(),
                    }
                }
            }
        };
        let n = batch.entries.len();
        // A batch refused by its seal is kept for the next flush, as one the
        // store refused.
        let recorded = match batch.clone().checked() {
            Ok(sealed) => store.usage_record(sealed).await,
            Err(e) => Err(e),
        };
        match recorded {
            Ok(_) => Ok(n),
            Err(e) => {
                if let Ok(mut u) = self.unsent.lock() {
                    *u = Some(batch);
                }
                Err(e)
            }
        }
    }
}
