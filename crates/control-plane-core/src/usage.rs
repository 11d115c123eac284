//! Usage counters in hourly windows, and the meter that feeds them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::*;

named_enum! {
    /// A usage metric.
    pub enum UsageMetric ("usage metric") {
        /// Events published.
        EventsPublished = "events_published",
        /// Delivery attempts made.
        Attempts = "attempts",
        /// Request bytes sent.
        BytesSent = "bytes_sent",
    }
}

/// Usage is counted in windows of this length (one hour).
pub const USAGE_WINDOW: Duration = Duration::from_secs(3600);

/// The start of the usage window holding `t`.
pub fn usage_window(t: Timestamp) -> Timestamp {
    let w = USAGE_WINDOW.as_millis() as i64;
    Timestamp::from_millis(t.as_millis().div_euclid(w) * w)
}

/// One counter increment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageEntry {
    /// Account.
    pub account: AccountId,
    /// Metric.
    pub metric: UsageMetric,
    /// When it happened.
    pub at: Timestamp,
    /// How much.
    pub amount: u64,
}

/// A batch of increments, recorded once whatever the number of retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageBatch {
    /// Idempotency id, 1 to 255 characters.
    pub batch_id: String,
    /// The increments.
    pub entries: Vec<UsageEntry>,
}

impl crate::Check for UsageBatch {
    fn check(&self) -> Result<(), crate::StoreError> {
        crate::validate_short_text("usage batch id", &self.batch_id)
    }
}

impl UsageBatch {
    /// The batch summed per (account, metric, window start), so that
    /// recording it writes each counter row once.
    pub fn totals(&self) -> Vec<(AccountId, UsageMetric, Timestamp, i64)> {
        let mut sums: std::collections::BTreeMap<(AccountId, UsageMetric, Timestamp), i64> =
            std::collections::BTreeMap::new();
        for e in &self.entries {
            let amount = i64::try_from(e.amount).unwrap_or(i64::MAX);
            let sum = sums
                .entry((e.account.clone(), e.metric, usage_window(e.at)))
                .or_default();
            *sum = sum.saturating_add(amount);
        }
        sums.into_iter()
            .map(|((a, m, w), n)| (a, m, w, n))
            .collect()
    }
}

/// One window's total of one metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRow {
    /// Metric.
    pub metric: UsageMetric,
    /// Window start.
    pub window_start: Timestamp,
    /// Total.
    pub amount: u64,
}

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
        let recorded = match crate::Check::checked(batch.clone()) {
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
