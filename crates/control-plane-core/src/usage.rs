//! Usage counters in hourly windows (the meter that feeds them is
//! `control_plane_runtime::UsageMeter`).

use std::time::Duration;

use crate::{AccountId, Timestamp};

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
