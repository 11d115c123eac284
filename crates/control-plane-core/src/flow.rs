//! Flow control at claim: the per-endpoint in-flight cap, the per-endpoint
//! rate limit (a token bucket) and the fair division of one claim among the
//! endpoints and accounts that have due work (ADR 0009).
//!
//! Both adapters and the reference model call these functions, so the rule
//! is written once; adapters only gather the inputs and apply the result.

use std::collections::HashMap;

use crate::clock::Timestamp;
use crate::{AccountId, EndpointId};

/// The largest `max_in_flight` an endpoint or the service default may set.
pub const MAX_IN_FLIGHT_LIMIT: u32 = 10_000;

/// The largest `rate_limit_per_s` an endpoint may set.
pub const MAX_RATE_LIMIT_PER_S: u32 = 100_000;

/// An endpoint's token bucket as stored: tokens left at `at`.
///
/// The bucket holds at most one second of sends (`burst` = the rate, at
/// least 1) and refills continuously at the rate. A bucket never stored
/// counts as full.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateBudget {
    /// Tokens left, fractional while refilling.
    pub tokens: f64,
    /// When `tokens` was computed.
    pub at: Timestamp,
}

impl RateBudget {
    /// The bucket's size for `rate_per_s`: one second of sends, at least one.
    pub fn burst(rate_per_s: u32) -> f64 {
        f64::from(rate_per_s.max(1))
    }

    /// The bucket as a store keeps it, in two columns: its tokens and the
    /// time of that count (ms). Both or neither: `None` is a bucket never
    /// stored, which [`RateBudget::refilled`] counts as full.
    pub fn stored(tokens: Option<f64>, at_ms: Option<i64>) -> Option<RateBudget> {
        Some(RateBudget {
            tokens: tokens?,
            at: Timestamp::from_millis(at_ms?),
        })
    }

    /// The bucket at `now`: `stored` refilled for the time since, or full.
    pub fn refilled(stored: Option<RateBudget>, rate_per_s: u32, now: Timestamp) -> RateBudget {
        let burst = Self::burst(rate_per_s);
        // Replicas read their clocks a little apart: a bucket is never moved
        // back in time, so an earlier reading cannot count a refill twice.
        let at = stored.map_or(now, |b| b.at.max(now));
        let tokens = match stored {
            None => burst,
            Some(b) => {
                let elapsed_ms = (now.as_millis() - b.at.as_millis()).max(0);
                // Milliseconds to seconds; precision loss only past 2^53 ms.
                #[allow(clippy::cast_precision_loss)]
                let gained = elapsed_ms as f64 / 1000.0 * f64::from(rate_per_s);
                (b.tokens + gained).min(burst)
            }
        };
        RateBudget {
            tokens: tokens.max(0.0),
            at,
        }
    }

    /// Whole sends the bucket allows now.
    pub fn whole(&self) -> u32 {
        // Bounded by the burst, itself at most MAX_RATE_LIMIT_PER_S.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = self.tokens.floor().clamp(0.0, f64::from(u32::MAX)) as u32;
        n
    }

    /// The bucket after `sends` were taken from it.
    pub fn spend(self, sends: u32) -> RateBudget {
        RateBudget {
            tokens: (self.tokens - f64::from(sends)).max(0.0),
            at: self.at,
        }
    }
}

/// What one endpoint can give to a claim, gathered by the adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowCandidate {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Its account.
    pub account: AccountId,
    /// `(due_at, seq)` of its oldest due delivery: the order of service.
    pub oldest: (i64, i64),
    /// Due deliveries it has, counted up to the claim's limit.
    pub due: u32,
    /// Deliveries it has leased now (live leases only).
    pub in_flight: u32,
    /// Its cap: `max_in_flight`, or the service default.
    pub cap: u32,
    /// Whole sends its rate limit allows now; `None` when it has none.
    pub rate_room: Option<u32>,
    /// Ordered mode: at most one in flight, its head.
    pub ordered: bool,
}

impl FlowCandidate {
    /// How many deliveries this endpoint may lease now: its due work,
    /// bounded by the free part of its cap, its rate budget, and for an
    /// ordered endpoint by one (with nothing in flight).
    pub fn room(&self) -> u32 {
        let mut room = self.due.min(self.cap.saturating_sub(self.in_flight));
        if let Some(r) = self.rate_room {
            room = room.min(r);
        }
        if self.ordered {
            room = room.min(u32::from(self.in_flight == 0));
        }
        room
    }
}

/// The most endpoints one claim may throttle.
pub const MAX_THROTTLED: usize = 10_000;

/// A claimer's throttle: endpoints it found slow or failing, each with the
/// lower cap it learned for it, and how many deliveries of those endpoints
/// together this claim may hand out (ADR 0019).
///
/// The learned caps are the latency-aware part of flow control; `budget`
/// keeps part of the claimer's send slots for endpoints that answer well,
/// so slow endpoints together never hold every slot. Empty by default:
/// nothing throttled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Throttle {
    /// `(endpoint, cap)`: the endpoint's in-flight cap for this claim is the
    /// lower of this and its own, counted across replicas like its own.
    pub caps: Vec<(EndpointId, u32)>,
    /// Deliveries of the listed endpoints this claim may hand out in all.
    pub budget: u32,
}

impl Throttle {
    /// Whether `endpoint` is throttled.
    pub fn lists(&self, endpoint: EndpointId) -> bool {
        self.caps.iter().any(|(e, _)| *e == endpoint)
    }

    /// `endpoint`'s cap for this claim: `cap`, or the throttle's when lower.
    pub fn cap(&self, endpoint: EndpointId, cap: u32) -> u32 {
        self.caps
            .iter()
            .filter(|(e, _)| *e == endpoint)
            .fold(cap, |c, (_, t)| c.min(*t))
    }

    /// `InvalidInput` when more than [`MAX_THROTTLED`] endpoints are listed.
    pub fn validate(&self) -> Result<(), crate::StoreError> {
        if self.caps.len() > MAX_THROTTLED {
            return Err(crate::StoreError::InvalidInput(format!(
                "a claim may throttle at most {MAX_THROTTLED} endpoints, got {}",
                self.caps.len()
            )));
        }
        Ok(())
    }
}

/// One account's turn state while a claim is divided.
struct Turns<'a> {
    /// Slots the account holds: its endpoints' live leases plus what this
    /// claim has given them so far.
    load: u64,
    /// Its oldest due delivery, the tie-break.
    oldest: (i64, i64),
    /// Its endpoints with room, each with what it was given so far.
    endpoints: Vec<(&'a FlowCandidate, u32, bool)>,
}

/// Divides a claim of `limit` among `candidates` by max-min fairness (ADR
/// 0009, ADR 0019), one delivery at a time: the next one goes to the account
/// holding the fewest slots (its endpoints' live leases plus what this claim
/// gave it), and within that account to the endpoint holding the fewest;
/// ties go to the one whose oldest due delivery waited longest (sequence
/// numbers are unique, so a tie cannot remain). Each endpoint gets at most
/// its [`FlowCandidate::room`] (its cap already lowered by `throttle`, which
/// the adapter applies with [`Throttle::cap`]), and the endpoints `throttle`
/// lists together at most its budget.
///
/// Returns `(endpoint, count)` for every endpoint that gets at least one,
/// in the order of their oldest due delivery. A freed slot therefore goes
/// to the endpoint (and the account) holding the fewest, never to the
/// oldest backlog: slow endpoints that filled their caps cannot take a slot
/// from a quiet endpoint with due work, and a backlog never hides another
/// endpoint's due delivery.
pub fn share_claim(
    candidates: &[FlowCandidate],
    limit: u32,
    throttle: &Throttle,
) -> Vec<(EndpointId, u32)> {
    let mut accounts: Vec<Turns<'_>> = Vec::new();
    let mut index: HashMap<&AccountId, usize> = HashMap::new();
    for c in candidates {
        let i = *index.entry(&c.account).or_insert_with(|| {
            accounts.push(Turns {
                load: 0,
                oldest: c.oldest,
                endpoints: Vec::new(),
            });
            accounts.len() - 1
        });
        let Some(a) = accounts.get_mut(i) else {
            continue;
        };
        // Every candidate's leases count toward its account's load, room or not.
        a.load += u64::from(c.in_flight);
        a.oldest = a.oldest.min(c.oldest);
        if c.room() > 0 {
            a.endpoints.push((c, 0, throttle.lists(c.endpoint)));
        }
    }
    let mut throttled_left = throttle.budget;
    let open = |e: &(&FlowCandidate, u32, bool), throttled_left: u32| {
        e.1 < e.0.room() && (!e.2 || throttled_left > 0)
    };
    for _ in 0..limit {
        let next = accounts
            .iter()
            .enumerate()
            .filter(|(_, a)| a.endpoints.iter().any(|e| open(e, throttled_left)))
            .min_by_key(|(_, a)| (a.load, a.oldest))
            .map(|(i, _)| i);
        let Some(a) = next.and_then(|i| accounts.get_mut(i)) else {
            break;
        };
        let pick = a
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| open(e, throttled_left))
            .min_by_key(|(_, e)| (u64::from(e.0.in_flight) + u64::from(e.1), e.0.oldest))
            .map(|(k, _)| k);
        let Some(e) = pick.and_then(|k| a.endpoints.get_mut(k)) else {
            break;
        };
        e.1 += 1;
        if e.2 {
            throttled_left -= 1;
        }
        a.load += 1;
    }
    let mut out: Vec<(EndpointId, u32, (i64, i64))> = accounts
        .into_iter()
        .flat_map(|a| a.endpoints)
        .filter(|(_, n, _)| *n > 0)
        .map(|(c, n, _)| (c.endpoint, n, c.oldest))
        .collect();
    out.sort_by_key(|(_, _, oldest)| *oldest);
    out.into_iter().map(|(e, n, _)| (e, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_bucket_needs_both_columns() {
        let b = RateBudget::stored(Some(2.5), Some(7)).unwrap();
        assert_eq!((b.tokens, b.at), (2.5, Timestamp::from_millis(7)));
        assert_eq!(RateBudget::stored(Some(2.5), None), None);
        assert_eq!(RateBudget::stored(None, Some(7)), None);
    }

    fn cand(account: &str, n: u128, oldest: i64, due: u32) -> FlowCandidate {
        FlowCandidate {
            endpoint: EndpointId(uuid::Uuid::from_u128(n)),
            account: AccountId::new(account).unwrap(),
            oldest: (oldest, oldest),
            due,
            in_flight: 0,
            cap: 100,
            rate_room: None,
            ordered: false,
        }
    }

    fn counts(v: &[(EndpointId, u32)]) -> Vec<u32> {
        v.iter().map(|(_, n)| *n).collect()
    }

    #[test]
    fn a_backlog_does_not_hide_a_quiet_endpoint() {
        let c = [cand("a", 1, 1, 100_000), cand("a", 2, 500, 1)];
        assert_eq!(
            counts(&share_claim(&c, 10, &Throttle::default())),
            vec![9, 1]
        );
        assert_eq!(counts(&share_claim(&c, 1, &Throttle::default())), vec![1]);
    }

    #[test]
    fn accounts_take_turns_before_endpoints_of_one_account() {
        // Account a has three endpoints with backlogs; b has one.
        let c = [
            cand("a", 1, 1, 50),
            cand("a", 2, 2, 50),
            cand("a", 3, 3, 50),
            cand("b", 4, 4, 50),
        ];
        let s = share_claim(&c, 8, &Throttle::default());
        let b: u32 = s
            .iter()
            .filter(|(e, _)| e.0.as_u128() == 4)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(b, 4, "b gets half of the claim: {s:?}");
    }

    fn endpoint(n: u128) -> EndpointId {
        EndpointId(uuid::Uuid::from_u128(n))
    }

    fn given(v: &[(EndpointId, u32)], n: u128) -> u32 {
        v.iter()
            .filter(|(e, _)| *e == endpoint(n))
            .map(|(_, k)| k)
            .sum()
    }

    #[test]
    fn a_freed_slot_goes_to_the_endpoint_holding_the_fewest_not_the_oldest_backlog() {
        // Four slow endpoints of one account hold 15 of their 16 slots each
        // and have older backlogs; a quiet endpoint of the same account has
        // one due delivery, younger. One freed slot goes to the quiet one.
        let mut c: Vec<FlowCandidate> = (1..=4)
            .map(|n| {
                let mut s = cand("a", n, i64::try_from(n).unwrap(), 1_000);
                s.cap = 16;
                s.in_flight = 15;
                s
            })
            .collect();
        c.push(cand("a", 9, 5_000, 1));
        let s = share_claim(&c, 1, &Throttle::default());
        assert_eq!(s, vec![(endpoint(9), 1)]);
        // With five slots, the quiet one takes its one and the rest go one
        // each to the slow endpoints, oldest first.
        let s = share_claim(&c, 5, &Throttle::default());
        assert_eq!(given(&s, 9), 1);
        assert_eq!(given(&s, 1) + given(&s, 2) + given(&s, 3) + given(&s, 4), 4);
    }

    #[test]
    fn the_account_holding_the_fewest_slots_is_served_first() {
        // Account x: twenty endpoints, each with 2 in flight and a backlog
        // older than anything of account y, whose one endpoint holds 1.
        let mut c: Vec<FlowCandidate> = (1..=20)
            .map(|n| {
                let mut s = cand("x", n, i64::try_from(n).unwrap(), 100);
                s.in_flight = 2;
                s
            })
            .collect();
        let mut y = cand("y", 99, 10_000, 100);
        y.in_flight = 1;
        c.push(y);
        let s = share_claim(&c, 10, &Throttle::default());
        // y holds 1 against x's 40: all ten slots go to y.
        assert_eq!(given(&s, 99), 10, "{s:?}");
    }

    #[test]
    fn throttled_endpoints_get_their_lowered_cap_and_share_one_budget() {
        let throttle = Throttle {
            caps: vec![(endpoint(1), 2), (endpoint(2), 2), (endpoint(3), 2)],
            budget: 3,
        };
        let mut c: Vec<FlowCandidate> = (1..=4)
            .map(|n| {
                let mut s = cand("a", n, i64::try_from(n).unwrap(), 50);
                s.cap = throttle.cap(endpoint(n), 16);
                s
            })
            .collect();
        c[0].in_flight = 1;
        let s = share_claim(&c, 20, &throttle);
        let throttled = given(&s, 1) + given(&s, 2) + given(&s, 3);
        assert_eq!(throttled, 3, "the budget bounds the throttled: {s:?}");
        assert!(given(&s, 1) <= 1, "cap 2 with 1 in flight: {s:?}");
        assert_eq!(given(&s, 4), 16, "the unthrottled one gets its cap: {s:?}");
        assert_eq!(throttle.cap(endpoint(4), 16), 16);
        assert_eq!(throttle.cap(endpoint(1), 1), 1, "never raises a cap");
    }

    #[test]
    fn room_is_bounded_by_cap_rate_and_order() {
        let mut c = cand("a", 1, 1, 10);
        c.cap = 4;
        c.in_flight = 3;
        assert_eq!(c.room(), 1);
        c.in_flight = 5;
        assert_eq!(c.room(), 0, "an expired-cap endpoint gets nothing");
        c.in_flight = 0;
        c.rate_room = Some(2);
        assert_eq!(c.room(), 2);
        c.ordered = true;
        assert_eq!(c.room(), 1);
        c.in_flight = 1;
        assert_eq!(c.room(), 0);
    }

    #[test]
    fn bucket_refills_at_the_rate_up_to_one_second() {
        let t0 = Timestamp::from_millis(1_000_000);
        let full = RateBudget::refilled(None, 20, t0);
        assert_eq!(full.whole(), 20);
        let spent = full.spend(20);
        assert_eq!(spent.whole(), 0);
        let later = RateBudget::refilled(
            Some(spent),
            20,
            t0.plus(std::time::Duration::from_millis(250)),
        );
        assert_eq!(later.whole(), 5);
        let much_later =
            RateBudget::refilled(Some(spent), 20, t0.plus(std::time::Duration::from_secs(60)));
        assert_eq!(much_later.whole(), 20, "never more than the burst");
    }
}
