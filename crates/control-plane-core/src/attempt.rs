//! The attempt log.

use crate::*;

named_enum! {
    /// Why an attempt ended, in the attempt log.
    pub enum AttemptResult ("attempt result") {
        /// Accepted by the receiver.
        Delivered = "delivered",
        /// Failed (any status or error).
        Failed = "failed",
        /// The worker's lease expired before it reported.
        LeaseExpired = "lease_expired",
    }
}

/// An answer's body as the stores keep it: NUL (which PostgreSQL text
/// cannot hold) replaced by U+FFFD, as invalid UTF-8 already is.
pub fn storable_body(body: Option<&str>) -> Option<String> {
    body.map(|b| b.replace('\0', "\u{FFFD}"))
}

/// One row of the append-only attempt log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// Log position, strictly increasing in append order.
    pub id: i64,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// Owning account.
    pub account: AccountId,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// How it ended.
    pub result: AttemptResult,
    /// HTTP status, if any.
    pub status_code: Option<u16>,
    /// Error text, if any.
    pub error: Option<String>,
    /// Latency.
    pub latency_ms: u64,
    /// The start of the answer's body, when one was kept.
    pub response_body: Option<String>,
    /// Whether another attempt follows.
    pub will_retry: bool,
    /// When the next attempt is due, if one follows.
    pub next_attempt_at: Option<Timestamp>,
    /// When it was recorded.
    pub recorded_at: Timestamp,
}

/// What one endpoint's attempts since some time amount to (the operator's
/// stats page).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptStats {
    /// Attempts the receiver accepted.
    pub delivered: u64,
    /// Attempts that failed (any status or error).
    pub failed: u64,
    /// Attempts whose worker's lease expired before it reported.
    pub lease_expired: u64,
    /// Median response time of the delivered and failed attempts (nearest rank).
    pub p50_latency_ms: Option<u64>,
    /// 95th percentile of the same (nearest rank).
    pub p95_latency_ms: Option<u64>,
}

impl AttemptStats {
    /// Adds `n` attempts that ended as `result`.
    pub fn count(&mut self, result: AttemptResult, n: u64) {
        let slot = match result {
            AttemptResult::Delivered => &mut self.delivered,
            AttemptResult::Failed => &mut self.failed,
            AttemptResult::LeaseExpired => &mut self.lease_expired,
        };
        *slot += n;
    }

    /// Attempts that got an answer or an error: the ones with a response time.
    pub fn answered(&self) -> u64 {
        self.delivered + self.failed
    }

    /// Delivered over all attempts; `None` without attempts.
    pub fn success_rate(&self) -> Option<f64> {
        let all = self.answered() + self.lease_expired;
        (all > 0).then(|| self.delivered as f64 / all as f64)
    }
}

/// The 0-based position of the `percent` percentile, by nearest rank, among
/// `n` sorted values; `None` when there are none. Both adapters read the
/// value at this position, so they agree to the millisecond.
pub fn nearest_rank(percent: u64, n: u64) -> Option<u64> {
    let rank = (percent.min(100) * n).div_ceil(100).clamp(1, n.max(1));
    (n > 0).then(|| rank - 1)
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn nearest_rank_is_the_first_value_covering_the_percentile() {
        assert_eq!(nearest_rank(50, 0), None);
        assert_eq!(nearest_rank(50, 1), Some(0));
        assert_eq!(nearest_rank(50, 4), Some(1));
        assert_eq!(nearest_rank(95, 4), Some(3));
        assert_eq!(nearest_rank(50, 5), Some(2));
        assert_eq!(nearest_rank(95, 20), Some(18));
        assert_eq!(nearest_rank(100, 20), Some(19));
        assert_eq!(nearest_rank(0, 20), Some(0));
    }

    #[test]
    fn success_rate_counts_every_attempt() {
        let mut s = AttemptStats::default();
        assert_eq!(s.success_rate(), None);
        s.count(AttemptResult::Delivered, 3);
        s.count(AttemptResult::LeaseExpired, 1);
        assert_eq!(s.success_rate(), Some(0.75));
        assert_eq!(s.answered(), 3);
    }
}
