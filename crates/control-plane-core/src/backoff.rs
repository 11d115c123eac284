//! Retry delays of both queues, with one jitter: a factor derived from the
//! item's id, so every replica and the reference model compute the same
//! delay, while items that failed together spread out.

use std::time::Duration;

use crate::hash::fnv1a;
use crate::StoreError;

/// A number in `[0, 1)` derived from `seed` (an id's bytes): FNV-1a, then a
/// multiplicative mix so that ids differing in a few bytes land far apart.
pub fn jitter_unit(seed: &[u8]) -> f64 {
    let mixed = fnv1a(seed.iter().copied()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}

/// `base` scaled by a factor in `[lo, hi]` picked by `unit` (from [`jitter_unit`]).
pub fn jittered(base: Duration, unit: f64, lo: f64, hi: f64) -> Duration {
    base.mul_f64(lo + (hi - lo) * unit.clamp(0.0, 1.0))
}

/// The webhook retry schedule: delays before each retry, with jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay before retry n (n from 1); the last entry repeats.
    pub schedule: Vec<Duration>,
    /// Jitter as a fraction of the delay, added or removed (0.0 to 1.0).
    pub jitter: f64,
    /// `Retry-After` is honoured up to this long.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// README `CONTROLPLANE_RETRY_SCHEDULE`: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, jitter 10 %,
    /// `Retry-After` honoured up to 1 h.
    fn default() -> Self {
        RetryPolicy {
            schedule: default_retry_schedule(),
            jitter: 0.1,
            max_retry_after: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt `attempt` (from 1) of the delivery
    /// whose id's bytes are `seed`; `retry_after` (bounded by
    /// `max_retry_after`) wins when it is longer.
    pub fn delay(&self, attempt: u32, seed: &[u8], retry_after: Option<Duration>) -> Duration {
        let idx = (attempt.max(1) as usize - 1).min(self.schedule.len().saturating_sub(1));
        let base = self
            .schedule
            .get(idx)
            .copied()
            .unwrap_or(Duration::from_secs(60));
        let jitter = self.jitter.clamp(0.0, 1.0);
        let delay = jittered(base, jitter_unit(seed), 1.0 - jitter, 1.0 + jitter);
        match retry_after {
            Some(ra) => delay.max(ra.min(self.max_retry_after)),
            None => delay,
        }
    }
}

/// 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (after the first, immediate attempt).
pub fn default_retry_schedule() -> Vec<Duration> {
    [5, 300, 1800, 7200, 18_000, 36_000, 36_000]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

/// Most delays an endpoint's own schedule may list.
pub const MAX_ENDPOINT_RETRY_DELAYS: usize = 50;
/// Longest delay an endpoint's own schedule may list: one week.
pub const MAX_ENDPOINT_RETRY_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most attempts an endpoint may give a delivery.
pub const MAX_ENDPOINT_ATTEMPTS: u32 = 100;

/// An endpoint's own retry schedule and attempt limit, in place of the
/// service's (`CONTROLPLANE_RETRY_SCHEDULE`). Built checked
/// ([`EndpointRetry::new`]): 1 to [`MAX_ENDPOINT_RETRY_DELAYS`] delays of 1 s
/// to [`MAX_ENDPOINT_RETRY_DELAY`] each, whole seconds, and 1 to
/// [`MAX_ENDPOINT_ATTEMPTS`] attempts. The dispatcher waits `schedule[n-1]`
/// after failed attempt `n` (the last delay repeats); the store makes a
/// delivery dead after `max_attempts` attempts, and a replay gives it that
/// many again (contract `an_endpoint_retry_schedule_and_attempt_limit_are_its_own`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRetry {
    schedule: Vec<Duration>,
    max_attempts: u32,
}

impl EndpointRetry {
    /// `schedule` with `max_attempts` attempts; without it, one attempt
    /// more than the schedule has delays (each delay used once).
    ///
    /// # Errors
    /// `InvalidInput` for a schedule or a limit out of range.
    pub fn new(schedule: Vec<Duration>, max_attempts: Option<u32>) -> Result<Self, StoreError> {
        if schedule.is_empty() || schedule.len() > MAX_ENDPOINT_RETRY_DELAYS {
            return Err(StoreError::InvalidInput(format!(
                "retry schedule must list 1 to {MAX_ENDPOINT_RETRY_DELAYS} delays, got {}",
                schedule.len()
            )));
        }
        for d in &schedule {
            if d.subsec_nanos() != 0 || *d < Duration::from_secs(1) || *d > MAX_ENDPOINT_RETRY_DELAY
            {
                return Err(StoreError::InvalidInput(format!(
                    "each retry delay must be whole seconds from 1 to {}, got {}",
                    MAX_ENDPOINT_RETRY_DELAY.as_secs(),
                    d.as_secs_f64()
                )));
            }
        }
        let max_attempts = match max_attempts {
            Some(m) => m,
            None => u32::try_from(schedule.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        };
        if max_attempts == 0 || max_attempts > MAX_ENDPOINT_ATTEMPTS {
            return Err(StoreError::InvalidInput(format!(
                "max_attempts must be from 1 to {MAX_ENDPOINT_ATTEMPTS}, got {max_attempts}"
            )));
        }
        Ok(EndpointRetry {
            schedule,
            max_attempts,
        })
    }

    /// Delays before each retry.
    pub fn schedule(&self) -> &[Duration] {
        &self.schedule
    }

    /// Attempts a delivery gets before it is dead.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The schedule as stored: whole seconds, comma-separated.
    pub fn schedule_text(&self) -> String {
        let secs: Vec<String> = self
            .schedule
            .iter()
            .map(|d| d.as_secs().to_string())
            .collect();
        secs.join(",")
    }

    /// What a store kept with [`EndpointRetry::schedule_text`] and
    /// [`EndpointRetry::max_attempts`]; `None` when the endpoint has none.
    ///
    /// # Errors
    /// `Backend` when the stored columns do not make a valid setting.
    pub fn from_stored(
        schedule: Option<&str>,
        max_attempts: Option<i64>,
    ) -> Result<Option<Self>, StoreError> {
        let (Some(text), Some(max)) = (schedule, max_attempts) else {
            return Ok(None);
        };
        let bad = |why: String| StoreError::Backend(format!("stored retry schedule: {why}"));
        let schedule = text
            .split(',')
            .map(|s| {
                s.parse::<u64>()
                    .map(Duration::from_secs)
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let max = u32::try_from(max).map_err(|e| bad(e.to_string()))?;
        EndpointRetry::new(schedule, Some(max))
            .map(Some)
            .map_err(|e| bad(e.to_string()))
    }

    /// The service's `policy` with this schedule in place of its own.
    pub fn policy(&self, policy: &RetryPolicy) -> RetryPolicy {
        RetryPolicy {
            schedule: self.schedule.clone(),
            ..policy.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_follow_the_schedule_with_bounded_jitter() {
        let p = RetryPolicy::default();
        for (attempt, base) in [(1u32, 5u64), (2, 300), (7, 36_000), (20, 36_000)] {
            for seed in 0..50u64 {
                let d = p.delay(attempt, &seed.to_le_bytes(), None).as_secs_f64();
                let b = base as f64;
                assert!(
                    d >= b * 0.9 - 0.001 && d <= b * 1.1 + 0.001,
                    "attempt {attempt}: {d} vs {b}"
                );
            }
        }
    }

    /// Ids made in one millisecond (UUIDv7: the same leading bytes) still
    /// get delays spread over the jitter's range.
    #[test]
    fn ids_of_one_moment_spread_out() {
        let p = RetryPolicy::default();
        let mut delays: Vec<f64> = (0..50u8)
            .map(|i| {
                let mut id = [7u8; 16];
                id[15] = i;
                p.delay(2, &id, None).as_secs_f64()
            })
            .collect();
        delays.sort_by(f64::total_cmp);
        let distinct = delays.windows(2).filter(|w| w[0] != w[1]).count() + 1;
        assert!(distinct > 40, "{distinct} distinct delays");
        assert!(delays[0] < 285.0 && delays[49] > 315.0, "{delays:?}");
    }

    #[test]
    fn an_endpoint_retry_is_checked_and_round_trips() {
        let s = |v: &[u64]| {
            v.iter()
                .copied()
                .map(Duration::from_secs)
                .collect::<Vec<_>>()
        };
        let r = EndpointRetry::new(s(&[1, 60]), None).unwrap();
        assert_eq!(r.max_attempts(), 3);
        assert_eq!(r.schedule_text(), "1,60");
        let back = EndpointRetry::from_stored(Some("1,60"), Some(3)).unwrap();
        assert_eq!(back, Some(r.clone()));
        assert_eq!(EndpointRetry::from_stored(None, None).unwrap(), None);
        assert!(EndpointRetry::new(Vec::new(), None).is_err());
        assert!(EndpointRetry::new(s(&[0]), None).is_err());
        assert!(EndpointRetry::new(vec![Duration::from_millis(1500)], None).is_err());
        assert!(EndpointRetry::new(s(&[7 * 24 * 3600 + 1]), None).is_err());
        assert!(EndpointRetry::new(s(&[5; 51]), None).is_err());
        assert!(EndpointRetry::new(s(&[5]), Some(0)).is_err());
        assert!(EndpointRetry::new(s(&[5]), Some(101)).is_err());
        assert_eq!(
            EndpointRetry::new(s(&[5]), Some(100))
                .unwrap()
                .max_attempts(),
            100
        );
        assert!(EndpointRetry::from_stored(Some("5,x"), Some(2)).is_err());
        let p = r.policy(&RetryPolicy::default());
        assert_eq!(p.schedule, s(&[1, 60]));
        assert_eq!(p.jitter, RetryPolicy::default().jitter);
    }
}
