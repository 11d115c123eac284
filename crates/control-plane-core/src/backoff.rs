//! The one jitter of both queues' retry delays: a factor derived from the
//! item's id, so every replica and the reference model compute the same
//! delay, while items that failed together spread out; and an endpoint's
//! own retry setting. The webhook schedule itself is the dispatcher's
//! (`dispatcher::RetryPolicy`).

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
