//! The webhook retry schedule (`CONTROLPLANE_RETRY_SCHEDULE`): delays before
//! each retry, jittered with core's one jitter ([`control_plane_core::jittered`]).

use std::time::Duration;

use control_plane_core::EndpointRetry;
use control_plane_core::{jitter_unit, jittered};

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

/// The service's `policy` with `endpoint`'s own schedule in place of its own.
pub fn for_endpoint(policy: &RetryPolicy, endpoint: &EndpointRetry) -> RetryPolicy {
    RetryPolicy {
        schedule: endpoint.schedule().to_vec(),
        ..policy.clone()
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
    fn an_endpoint_schedule_replaces_the_service_one_and_keeps_its_jitter() {
        let own = EndpointRetry::new(vec![Duration::from_secs(1), Duration::from_secs(60)], None)
            .unwrap();
        let p = for_endpoint(&RetryPolicy::default(), &own);
        assert_eq!(
            p.schedule,
            vec![Duration::from_secs(1), Duration::from_secs(60)]
        );
        assert_eq!(p.jitter, RetryPolicy::default().jitter);
    }
}
