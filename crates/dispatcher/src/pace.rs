//! The latency-aware cap per endpoint (ADR 0019): a worker lowers the
//! in-flight cap of an endpoint whose answers are slow or failing, raises it
//! again while its answers are quick, and keeps part of its send slots for
//! endpoints it has not throttled. It hands both to the store with every
//! claim ([`Throttle`]), where they hold against the leases of every replica.
//!
//! The rule is additive increase, multiplicative decrease:
//! - an answer slower than `slow`, a failed attempt, or a send still running
//!   after `slow` halves the endpoint's cap (from the lower of its cap and
//!   what this worker has in flight to it), at most once per `slow`, never
//!   below one;
//! - a quick success raises a throttled endpoint's cap by one; once the cap
//!   passes this worker's slot count the endpoint is no longer throttled.
//!
//! Throttled endpoints together may hold at most `slots - slots / 4` of this
//! worker's slots (all but one at least, when there are two or more), so a
//! quarter stays free for the others.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use control_plane_core::MAX_THROTTLED;
use control_plane_core::{DeliveryId, EndpointId, Throttle};

/// How long a throttled endpoint with nothing in flight keeps its cap
/// before this worker forgets it (and starts it unthrottled again).
const FORGET_AFTER: Duration = Duration::from_secs(300);

/// What this worker knows of one endpoint.
#[derive(Debug, Default)]
struct Flow {
    /// The learned cap; `None` while the endpoint is not throttled.
    cap: Option<u32>,
    /// Deliveries claimed by this worker and not ended, with when each
    /// send started (`None` while it waits in the local queue).
    sending: Vec<(DeliveryId, Option<Instant>)>,
    /// The last cut, so one slow round halves the cap once.
    cut_at: Option<Instant>,
    /// The last time a send started or ended.
    seen: Option<Instant>,
}

impl Flow {
    /// Whether a send to it has run `slow` or longer by `now`.
    fn overdue(&self, now: Instant, slow: Duration) -> bool {
        self.sending
            .iter()
            .any(|(_, started)| started.is_some_and(|s| now.saturating_duration_since(s) >= slow))
    }

    /// Halves the cap, at most once per `slow`.
    fn cut(&mut self, now: Instant, slow: Duration) {
        if self
            .cut_at
            .is_some_and(|at| now.saturating_duration_since(at) < slow)
        {
            return;
        }
        let in_flight = u32::try_from(self.sending.len()).unwrap_or(u32::MAX);
        let base = self.cap.map_or(in_flight, |c| c.min(in_flight.max(1)));
        self.cap = Some((base / 2).max(1));
        self.cut_at = Some(now);
    }
}

/// How an attempt ended, as far as pacing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answered {
    /// The receiver accepted it.
    Success,
    /// The attempt failed (an error status, a timeout, a broken connection).
    Failure,
    /// No answer to learn from (halted at shutdown, or a send that panicked).
    Nothing,
}

/// One worker's learned caps.
#[derive(Debug)]
pub(crate) struct Pace {
    slow: Duration,
    slots: u32,
    flows: Mutex<HashMap<EndpointId, Flow>>,
}

impl Pace {
    /// Pacing for a worker of `slots` send slots; answers slower than
    /// `slow` count as slow.
    pub(crate) fn new(slots: usize, slow: Duration) -> Pace {
        Pace {
            slow,
            slots: u32::try_from(slots).unwrap_or(u32::MAX).max(1),
            flows: Mutex::default(),
        }
    }

    /// Slots the throttled endpoints may hold together: all but a quarter,
    /// and all but one at least when there are two or more.
    fn throttled_slots(&self) -> u32 {
        let kept = if self.slots > 1 {
            (self.slots / 4).max(1)
        } else {
            0
        };
        (self.slots - kept).max(1)
    }

    /// The throttle for the next claim: first every endpoint whose oldest
    /// send has run longer than `slow` is cut, then the learned caps are
    /// listed with the budget left to the throttled endpoints.
    pub(crate) fn throttle(&self, now: Instant) -> Throttle {
        let mut flows = self.flows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut held = 0u32;
        let mut caps = Vec::new();
        flows.retain(|_, f| {
            !f.sending.is_empty()
                || f.seen
                    .is_some_and(|s| now.saturating_duration_since(s) < FORGET_AFTER)
        });
        for (endpoint, f) in flows.iter_mut() {
            if f.overdue(now, self.slow) {
                f.cut(now, self.slow);
            }
            if let Some(cap) = f.cap {
                caps.push((*endpoint, cap));
                held = held.saturating_add(u32::try_from(f.sending.len()).unwrap_or(u32::MAX));
            }
        }
        // A claim lists at most MAX_THROTTLED endpoints: the lowest caps
        // first. The budget still counts what every throttled one holds.
        if caps.len() > MAX_THROTTLED {
            caps.sort_by_key(|(_, cap)| *cap);
            caps.truncate(MAX_THROTTLED);
        }
        Throttle {
            caps,
            budget: self.throttled_slots().saturating_sub(held),
        }
    }

    /// A delivery was claimed: it counts as in flight from now on, though
    /// its send has not started.
    pub(crate) fn claimed(&self, endpoint: EndpointId, delivery: DeliveryId, now: Instant) {
        let mut flows = self.flows.lock().unwrap_or_else(PoisonError::into_inner);
        let f = flows.entry(endpoint).or_default();
        f.sending.push((delivery, None));
        f.seen = Some(now);
    }

    /// A delivery's send starts (claimed before, or not).
    pub(crate) fn started(&self, endpoint: EndpointId, delivery: DeliveryId, now: Instant) {
        let mut flows = self.flows.lock().unwrap_or_else(PoisonError::into_inner);
        let f = flows.entry(endpoint).or_default();
        match f.sending.iter_mut().find(|(d, _)| *d == delivery) {
            Some((_, started)) => *started = Some(now),
            None => f.sending.push((delivery, Some(now))),
        }
        f.seen = Some(now);
    }

    /// Whether every endpoint this worker has deliveries of answers
    /// quickly: none of them is throttled and no send has run `slow` yet
    /// (a throttled endpoint with nothing in hand does not count). Only then
    /// does the worker claim ahead of its free slots (ADR 0038), so that a
    /// slow receiver's deliveries never queue in front of a quick one's.
    pub(crate) fn calm(&self, now: Instant) -> bool {
        let flows = self.flows.lock().unwrap_or_else(PoisonError::into_inner);
        flows
            .values()
            .all(|f| (f.cap.is_none() || f.sending.is_empty()) && !f.overdue(now, self.slow))
    }

    /// A send ended after `took`, answered as `answered`.
    pub(crate) fn ended(
        &self,
        endpoint: EndpointId,
        delivery: DeliveryId,
        took: Duration,
        answered: Answered,
        now: Instant,
    ) {
        let mut flows = self.flows.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(f) = flows.get_mut(&endpoint) else {
            return;
        };
        f.seen = Some(now);
        match answered {
            Answered::Failure => f.cut(now, self.slow),
            Answered::Success if took >= self.slow => f.cut(now, self.slow),
            Answered::Success => {
                if let Some(cap) = f.cap {
                    let raised = cap.saturating_add(1);
                    f.cap = (raised <= self.slots).then_some(raised);
                }
            }
            Answered::Nothing => {}
        }
        // After the cut, which counts the send as in flight.
        if let Some(i) = f.sending.iter().position(|(d, _)| *d == delivery) {
            f.sending.swap_remove(i);
        }
        if f.sending.is_empty() && f.cap.is_none() {
            flows.remove(&endpoint);
        }
    }
}

/// One send being paced: reports its end to [`Pace::ended`] once, with
/// [`Answered::Nothing`] when dropped unfinished (halted at shutdown, or a
/// send that panicked), so no send stays counted in flight.
pub(crate) struct Tracked {
    pace: std::sync::Arc<Pace>,
    endpoint: EndpointId,
    delivery: DeliveryId,
    done: bool,
}

impl Tracked {
    /// Tracks the send of `delivery` to `endpoint`, started by [`Pace::started`].
    pub(crate) fn new(
        pace: std::sync::Arc<Pace>,
        endpoint: EndpointId,
        delivery: DeliveryId,
    ) -> Self {
        Tracked {
            pace,
            endpoint,
            delivery,
            done: false,
        }
    }

    /// The send ended, answered as `answered` after an exchange of `took`.
    pub(crate) fn finish(mut self, answered: Answered, took: Duration) {
        self.end(answered, took);
    }

    fn end(&mut self, answered: Answered, took: Duration) {
        if !self.done {
            self.done = true;
            self.pace
                .ended(self.endpoint, self.delivery, took, answered, Instant::now());
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // Nothing was answered: how long it ran teaches nothing.
        self.end(Answered::Nothing, Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: Duration = Duration::from_secs(1);

    fn endpoint(n: u128) -> EndpointId {
        EndpointId(uuid::Uuid::from_u128(n))
    }

    fn delivery(n: u128) -> DeliveryId {
        DeliveryId(uuid::Uuid::from_u128(n))
    }

    fn cap_of(t: &Throttle, n: u128) -> Option<u32> {
        t.caps
            .iter()
            .find(|(e, _)| *e == endpoint(n))
            .map(|(_, c)| *c)
    }

    #[test]
    fn slow_answers_halve_the_cap_once_per_round_down_to_one() {
        let pace = Pace::new(64, SLOW);
        let t0 = Instant::now();
        for d in 0..16 {
            pace.started(endpoint(1), delivery(d), t0);
        }
        // The first slow answer halves 16 in flight to 8; the other slow
        // answers of the same round change nothing.
        let later = t0 + Duration::from_secs(2);
        for d in 0..8 {
            pace.ended(endpoint(1), delivery(d), SLOW * 2, Answered::Success, later);
        }
        assert_eq!(cap_of(&pace.throttle(later), 1), Some(8));
        // Rounds later it is down to one, and stays there.
        let mut now = later;
        for d in 8..16 {
            now += SLOW;
            pace.ended(endpoint(1), delivery(d), SLOW * 2, Answered::Failure, now);
        }
        assert_eq!(cap_of(&pace.throttle(now), 1), Some(1));
    }

    #[test]
    fn a_send_running_past_slow_cuts_before_any_answer() {
        let pace = Pace::new(16, SLOW);
        let t0 = Instant::now();
        for d in 0..8 {
            pace.started(endpoint(1), delivery(d), t0);
        }
        let t = pace.throttle(t0 + Duration::from_millis(10));
        assert!(t.caps.is_empty(), "quick so far: {t:?}");
        assert_eq!(t.budget, 12);
        let t = pace.throttle(t0 + SLOW);
        assert_eq!(cap_of(&t, 1), Some(4));
        // Its eight sends count against the throttled budget of 12.
        assert_eq!(t.budget, 4);
    }

    #[test]
    fn quick_successes_raise_the_cap_until_it_is_unthrottled() {
        let pace = Pace::new(4, SLOW);
        let t0 = Instant::now();
        pace.started(endpoint(1), delivery(0), t0);
        pace.ended(endpoint(1), delivery(0), SLOW, Answered::Failure, t0);
        assert_eq!(cap_of(&pace.throttle(t0), 1), Some(1));
        for d in 1..=4 {
            pace.started(endpoint(1), delivery(d), t0);
            pace.ended(
                endpoint(1),
                delivery(d),
                Duration::from_millis(5),
                Answered::Success,
                t0,
            );
        }
        assert_eq!(cap_of(&pace.throttle(t0), 1), None, "raised past 4 slots");
    }

    #[test]
    fn a_worker_is_calm_until_a_send_runs_slow_and_queued_ones_never_count_as_slow() {
        let pace = Pace::new(16, SLOW);
        let t0 = Instant::now();
        pace.claimed(endpoint(1), delivery(0), t0);
        pace.claimed(endpoint(1), delivery(1), t0);
        assert!(pace.calm(t0 + SLOW * 5), "claimed and queued, not sending");
        assert!(pace.throttle(t0 + SLOW * 5).caps.is_empty());
        pace.started(endpoint(1), delivery(0), t0 + SLOW * 5);
        assert!(pace.calm(t0 + SLOW * 5));
        assert!(!pace.calm(t0 + SLOW * 6), "a send ran past slow");
        pace.ended(
            endpoint(1),
            delivery(0),
            SLOW,
            Answered::Success,
            t0 + SLOW * 6,
        );
        assert!(!pace.calm(t0 + SLOW * 6), "throttled now, with one in hand");
        let later = t0 + SLOW * 6;
        pace.ended(
            endpoint(1),
            delivery(1),
            Duration::ZERO,
            Answered::Nothing,
            later,
        );
        assert!(cap_of(&pace.throttle(later), 1).is_some());
        assert!(pace.calm(later), "throttled, but nothing in hand");
    }

    #[test]
    fn small_workers_keep_one_slot_for_quick_endpoints() {
        assert_eq!(Pace::new(1, SLOW).throttled_slots(), 1);
        assert_eq!(Pace::new(2, SLOW).throttled_slots(), 1);
        assert_eq!(Pace::new(3, SLOW).throttled_slots(), 2);
        assert_eq!(Pace::new(16, SLOW).throttled_slots(), 12);
    }

    #[test]
    fn quick_endpoints_are_never_throttled_and_forgotten_when_idle() {
        let pace = Pace::new(64, SLOW);
        let t0 = Instant::now();
        pace.started(endpoint(2), delivery(1), t0);
        pace.ended(
            endpoint(2),
            delivery(1),
            Duration::from_millis(3),
            Answered::Success,
            t0,
        );
        let t = pace.throttle(t0);
        assert!(t.caps.is_empty());
        assert_eq!(t.budget, 48);
        assert!(pace.flows.lock().unwrap().is_empty());
        // A throttled endpoint with nothing in flight is forgotten later.
        pace.started(endpoint(3), delivery(2), t0);
        pace.ended(endpoint(3), delivery(2), SLOW, Answered::Failure, t0);
        assert_eq!(cap_of(&pace.throttle(t0), 3), Some(1));
        assert!(pace.throttle(t0 + FORGET_AFTER).caps.is_empty());
    }
}
