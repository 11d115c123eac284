//! The attempt log.

use crate::{AccountId, DeliveryId, EndpointId, Timestamp};

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
    /// Median response time of the delivered and failed attempts: the upper
    /// bound of the latency bucket holding the nearest rank (within a quarter
    /// above the exact value, see [`latency_bucket`]).
    pub p50_latency_ms: Option<u64>,
    /// 95th percentile of the same, by the same rule.
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

/// How far back the stats rollup reaches: the stats pages ask for the last
/// hour and the last day, so rows older than this are purged (ADR 0032).
pub const ROLLUP_HORIZON: std::time::Duration = std::time::Duration::from_secs(25 * 3600);

/// The width of one rollup row's window, in milliseconds.
pub const ROLLUP_MINUTE_MS: i64 = 60_000;

/// The start of the rollup minute `at` falls in.
pub fn rollup_minute(at: Timestamp) -> i64 {
    let ms = at.as_millis();
    ms - ms.rem_euclid(ROLLUP_MINUTE_MS)
}

/// Latency buckets of the rollup: bucket 0 holds 0 to 1 ms, and each next
/// bucket's upper bound is a quarter above the last (at least 1 ms more), up
/// to about 45 minutes (bucket 62); bucket 63 holds everything longer.
pub const LATENCY_BUCKETS: i16 = 64;

/// The upper bound, in ms, of latency bucket `bucket` (clamped to the
/// buckets there are).
pub fn latency_bucket_bound(bucket: i16) -> u64 {
    let mut bound: u64 = 1;
    for _ in 0..bucket.clamp(0, LATENCY_BUCKETS - 1) {
        bound = (bound + 1).max(bound.saturating_mul(5).div_ceil(4));
    }
    bound
}

/// The bucket a latency of `ms` counts in: the first whose bound holds it.
pub fn latency_bucket(ms: u64) -> i16 {
    let mut bound: u64 = 1;
    for b in 0..LATENCY_BUCKETS - 1 {
        if ms <= bound {
            return b;
        }
        bound = (bound + 1).max(bound.saturating_mul(5).div_ceil(4));
    }
    LATENCY_BUCKETS - 1
}

/// The rollup bucket of an attempt: its latency's, or 0 for a lease that
/// expired (it has no response time and is never ranked).
pub fn rollup_bucket(result: AttemptResult, latency_ms: u64) -> i16 {
    match result {
        AttemptResult::LeaseExpired => 0,
        _ => latency_bucket(latency_ms),
    }
}

/// One row of the attempt rollup: how many attempts of one endpoint, in one
/// minute, ended as `result` with a latency in `bucket`. Both adapters append
/// such rows with every attempt they write and fold them in maintenance; a
/// reader sums them (ADR 0032).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RollupRow {
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The start of the minute ([`rollup_minute`]).
    pub minute: i64,
    /// How the attempts ended.
    pub result: AttemptResult,
    /// Their latency bucket ([`latency_bucket`]).
    pub bucket: i16,
    /// How many.
    pub n: i64,
}

impl RollupRow {
    /// The rows that count `attempts` (endpoint, time, result, latency),
    /// one per distinct key, in key order.
    pub fn of(
        attempts: impl IntoIterator<Item = (EndpointId, Timestamp, AttemptResult, u64)>,
    ) -> Vec<RollupRow> {
        let mut counts: std::collections::BTreeMap<(EndpointId, i64, AttemptResult, i16), i64> =
            std::collections::BTreeMap::new();
        for (endpoint, at, result, latency) in attempts {
            *counts
                .entry((
                    endpoint,
                    rollup_minute(at),
                    result,
                    rollup_bucket(result, latency),
                ))
                .or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((endpoint_id, minute, result, bucket), n)| RollupRow {
                endpoint_id,
                minute,
                result,
                bucket,
                n,
            })
            .collect()
    }
}

impl AttemptStats {
    /// The stats that rollup counts `(result, bucket, n)` sum to: counts
    /// exact, p50 and p95 the upper bound of the bucket that holds the
    /// nearest rank among the delivered and failed attempts.
    pub fn from_rollup(rows: impl IntoIterator<Item = (AttemptResult, i16, u64)>) -> AttemptStats {
        let mut stats = AttemptStats::default();
        let mut by_bucket: std::collections::BTreeMap<i16, u64> = std::collections::BTreeMap::new();
        for (result, bucket, n) in rows {
            stats.count(result, n);
            if result != AttemptResult::LeaseExpired {
                *by_bucket.entry(bucket).or_default() += n;
            }
        }
        let answered = stats.answered();
        let at_rank = |percent: u64| {
            let position = nearest_rank(percent, answered)?;
            let mut seen = 0;
            by_bucket.iter().find_map(|(bucket, n)| {
                seen += n;
                (seen > position).then(|| latency_bucket_bound(*bucket))
            })
        };
        stats.p50_latency_ms = at_rank(50);
        stats.p95_latency_ms = at_rank(95);
        stats
    }
}

/// The 0-based position of the `percent` percentile, by nearest rank, among
/// `n` sorted values; `None` when there are none. Both adapters read the
/// value at this position, so they agree to the millisecond.
pub fn nearest_rank(percent: u64, n: u64) -> Option<u64> {
    let rank = (percent.min(100) * n).div_ceil(100).clamp(1, n.max(1));
    (n > 0).then(|| rank - 1)
}

/// Which attempts [`crate::AttemptLogStore::attempt_search`] returns: one
/// account's, newest first, keyset-paginated by log position, narrowed by
/// any of an endpoint, a result, a status code and a time window.
#[derive(Clone, Debug)]
pub struct AttemptQuery {
    /// The account.
    pub account: crate::AccountId,
    /// Only this endpoint's (`NotFound` when it is not the account's).
    pub endpoint: Option<crate::EndpointId>,
    /// Only attempts that ended so.
    pub result: Option<AttemptResult>,
    /// Only attempts answered with this HTTP status.
    pub status_code: Option<u16>,
    /// Only attempts recorded at or after this time.
    pub since: Option<crate::Timestamp>,
    /// Only attempts recorded before this time.
    pub until: Option<crate::Timestamp>,
    /// The page; its cursor is a log position.
    pub page: crate::PageRequest,
}

impl AttemptQuery {
    /// Every attempt of `account`, a page at a time.
    pub fn new(account: crate::AccountId, page: crate::PageRequest) -> Self {
        AttemptQuery {
            account,
            endpoint: None,
            result: None,
            status_code: None,
            since: None,
            until: None,
            page,
        }
    }

    /// The same query, of one endpoint.
    #[must_use]
    pub fn of_endpoint(self, endpoint: crate::EndpointId) -> Self {
        AttemptQuery {
            endpoint: Some(endpoint),
            ..self
        }
    }

    /// The query as one `SELECT` of `columns` from `attempts`, written once
    /// for both adapters: `$1` is the account, then one parameter per filter
    /// that is set, in the order endpoint, result, status code, since,
    /// until, then the cursor (`id <`, when set) and the limit. Only set
    /// filters appear, so each plan fits the filters asked.
    pub fn sql(&self, columns: &str) -> String {
        let mut sql = format!("SELECT {columns} FROM attempts WHERE account = $1");
        let mut n = 1;
        let mut and = |set: bool, condition: &str| {
            if set {
                n += 1;
                sql.push_str(&format!(" AND {condition} ${n}"));
            }
        };
        and(self.endpoint.is_some(), "endpoint_id =");
        and(self.result.is_some(), "result =");
        and(self.status_code.is_some(), "status_code =");
        and(self.since.is_some(), "recorded_at >=");
        and(self.until.is_some(), "recorded_at <");
        and(self.page.after().is_some(), "id <");
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", n + 1));
        sql
    }
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
    fn latency_buckets_grow_by_a_quarter_and_hold_their_bound() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        assert_eq!(latency_bucket(2), 1);
        let mut last = 0;
        for b in 0..LATENCY_BUCKETS - 1 {
            let bound = latency_bucket_bound(b);
            assert!(bound > last, "bucket {b}");
            assert_eq!(latency_bucket(bound), b, "the bound of {b} is in it");
            assert_eq!(latency_bucket(bound + 1), b + 1, "one above is in the next");
            if bound > 8 {
                assert!(
                    bound <= last * 5 / 4 + 1,
                    "bucket {b} grew more than a quarter"
                );
            }
            last = bound;
        }
        // The last bounded bucket is past any request timeout (45 minutes).
        assert_eq!(latency_bucket_bound(LATENCY_BUCKETS - 2), 2_739_842);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn rollup_stats_rank_by_bucket_and_count_exactly() {
        let e = EndpointId(uuid::Uuid::nil());
        let t = Timestamp::from_millis(90_000);
        let rows = RollupRow::of([
            (e, t, AttemptResult::Delivered, 40),
            (e, t, AttemptResult::Delivered, 10),
            (e, t, AttemptResult::Failed, 30),
            (e, t, AttemptResult::Delivered, 20),
            (e, t, AttemptResult::LeaseExpired, 0),
            (e, t, AttemptResult::Delivered, 10),
        ]);
        assert!(rows.iter().all(|r| r.minute == 60_000));
        assert_eq!(rows.iter().map(|r| r.n).sum::<i64>(), 6);
        let stats = AttemptStats::from_rollup(
            rows.iter()
                .map(|r| (r.result, r.bucket, u64::try_from(r.n).unwrap())),
        );
        assert_eq!(
            (stats.delivered, stats.failed, stats.lease_expired),
            (4, 1, 1)
        );
        // Sorted 10, 10, 20, 30, 40: the median is 20, the p95 40, each
        // reported as its bucket's bound.
        let bound = |ms| Some(latency_bucket_bound(latency_bucket(ms)));
        assert_eq!(stats.p50_latency_ms, bound(20));
        assert_eq!(stats.p95_latency_ms, bound(40));
        assert_eq!(AttemptStats::from_rollup([]), AttemptStats::default());
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

#[cfg(test)]
mod query_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_the_filters_set_are_in_the_statement_numbered_in_order() {
        let a = crate::AccountId::new("a").unwrap();
        let all = AttemptQuery::new(a.clone(), crate::PageRequest::first(10));
        assert_eq!(
            all.sql("id"),
            "SELECT id FROM attempts WHERE account = $1 ORDER BY id DESC LIMIT $2"
        );
        let mut q = all.of_endpoint(crate::EndpointId::new());
        q.status_code = Some(500);
        q.until = Some(crate::Timestamp::from_millis(5));
        q.page = crate::PageRequest::new(10, Some(7)).unwrap();
        assert_eq!(
            q.sql("id"),
            "SELECT id FROM attempts WHERE account = $1 AND endpoint_id = $2 \
             AND status_code = $3 AND recorded_at < $4 AND id < $5 ORDER BY id DESC LIMIT $6"
        );
    }
}
