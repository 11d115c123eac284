//! Store-side policies: the attempt budget, the circuit breaker and
//! auto-disable. Pure functions, shared by every adapter and the model, so the
//! transitions are written once.
//!
//! The retry *schedule* is dispatcher configuration; the store only enforces
//! the attempt budget and moves states.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::{AttemptResult, DeliveryId, DeliveryOutcome, DeliveryState};

/// When the circuit of an endpoint opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive failures that open a closed circuit.
    pub failure_threshold: u32,
    /// Cooldown after the first opening.
    pub cooldown: Duration,
    /// Cap on the cooldown, which doubles at every failed probe.
    pub max_cooldown: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failure_threshold: 5,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(600),
        }
    }
}

impl BreakerPolicy {
    /// The cooldown after `reopen_count` failed probes: doubled each time, capped.
    pub fn cooldown_after(&self, reopen_count: u32) -> Duration {
        let factor = 1u32.checked_shl(reopen_count.min(20)).unwrap_or(u32::MAX);
        self.cooldown
            .checked_mul(factor)
            .unwrap_or(self.max_cooldown)
            .min(self.max_cooldown)
    }
}

/// What opening a store does with migrations it still needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Migrations {
    /// Apply them (the default: `CONTROLPLANE_AUTO_MIGRATE=true`).
    #[default]
    Apply,
    /// Refuse to open a store whose schema is behind: the operator runs
    /// `control-plane migrate` (`CONTROLPLANE_AUTO_MIGRATE=false`).
    Refuse,
}

/// Options every adapter takes: the store-side policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Attempts a delivery gets (and gets again at replay) before it is dead.
    pub max_attempts: u32,
    /// Circuit breaker.
    pub breaker: BreakerPolicy,
    /// An endpoint that fails without one success for this long is disabled.
    pub disable_after: Duration,
    /// The workflow queue's retry policy.
    pub workflow: crate::workflow::WorkflowPolicy,
    /// In-flight cap of an endpoint that sets no `max_in_flight`, across
    /// every replica (`CONTROLPLANE_ENDPOINT_CONCURRENCY`).
    pub endpoint_concurrency: u32,
    /// Whether opening the store applies its pending migrations
    /// (`CONTROLPLANE_AUTO_MIGRATE`).
    pub migrations: Migrations,
}

/// The default in-flight cap per endpoint: a quarter of a worker's default
/// concurrency (64), so one slow endpoint leaves most send slots to others.
pub const DEFAULT_ENDPOINT_CONCURRENCY: u32 = 16;

impl StoreOptions {
    /// The in-flight cap of an endpoint whose row stores `max_in_flight`:
    /// its own, or [`StoreOptions::endpoint_concurrency`] when it sets none.
    pub fn cap_of(&self, max_in_flight: Option<u32>) -> u32 {
        max_in_flight.unwrap_or(self.endpoint_concurrency)
    }
}

impl Default for StoreOptions {
    /// Eight attempts (the default schedule: at once, then 5 s, 5 min, 30 min,
    /// 2 h, 5 h, 10 h, 10 h), the default breaker, disable after 5 days.
    fn default() -> Self {
        StoreOptions {
            max_attempts: 8,
            breaker: BreakerPolicy::default(),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            workflow: crate::workflow::WorkflowPolicy::default(),
            endpoint_concurrency: DEFAULT_ENDPOINT_CONCURRENCY,
            migrations: Migrations::Apply,
        }
    }
}

named_enum! {
    /// The mode of an endpoint's circuit.
    pub enum CircuitMode ("circuit mode") {
        /// Deliveries flow.
        Closed = "closed",
        /// Nothing is claimed until `open_until`; then one probe is admitted.
        Open = "open",
        /// One probe is in flight; nothing else is claimed until its outcome.
        HalfOpen = "half_open",
    }
}

/// A change of circuit mode worth an operational alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CircuitChange {
    /// The circuit opened (or re-opened after a failed probe).
    Opened,
    /// The circuit closed.
    Closed,
}

/// The circuit-breaker state of one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circuit {
    /// Mode.
    pub mode: CircuitMode,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// While open: when the probe may go.
    pub open_until: Option<Timestamp>,
    /// Failed probes since the circuit first opened (drives the cooldown).
    pub reopen_count: u32,
    /// First failure since the last success (drives auto-disable).
    pub failing_since: Option<Timestamp>,
    /// While half-open: the probe delivery.
    pub probe: Option<DeliveryId>,
}

impl Default for Circuit {
    fn default() -> Self {
        Circuit::closed()
    }
}

impl Circuit {
    /// A healthy circuit.
    pub fn closed() -> Self {
        Circuit {
            mode: CircuitMode::Closed,
            consecutive_failures: 0,
            open_until: None,
            reopen_count: 0,
            failing_since: None,
            probe: None,
        }
    }

    /// Whether ordinary claims may take this endpoint's deliveries.
    pub fn admits_claims(&self) -> bool {
        self.mode == CircuitMode::Closed
    }

    /// Whether a probe may be claimed at `now`.
    pub fn probe_due(&self, now: Timestamp) -> bool {
        self.mode == CircuitMode::Open && self.open_until.is_some_and(|t| t <= now)
    }

    /// Whether `delivery` is the in-flight probe.
    pub fn is_probe(&self, delivery: DeliveryId) -> bool {
        self.mode == CircuitMode::HalfOpen && self.probe == Some(delivery)
    }

    /// A claim took `delivery` as the probe.
    pub fn start_probe(&mut self, delivery: DeliveryId) {
        self.mode = CircuitMode::HalfOpen;
        self.probe = Some(delivery);
    }

    /// The probe was released unsent: the next claim may probe again.
    pub fn cancel_probe(&mut self, delivery: DeliveryId) {
        if self.is_probe(delivery) {
            self.mode = CircuitMode::Open;
            self.probe = None;
        }
    }

    /// A delivery to this endpoint succeeded.
    pub fn on_success(&mut self) -> Option<CircuitChange> {
        let was_closed = self.mode == CircuitMode::Closed;
        *self = Circuit::closed();
        (!was_closed).then_some(CircuitChange::Closed)
    }

    /// A delivery to this endpoint failed at `now`; `probe` says whether it
    /// was the half-open probe.
    pub fn on_failure(
        &mut self,
        now: Timestamp,
        probe: bool,
        policy: &BreakerPolicy,
    ) -> Option<CircuitChange> {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.failing_since.is_none() {
            self.failing_since = Some(now);
        }
        if probe {
            self.reopen_count = self.reopen_count.saturating_add(1);
            self.mode = CircuitMode::Open;
            self.probe = None;
            self.open_until = Some(now.plus(policy.cooldown_after(self.reopen_count)));
            return Some(CircuitChange::Opened);
        }
        if self.mode == CircuitMode::Closed && self.consecutive_failures >= policy.failure_threshold
        {
            self.mode = CircuitMode::Open;
            self.reopen_count = 0;
            self.open_until = Some(now.plus(policy.cooldown_after(0)));
            return Some(CircuitChange::Opened);
        }
        None
    }

    /// Whether an endpoint failing like this at `now` must be disabled.
    pub fn should_disable(&self, now: Timestamp, options: &StoreOptions) -> bool {
        self.failing_since
            .is_some_and(|since| now.since(since) >= options.disable_after)
    }
}

/// The attempt-log row a transition appends, without its identifiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptDraft {
    /// How the attempt ended.
    pub result: AttemptResult,
    /// HTTP status.
    pub status_code: Option<u16>,
    /// Error text.
    pub error: Option<String>,
    /// Latency.
    pub latency_ms: u64,
    /// The start of the answer's body, as reported.
    pub response_body: Option<String>,
    /// Whether another attempt follows.
    pub will_retry: bool,
    /// When it is due.
    pub next_attempt_at: Option<Timestamp>,
}

/// Everything one transition of a leased delivery changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The delivery's new state.
    pub state: DeliveryState,
    /// Its new due time (unchanged when final).
    pub due_at: Timestamp,
    /// Its last error.
    pub last_error: Option<String>,
    /// The attempt-log row.
    pub attempt: AttemptDraft,
    /// Set when the endpoint must be disabled, with the reason.
    pub disable_reason: Option<String>,
    /// A circuit mode change, if any (the circuit itself is updated in place).
    pub circuit_change: Option<CircuitChange>,
}

/// Message for a failure report without its own error text.
fn failure_text(outcome: &DeliveryOutcome) -> Option<String> {
    let r = outcome.report();
    match (&r.error, r.status_code) {
        (Some(e), _) => Some(e.clone()),
        (None, Some(code)) if !outcome.is_success() => Some(format!("HTTP {code}")),
        (None, None) if !outcome.is_success() => Some("failed".to_string()),
        _ => None,
    }
}

/// Where a leased delivery stands: the attempt its claim started, its
/// budget, and when it was due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptState {
    /// Attempts started, this one included.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// When the delivery was due.
    pub due_at: Timestamp,
}

/// The transition for `outcome` of a delivery standing at `at`. Updates
/// `circuit` in place.
pub fn plan_outcome(
    at: AttemptState,
    outcome: &DeliveryOutcome,
    circuit: &mut Circuit,
    probe: bool,
    now: Timestamp,
    options: &StoreOptions,
) -> Transition {
    let AttemptState {
        attempts,
        max_attempts,
        due_at,
    } = at;
    let exhausted = attempts >= max_attempts;
    let report = outcome.report();
    let error = failure_text(outcome);
    let (state, next) = match outcome {
        DeliveryOutcome::Delivered(_) => (DeliveryState::Delivered, None),
        DeliveryOutcome::GiveUp(_) => (DeliveryState::Dead, None),
        DeliveryOutcome::Retry { .. } | DeliveryOutcome::Gone(_) if exhausted => {
            (DeliveryState::Dead, None)
        }
        DeliveryOutcome::Retry { at, .. } => (DeliveryState::Pending, Some(*at)),
        DeliveryOutcome::Gone(_) => (DeliveryState::Pending, Some(now)),
    };
    let (circuit_change, mut disable_reason) = if outcome.is_success() {
        (circuit.on_success(), None)
    } else {
        let change = circuit.on_failure(now, probe, &options.breaker);
        let disable = circuit.should_disable(now, options).then(|| {
            format!(
                "failing without a success for {} s",
                options.disable_after.as_secs()
            )
        });
        (change, disable)
    };
    if matches!(outcome, DeliveryOutcome::Gone(_)) {
        disable_reason = Some("the endpoint answered 410 Gone".to_string());
    }
    Transition {
        state,
        due_at: next.unwrap_or(due_at),
        last_error: error.clone(),
        attempt: AttemptDraft {
            result: if outcome.is_success() {
                AttemptResult::Delivered
            } else {
                AttemptResult::Failed
            },
            status_code: report.status_code,
            error,
            latency_ms: report.latency_ms,
            response_body: crate::attempt::storable_body(report.response_body.as_deref()),
            will_retry: next.is_some(),
            next_attempt_at: next,
        },
        disable_reason,
        circuit_change,
    }
}

/// The transition of a delivery whose lease expired at a claim at `now`.
/// A probe's expiry counts as a failed probe.
pub fn plan_lease_expiry(
    at: AttemptState,
    circuit: &mut Circuit,
    probe: bool,
    now: Timestamp,
    options: &StoreOptions,
) -> Transition {
    let AttemptState {
        attempts,
        max_attempts,
        due_at,
    } = at;
    let exhausted = attempts >= max_attempts;
    let circuit_change = if probe {
        circuit.on_failure(now, true, &options.breaker)
    } else {
        None
    };
    let error = Some("lease expired before the worker reported".to_string());
    Transition {
        state: if exhausted {
            DeliveryState::Dead
        } else {
            DeliveryState::Pending
        },
        due_at: if exhausted { due_at } else { now },
        last_error: error.clone(),
        attempt: AttemptDraft {
            result: AttemptResult::LeaseExpired,
            status_code: None,
            error,
            latency_ms: 0,
            response_body: None,
            will_retry: !exhausted,
            next_attempt_at: (!exhausted).then_some(now),
        },
        disable_reason: None,
        circuit_change,
    }
}

/// The alerts a transition raises, with their messages. `disabled` says
/// whether the endpoint was enabled until this transition disabled it.
pub fn alerts_for(
    tr: &Transition,
    disabled: bool,
    account: &crate::AccountId,
    endpoint_id: crate::EndpointId,
    delivery_id: DeliveryId,
) -> Vec<crate::NewAlert> {
    use crate::AlertKind;
    let mut out = Vec::new();
    match tr.circuit_change {
        Some(CircuitChange::Opened) => {
            out.push((AlertKind::CircuitOpened, "the circuit opened".to_string()))
        }
        Some(CircuitChange::Closed) => {
            out.push((AlertKind::CircuitClosed, "the circuit closed".to_string()))
        }
        None => {}
    }
    if let (true, Some(reason)) = (disabled, &tr.disable_reason) {
        out.push((AlertKind::EndpointDisabled, reason.clone()));
    }
    if tr.state == DeliveryState::Dead {
        let why = tr
            .last_error
            .clone()
            .unwrap_or_else(|| "given up".to_string());
        out.push((AlertKind::DeliveryDead, why));
    }
    out.into_iter()
        .map(|(kind, message)| crate::NewAlert {
            account: account.clone(),
            kind,
            endpoint_id,
            delivery_id: (kind == AlertKind::DeliveryDead).then_some(delivery_id),
            message,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttemptReport;

    #[test]
    fn an_endpoint_without_a_cap_takes_the_stores_default() {
        let o = StoreOptions {
            endpoint_concurrency: 9,
            ..StoreOptions::default()
        };
        assert_eq!(o.cap_of(None), 9);
        assert_eq!(o.cap_of(Some(3)), 3);
    }

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn cooldown_doubles_and_is_capped() {
        let p = BreakerPolicy {
            failure_threshold: 3,
            cooldown: Duration::from_secs(10),
            max_cooldown: Duration::from_secs(35),
        };
        assert_eq!(p.cooldown_after(0), Duration::from_secs(10));
        assert_eq!(p.cooldown_after(1), Duration::from_secs(20));
        assert_eq!(p.cooldown_after(2), Duration::from_secs(35));
        assert_eq!(p.cooldown_after(200), Duration::from_secs(35));
    }

    #[test]
    fn circuit_opens_at_threshold_and_closes_on_success() {
        let p = BreakerPolicy {
            failure_threshold: 2,
            ..BreakerPolicy::default()
        };
        let mut c = Circuit::closed();
        assert_eq!(c.on_failure(t(0), false, &p), None);
        assert_eq!(c.on_failure(t(1), false, &p), Some(CircuitChange::Opened));
        assert!(!c.admits_claims());
        assert!(!c.probe_due(t(2)));
        assert!(c.probe_due(t(1).plus(p.cooldown)));
        c.start_probe(DeliveryId::new());
        assert_eq!(c.on_success(), Some(CircuitChange::Closed));
        assert_eq!(c, Circuit::closed());
    }

    #[test]
    fn retry_when_exhausted_is_dead() {
        let mut c = Circuit::closed();
        let o = DeliveryOutcome::Retry {
            at: t(50),
            report: AttemptReport::default(),
        };
        let opts = StoreOptions::default();
        let tr = plan_outcome(
            AttemptState {
                attempts: 3,
                max_attempts: 3,
                due_at: t(0),
            },
            &o,
            &mut c,
            false,
            t(10),
            &opts,
        );
        assert_eq!(tr.state, DeliveryState::Dead);
        assert!(!tr.attempt.will_retry);
        let tr = plan_outcome(
            AttemptState {
                attempts: 2,
                max_attempts: 3,
                due_at: t(0),
            },
            &o,
            &mut c,
            false,
            t(10),
            &opts,
        );
        assert_eq!(tr.state, DeliveryState::Pending);
        assert_eq!(tr.due_at, t(50));
    }
}
