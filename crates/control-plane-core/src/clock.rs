//! Time as the store sees it: one injected clock, read for every decision.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A point in time, in milliseconds since the Unix epoch (UTC).
///
/// Milliseconds are what both backends store exactly, so a value survives a
/// round trip through either adapter unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The timestamp `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This time plus `d`, saturating at the far future.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// This time minus `d`, saturating at the far past.
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T09:43:48.123Z`.
    ///
    /// Clamped to years 1970 to 9999, the range RFC 3339 and the formatter
    /// cover; a store never holds a time outside it.
    pub fn to_rfc3339(self) -> String {
        let ms = self.0.clamp(0, LAST_RFC3339_MILLIS);
        let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// 9999-12-31T23:59:59.999Z, the last instant RFC 3339 can write.
const LAST_RFC3339_MILLIS: i64 = 253_402_300_799_999;

/// Milliseconds in `d`, saturating at `i64::MAX`.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The store's source of time. Adapters read it for every time-dependent
/// decision and pass the value to SQL as a parameter.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(duration_millis)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// A clock that moves only when told to; tests use it so they never sleep.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(AtomicI64::new(start.0))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    /// 2026-01-01T00:00:00Z, a fixed and readable starting point.
    fn default() -> Self {
        ManualClock::new(Timestamp(1_767_225_600_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp(1_767_225_600_000).to_rfc3339(),
            "2026-01-01T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp(951_782_400_123).to_rfc3339(),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(Timestamp(-5).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp(i64::MAX).to_rfc3339(), "9999-12-31T23:59:59.999Z");
    }

    /// Housekeeping is due once per interval; restoring the mark taken
    /// before a rolled-back `due` makes it due again at once.
    #[test]
    fn housekeeping_is_due_once_per_interval_and_a_restore_gives_it_back() {
        let h = Housekeeping::default();
        let t = Timestamp(1_000_000);
        let before = h.mark();
        assert!(h.due(t));
        assert!(!h.due(t), "taken for this interval");
        h.restore(before);
        assert!(h.due(t), "the rolled-back turn is given back");
        assert!(h.due(Timestamp(t.0 + Housekeeping::EVERY_MS)));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::default();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(5));
        assert_eq!(c.now(), t0.plus(Duration::from_secs(5)));
        assert_eq!(c.now().since(t0), Duration::from_secs(5));
        assert_eq!(t0.since(c.now()), Duration::ZERO);
    }
}

/// The gate of a store's periodic claim-time work (sweeping expired leases,
/// looking for due probes): open at most once per [`Housekeeping::EVERY_MS`] of
/// store time, and always when the clock went backwards. Either duty is
/// delayed by less than that interval; the per-claim cost is gone.
#[derive(Debug)]
pub struct Housekeeping(AtomicI64);

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping(AtomicI64::new(i64::MIN))
    }
}

impl Housekeeping {
    /// The interval, in milliseconds of store time.
    pub const EVERY_MS: i64 = 200;

    /// Whether the work is due at `now`; when it is, `now` is remembered.
    pub fn due(&self, now: Timestamp) -> bool {
        let last = self.0.load(Ordering::Relaxed);
        if Self::due_since(last, now) {
            self.0.store(now.as_millis(), Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// When the work was last done, to [`Housekeeping::restore`] it.
    pub fn mark(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Goes back to `mark`: the transaction that found the work due was
    /// rolled back, so the work was not done.
    pub fn restore(&self, mark: i64) {
        self.0.store(mark, Ordering::Relaxed);
    }

    /// The rule of [`Housekeeping::due`]: work last done at `last`
    /// (milliseconds; `i64::MIN` for never) is due again at `now`.
    pub fn due_since(last: i64, now: Timestamp) -> bool {
        let now = now.as_millis();
        now < last || now.saturating_sub(last) >= Self::EVERY_MS
    }
}
