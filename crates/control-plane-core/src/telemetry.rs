//! Process-wide counters shared by the dispatcher (which records) and the
//! API (which renders them for Prometheus), and the usage meter that turns
//! per-account activity into idempotent usage batches.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::StoreResult;
use crate::store::UsageStore;
use crate::AccountId;
use crate::{UsageBatch, UsageEntry, UsageMetric};

/// The attempt results counted, as [`crate::DeliveryOutcome::kind`] names them.
pub const ATTEMPT_RESULTS: [&str; 4] = ["delivered", "retry", "give_up", "gone"];

/// Upper bounds (seconds) of the attempt-duration histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counters of this process's delivery attempts.
#[derive(Debug, Default)]
pub struct Telemetry {
    attempts: [AtomicU64; 4],
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Telemetry {
    /// Counts one attempt with its result kind and how long the request took.
    pub fn record_attempt(&self, kind: &str, took: Duration) {
        if let Some(i) = ATTEMPT_RESULTS.iter().position(|k| *k == kind) {
            self.attempts[i].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Attempts counted with result `kind`.
    pub fn attempts(&self, kind: &str) -> u64 {
        ATTEMPT_RESULTS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.attempts[i].load(Ordering::Relaxed))
    }

    /// Appends the attempt counters and the duration histogram in the
    /// Prometheus text format.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP controlplane_attempts_total Delivery attempts by result.\n");
        out.push_str("# TYPE controlplane_attempts_total counter\n");
        for (i, kind) in ATTEMPT_RESULTS.iter().enumerate() {
            let n = self.attempts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "controlplane_attempts_total{{result=\"{kind}\"}} {n}");
        }
        out.push_str(
            "# HELP controlplane_delivery_duration_seconds Time from sending a webhook to its answer.\n",
        );
        out.push_str("# TYPE controlplane_delivery_duration_seconds histogram\n");
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "controlplane_delivery_duration_seconds_bucket{{le=\"{bound}\"}} {n}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "controlplane_delivery_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(out, "controlplane_delivery_duration_seconds_sum {sum}");
        let _ = writeln!(out, "controlplane_delivery_duration_seconds_count {count}");
    }
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
        match store.usage_record(batch.clone()).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_and_histogram_render_in_prometheus_format() {
        let t = Telemetry::default();
        t.record_attempt("delivered", Duration::from_millis(3));
        t.record_attempt("delivered", Duration::from_millis(300));
        t.record_attempt("retry", Duration::from_secs(40));
        t.record_attempt("unknown", Duration::from_millis(1));
        let mut out = String::new();
        t.render(&mut out);
        assert!(out.contains("controlplane_attempts_total{result=\"delivered\"} 2\n"));
        assert!(out.contains("controlplane_attempts_total{result=\"retry\"} 1\n"));
        assert!(out.contains("controlplane_delivery_duration_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(out.contains("controlplane_delivery_duration_seconds_bucket{le=\"0.5\"} 3\n"));
        assert!(out.contains("controlplane_delivery_duration_seconds_bucket{le=\"30\"} 3\n"));
        assert!(out.contains("controlplane_delivery_duration_seconds_bucket{le=\"+Inf\"} 4\n"));
        assert!(out.contains("controlplane_delivery_duration_seconds_count 4\n"));
        assert_eq!(t.attempts("delivered"), 2);
    }
}
