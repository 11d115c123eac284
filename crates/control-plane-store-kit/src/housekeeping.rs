//! The gate of a store's periodic claim-time work (sweeping expired leases,
//! looking for due probes).

use std::sync::atomic::{AtomicI64, Ordering};

use control_plane_core::Timestamp;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Housekeeping is due once per interval; restoring the mark taken
    /// before a rolled-back `due` makes it due again at once.
    #[test]
    fn housekeeping_is_due_once_per_interval_and_a_restore_gives_it_back() {
        let h = Housekeeping::default();
        let t = Timestamp::from_millis(1_000_000);
        let before = h.mark();
        assert!(h.due(t));
        assert!(!h.due(t), "taken for this interval");
        h.restore(before);
        assert!(h.due(t), "the rolled-back turn is given back");
        assert!(h.due(Timestamp::from_millis(
            t.as_millis() + Housekeeping::EVERY_MS
        )));
    }
}
