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
