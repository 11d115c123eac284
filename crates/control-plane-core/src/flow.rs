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

/// Divides a claim of `limit` among `candidates` fairly: round robin over
/// accounts, and within each account over its endpoints, one delivery per
/// turn, each endpoint up to its [`FlowCandidate::room`]. Accounts and
/// endpoints take their turns in the order of their oldest due delivery, so
/// the one that has waited longest goes first and a tie cannot occur
/// (sequence numbers are unique).
///
/// Returns `(endpoint, count)` for every endpoint that gets at least one,
/// in turn order. A backlog on one endpoint therefore never hides another
/// endpoint's due delivery: every endpoint with room gets a turn before any
/// endpoint gets its second, and every account before any account's second.
pub fn share_claim(candidates: &[FlowCandidate], limit: u32) -> Vec<(EndpointId, u32)> {
    // Accounts in the order of their oldest endpoint; endpoints in theirs.
    let mut sorted: Vec<&FlowCandidate> = candidates.iter().filter(|c| c.room() > 0).collect();
    sorted.sort_by_key(|c| c.oldest);
    let mut accounts: Vec<Vec<(&FlowCandidate, u32)>> = Vec::new();
    let mut index: HashMap<&AccountId, usize> = HashMap::new();
    for c in sorted {
        let i = *index.entry(&c.account).or_insert_with(|| {
            accounts.push(Vec::new());
            accounts.len() - 1
        });
        accounts[i].push((c, 0));
    }
    let mut turn = vec![0usize; accounts.len()];
    let mut left = limit;
    let mut progress = true;
    while left > 0 && progress {
        progress = false;
        for (a, endpoints) in accounts.iter_mut().enumerate() {
            if left == 0 {
                break;
            }
            // The account's next endpoint that still has room.
            for step in 0..endpoints.len() {
                let k = (turn[a] + step) % endpoints.len();
                let (c, given) = &mut endpoints[k];
                if *given < c.room() {
                    *given += 1;
                    left -= 1;
                    turn[a] = k + 1;
                    progress = true;
                    break;
                }
            }
        }
    }
    let mut out: Vec<(EndpointId, u32, (i64, i64))> = accounts
        .into_iter()
        .flatten()
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| (c.endpoint, n, c.oldest))
        .collect();
    out.sort_by_key(|(_, _, oldest)| *oldest);
    out.into_iter().map(|(e, n, _)| (e, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(counts(&share_claim(&c, 10)), vec![9, 1]);
        assert_eq!(counts(&share_claim(&c, 1)), vec![1]);
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
        let s = share_claim(&c, 8);
        let b: u32 = s
            .iter()
            .filter(|(e, _)| e.0.as_u128() == 4)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(b, 4, "b gets half of the claim: {s:?}");
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
