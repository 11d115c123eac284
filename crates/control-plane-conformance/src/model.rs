//! A pure, synchronous reference model of the delivery state machine: the
//! spec you can run. The conformance suite drives it and an adapter with the
//! same random operations and compares every result.
//!
//! It models one account. Endpoints and deliveries are addressed by index
//! (creation order); lease tokens are counters.

use std::time::Duration;

use control_plane_core::Timestamp;
use control_plane_core::{fence, FencedWrite, Held, Refused, Verdict};
use control_plane_core::{
    plan_lease_expiry, plan_outcome, AttemptState, Circuit, StoreOptions, Transition,
};
use control_plane_core::{share_claim, FlowCandidate};
use control_plane_core::{
    AccountId, AttemptResult, DeliveryId, DeliveryOutcome, DeliveryState, EndpointId,
};

/// Errors the model predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelError {
    /// The token is stale.
    LeaseLost,
    /// The operation contradicts the state.
    Conflict,
}

impl From<Refused> for ModelError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Lost => ModelError::LeaseLost,
            Refused::Conflict { .. } => ModelError::Conflict,
        }
    }
}

/// A model endpoint.
#[derive(Clone, Debug)]
pub struct ModelEndpoint {
    /// Enabled flag.
    pub enabled: bool,
    /// Ordered mode.
    pub ordered: bool,
    /// Deleted.
    pub deleted: bool,
    /// Circuit.
    pub circuit: Circuit,
}

/// A model delivery.
#[derive(Clone, Debug)]
pub struct ModelDelivery {
    /// Endpoint index.
    pub endpoint: usize,
    /// Sequence number.
    pub seq: i64,
    /// State.
    pub state: DeliveryState,
    /// Attempts started.
    pub attempts: u32,
    /// Budget.
    pub max_attempts: u32,
    /// Due time.
    pub due_at: Timestamp,
    /// Current or last lease token.
    pub token: Option<u64>,
    /// Lease expiry while leased.
    pub lease_expires_at: Option<Timestamp>,
    /// Kind of the outcome recorded with `token`, if any.
    pub last_outcome: Option<&'static str>,
}

/// One claimed delivery as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelClaim {
    /// Delivery index.
    pub delivery: usize,
    /// Token.
    pub token: u64,
    /// Attempt number.
    pub attempt: u32,
    /// Whether it is a circuit probe.
    pub probe: bool,
}

/// The reference model.
#[derive(Clone, Debug)]
pub struct DeliveryModel {
    /// The model's clock.
    pub now: Timestamp,
    /// Store options.
    pub options: StoreOptions,
    /// Endpoints by index.
    pub endpoints: Vec<ModelEndpoint>,
    /// Deliveries by index.
    pub deliveries: Vec<ModelDelivery>,
    /// The attempt log: (delivery index, attempt number, result).
    pub attempts: Vec<(usize, u32, AttemptResult)>,
    next_seq: i64,
    next_token: u64,
    /// When the claim-time housekeeping (sweep, probes) last ran, as the
    /// adapters' [`control_plane_store_kit::Housekeeping`] gate keeps it.
    housekeeping_at: i64,
}

/// A stable stand-in id for a model delivery, so the circuit (which records
/// its probe by delivery id) works unchanged.
fn model_id(i: usize) -> DeliveryId {
    DeliveryId(uuid::Uuid::from_u128(i as u128 + 1))
}

/// A stand-in id for a model endpoint, for the shared claim rule.
fn model_endpoint_id(e: usize) -> EndpointId {
    EndpointId(uuid::Uuid::from_u128(e as u128 + 1))
}

/// The model's one account.
fn model_account() -> AccountId {
    AccountId::new("model").expect("a valid account id")
}

impl DeliveryModel {
    /// An empty model at `now`.
    pub fn new(now: Timestamp, options: StoreOptions) -> Self {
        DeliveryModel {
            now,
            options,
            endpoints: Vec::new(),
            deliveries: Vec::new(),
            attempts: Vec::new(),
            next_seq: 1,
            next_token: 1,
            housekeeping_at: i64::MIN,
        }
    }

    /// Moves time on.
    pub fn advance(&mut self, d: Duration) {
        self.now = self.now.plus(d);
    }

    /// Adds an endpoint; returns its index.
    pub fn add_endpoint(&mut self, ordered: bool) -> usize {
        self.endpoints.push(ModelEndpoint {
            enabled: true,
            ordered,
            deleted: false,
            circuit: Circuit::closed(),
        });
        self.endpoints.len() - 1
    }

    /// Publishes an event to every endpoint not deleted; returns the new
    /// deliveries' indices in endpoint order.
    pub fn publish(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for e in 0..self.endpoints.len() {
            if self.endpoints[e].deleted {
                continue;
            }
            self.deliveries.push(ModelDelivery {
                endpoint: e,
                seq: self.next_seq,
                state: DeliveryState::Pending,
                attempts: 0,
                max_attempts: self.options.max_attempts,
                due_at: self.now,
                token: None,
                lease_expires_at: None,
                last_outcome: None,
            });
            self.next_seq += 1;
            out.push(self.deliveries.len() - 1);
        }
        out
    }

    /// Enables or disables an endpoint.
    pub fn set_enabled(&mut self, e: usize, enabled: bool) {
        if let Some(ep) = self.endpoints.get_mut(e) {
            ep.enabled = enabled;
        }
    }

    /// Deletes an endpoint, parking its live deliveries as dead.
    pub fn delete_endpoint(&mut self, e: usize) {
        if let Some(ep) = self.endpoints.get_mut(e) {
            ep.deleted = true;
        }
        for d in self.deliveries.iter_mut().filter(|d| d.endpoint == e) {
            if !d.state.is_final() {
                d.state = DeliveryState::Dead;
                d.token = None;
                d.lease_expires_at = None;
            }
        }
    }

    fn apply(&mut self, i: usize, tr: &Transition) {
        let d = &mut self.deliveries[i];
        d.state = tr.state;
        d.due_at = tr.due_at;
        d.lease_expires_at = None;
        let e = d.endpoint;
        let attempt = d.attempts;
        self.attempts.push((i, attempt, tr.attempt.result));
        if tr.disable_reason.is_some() {
            self.endpoints[e].enabled = false;
        }
    }

    fn head_of(&self, e: usize) -> Option<usize> {
        self.deliveries
            .iter()
            .enumerate()
            .filter(|(_, d)| d.endpoint == e && !d.state.is_final())
            .min_by_key(|(_, d)| d.seq)
            .map(|(i, _)| i)
    }

    fn claimable(&self, i: usize) -> bool {
        let d = &self.deliveries[i];
        let ep = &self.endpoints[d.endpoint];
        d.state == DeliveryState::Pending
            && d.due_at <= self.now
            && ep.enabled
            && !ep.deleted
            && (!ep.ordered || self.head_of(d.endpoint) == Some(i))
    }

    /// Frees expired leases, in sequence order.
    fn sweep_expired(&mut self) {
        let now = self.now;
        let mut expired: Vec<usize> = (0..self.deliveries.len())
            .filter(|&i| {
                let d = &self.deliveries[i];
                d.state == DeliveryState::Leased && d.lease_expires_at.is_some_and(|t| t <= now)
            })
            .collect();
        expired.sort_by_key(|&i| self.deliveries[i].seq);
        for i in expired {
            self.plan_and_apply(i, |state, circuit, probe, options| {
                plan_lease_expiry(state, circuit, probe, now, options)
            });
            self.deliveries[i].token = None;
        }
    }

    /// Probes: the first due delivery of each circuit whose cooldown is
    /// over, oldest first, at most `limit`.
    fn due_probes(&self, limit: u32) -> Vec<usize> {
        let key = |i: usize| (self.deliveries[i].due_at, self.deliveries[i].seq);
        let mut probes: Vec<usize> = Vec::new();
        for e in 0..self.endpoints.len() {
            if !self.endpoints[e].circuit.probe_due(self.now) {
                continue;
            }
            let first = (0..self.deliveries.len())
                .filter(|&i| self.deliveries[i].endpoint == e && self.claimable(i))
                .min_by_key(|&i| key(i));
            probes.extend(first);
        }
        probes.sort_by_key(|&i| key(i));
        probes.truncate(limit as usize);
        probes
    }

    /// Ordinary deliveries on closed circuits, up to `rest`, shared fairly
    /// among endpoints within each one's cap (see `flow::share_claim`).
    fn fair_picks(&self, rest: u32) -> Vec<usize> {
        let key = |i: usize| (self.deliveries[i].due_at, self.deliveries[i].seq);
        let mut candidates = Vec::new();
        for e in 0..self.endpoints.len() {
            if !self.endpoints[e].circuit.admits_claims() {
                continue;
            }
            let due: Vec<usize> = (0..self.deliveries.len())
                .filter(|&i| self.deliveries[i].endpoint == e && self.claimable(i))
                .collect();
            let Some(oldest) = due.iter().map(|&i| key(i)).min() else {
                continue;
            };
            let in_flight = self
                .deliveries
                .iter()
                .filter(|d| d.endpoint == e && d.state == DeliveryState::Leased)
                .count();
            candidates.push(FlowCandidate {
                endpoint: model_endpoint_id(e),
                account: model_account(),
                oldest: (oldest.0.as_millis(), oldest.1),
                due: u32::try_from(due.len()).unwrap_or(u32::MAX),
                in_flight: u32::try_from(in_flight).unwrap_or(u32::MAX),
                cap: self.options.endpoint_concurrency,
                rate_room: None,
                ordered: self.endpoints[e].ordered,
            });
        }
        let mut normal: Vec<usize> = Vec::new();
        for (endpoint, n) in
            share_claim(&candidates, rest, &control_plane_core::Throttle::default())
        {
            let e = (0..self.endpoints.len())
                .find(|&e| model_endpoint_id(e) == endpoint)
                .unwrap_or_default();
            let mut due: Vec<usize> = (0..self.deliveries.len())
                .filter(|&i| self.deliveries[i].endpoint == e && self.claimable(i))
                .collect();
            due.sort_by_key(|&i| key(i));
            normal.extend(due.into_iter().take(n as usize));
        }
        normal
    }

    /// Claims up to `limit` deliveries, as the port's claim does.
    pub fn claim(&mut self, limit: u32, lease_for: Duration) -> Vec<ModelClaim> {
        let now = self.now;
        // Housekeeping (the sweep of expired leases, then probes) runs at
        // most once per `Housekeeping::EVERY_MS`, as in the adapters.
        let housekeeping =
            control_plane_store_kit::Housekeeping::due_since(self.housekeeping_at, now);
        if housekeeping {
            self.housekeeping_at = now.as_millis();
            self.sweep_expired();
        }
        let key = |m: &Self, i: usize| (m.deliveries[i].due_at, m.deliveries[i].seq);
        let probes = if housekeeping {
            self.due_probes(limit)
        } else {
            Vec::new()
        };
        let rest = limit.saturating_sub(u32::try_from(probes.len()).unwrap_or(u32::MAX));
        let normal = self.fair_picks(rest);
        let mut picks: Vec<(usize, bool)> = probes
            .into_iter()
            .map(|i| (i, true))
            .chain(normal.into_iter().map(|i| (i, false)))
            .collect();
        picks.sort_by_key(|&(i, _)| key(self, i));
        let mut out = Vec::new();
        for (i, probe) in picks {
            let token = self.next_token;
            self.next_token += 1;
            if probe {
                let e = self.deliveries[i].endpoint;
                self.endpoints[e].circuit.start_probe(model_id(i));
            }
            let d = &mut self.deliveries[i];
            d.state = DeliveryState::Leased;
            d.attempts += 1;
            d.token = Some(token);
            d.lease_expires_at = Some(now.plus(lease_for));
            d.last_outcome = None;
            out.push(ModelClaim {
                delivery: i,
                token,
                attempt: d.attempts,
                probe,
            });
        }
        out
    }

    /// The lease check (`control_plane_core::lease`) on delivery `i`.
    fn fence(&self, i: usize, token: u64, write: FencedWrite<'_>) -> Result<Verdict, ModelError> {
        let held = self.deliveries.get(i).map(|d| Held {
            leased: d.state == DeliveryState::Leased,
            token: d.token,
            expires_at: d.lease_expires_at,
            last_outcome: d.last_outcome,
        });
        Ok(fence(held.as_ref(), &token, write)?)
    }

    /// Records an outcome for delivery `i` under `token`.
    pub fn record(
        &mut self,
        i: usize,
        token: u64,
        outcome: &DeliveryOutcome,
    ) -> Result<(DeliveryState, bool), ModelError> {
        let end = FencedWrite::End {
            kind: outcome.kind(),
        };
        if self.fence(i, token, end)? == Verdict::Repeat {
            return Ok((self.deliveries[i].state, true));
        }
        let now = self.now;
        let tr = self.plan_and_apply(i, |state, circuit, probe, options| {
            plan_outcome(state, outcome, circuit, probe, now, options)
        });
        self.deliveries[i].last_outcome = Some(outcome.kind());
        Ok((tr.state, false))
    }

    /// Plans a transition of delivery `i` with `plan` (given its attempt
    /// state, its endpoint's circuit and whether it is that circuit's probe),
    /// then applies it and the circuit's change.
    fn plan_and_apply(
        &mut self,
        i: usize,
        plan: impl FnOnce(AttemptState, &mut Circuit, bool, &StoreOptions) -> Transition,
    ) -> Transition {
        let d = &self.deliveries[i];
        let (e, state) = (
            d.endpoint,
            AttemptState {
                attempts: d.attempts,
                max_attempts: d.max_attempts,
                due_at: d.due_at,
            },
        );
        let mut circuit = self.endpoints[e].circuit.clone();
        let probe = circuit.is_probe(model_id(i));
        let tr = plan(state, &mut circuit, probe, &self.options);
        self.endpoints[e].circuit = circuit;
        self.apply(i, &tr);
        tr
    }

    /// Releases a lease without consuming the attempt.
    pub fn release(&mut self, i: usize, token: u64) -> Result<(), ModelError> {
        self.fence(i, token, FencedWrite::Within)?;
        let now = self.now;
        let e = self.deliveries[i].endpoint;
        self.endpoints[e].circuit.cancel_probe(model_id(i));
        let d = &mut self.deliveries[i];
        d.state = DeliveryState::Pending;
        d.attempts -= 1;
        d.due_at = now;
        d.token = None;
        d.lease_expires_at = None;
        Ok(())
    }

    /// Extends a live lease.
    pub fn extend(
        &mut self,
        i: usize,
        token: u64,
        lease_for: Duration,
    ) -> Result<Timestamp, ModelError> {
        let now = self.now;
        self.fence(i, token, FencedWrite::Keep { now })?;
        let at = now.plus(lease_for);
        self.deliveries[i].lease_expires_at = Some(at);
        Ok(at)
    }

    /// Replays a dead delivery.
    pub fn replay(&mut self, i: usize) -> Result<(), ModelError> {
        let now = self.now;
        let max = self.options.max_attempts;
        let d = self.deliveries.get(i).ok_or(ModelError::Conflict)?;
        if d.state != DeliveryState::Dead || self.endpoints[d.endpoint].deleted {
            return Err(ModelError::Conflict);
        }
        let d = &mut self.deliveries[i];
        d.state = DeliveryState::Pending;
        d.due_at = now;
        d.max_attempts = d.attempts + max;
        d.token = None;
        d.last_outcome = None;
        Ok(())
    }
}

/// A model task of the workflow queue (one account).
#[derive(Clone, Debug)]
pub struct ModelTask {
    /// Id.
    pub id: control_plane_core::TaskId,
    /// Kind.
    pub kind: String,
    /// Payload.
    pub payload: serde_json::Value,
    /// State.
    pub state: control_plane_core::TaskState,
    /// Attempts started.
    pub attempts: u32,
    /// Budget.
    pub max_attempts: u32,
    /// Due time.
    pub run_at: Timestamp,
    /// Current or last token.
    pub token: Option<u64>,
    /// Lease expiry while leased.
    pub expires_at: Option<Timestamp>,
    /// Staged result.
    pub staged: Option<serde_json::Value>,
    /// Final result.
    pub result: Option<serde_json::Value>,
    /// Last error.
    pub last_error: Option<String>,
    /// Kind of the outcome recorded with `token`.
    pub last_outcome: Option<&'static str>,
}

/// The reference model of the workflow queue. Tasks are addressed by index
/// in enqueue order, which is also the queue's tie-break order.
#[derive(Clone, Debug)]
pub struct WorkflowModel {
    /// Clock.
    pub now: Timestamp,
    /// Retry policy.
    pub policy: control_plane_core::WorkflowPolicy,
    /// Tasks.
    pub tasks: Vec<ModelTask>,
    next_token: u64,
}

impl WorkflowModel {
    /// An empty queue at `now`.
    pub fn new(now: Timestamp, policy: control_plane_core::WorkflowPolicy) -> Self {
        WorkflowModel {
            now,
            policy,
            tasks: Vec::new(),
            next_token: 1,
        }
    }

    /// Enqueues; `(index, created)`.
    pub fn enqueue(
        &mut self,
        id: control_plane_core::TaskId,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(usize, bool), ModelError> {
        use control_plane_core::TaskState;
        if let Some(i) = self.tasks.iter().position(|t| t.id == id) {
            let t = &self.tasks[i];
            return if t.kind == kind && t.payload == payload {
                Ok((i, false))
            } else {
                Err(ModelError::Conflict)
            };
        }
        self.tasks.push(ModelTask {
            id,
            kind: kind.to_string(),
            payload,
            state: TaskState::Pending,
            attempts: 0,
            max_attempts: self.policy.max_attempts,
            run_at: self.now,
            token: None,
            expires_at: None,
            staged: None,
            result: None,
            last_error: None,
            last_outcome: None,
        });
        Ok((self.tasks.len() - 1, true))
    }

    /// Claims; `(index, token, attempt)` in claim order.
    pub fn claim(
        &mut self,
        kinds: &[&str],
        limit: u32,
        lease_for: Duration,
    ) -> Vec<(usize, u64, u32)> {
        use control_plane_core::TaskState;
        let now = self.now;
        for t in self.tasks.iter_mut() {
            if t.state == TaskState::Leased && t.expires_at.is_some_and(|e| e <= now) {
                t.token = None;
                t.expires_at = None;
                if let Some(v) = t.staged.take() {
                    t.state = TaskState::Completed;
                    t.result = Some(v);
                } else if t.attempts >= t.max_attempts {
                    t.state = TaskState::DeadLettered;
                    t.last_error = Some("lease expired before the worker reported".into());
                } else {
                    t.state = TaskState::Pending;
                    t.run_at = now;
                    t.last_error = Some("lease expired before the worker reported".into());
                }
            }
        }
        let mut due: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| {
                let t = &self.tasks[i];
                t.state == TaskState::Pending && t.run_at <= now && kinds.contains(&t.kind.as_str())
            })
            .collect();
        due.sort_by_key(|&i| (self.tasks[i].run_at, i));
        due.truncate(limit as usize);
        let mut out = Vec::new();
        for i in due {
            let token = self.next_token;
            self.next_token += 1;
            let t = &mut self.tasks[i];
            t.state = TaskState::Leased;
            t.attempts += 1;
            t.token = Some(token);
            t.expires_at = Some(now.plus(lease_for));
            t.last_outcome = None;
            out.push((i, token, t.attempts));
        }
        out
    }

    /// The lease check (`control_plane_core::lease`) on task `i`.
    fn fence(&self, i: usize, token: u64, write: FencedWrite<'_>) -> Result<Verdict, ModelError> {
        let held = self.tasks.get(i).map(|t| Held {
            leased: t.state == control_plane_core::TaskState::Leased,
            token: t.token,
            expires_at: t.expires_at,
            last_outcome: t.last_outcome,
        });
        Ok(fence(held.as_ref(), &token, write)?)
    }

    /// Heartbeat.
    pub fn heartbeat(
        &mut self,
        i: usize,
        token: u64,
        lease_for: Duration,
    ) -> Result<Timestamp, ModelError> {
        let now = self.now;
        self.fence(i, token, FencedWrite::Keep { now })?;
        let at = now.plus(lease_for);
        self.tasks[i].expires_at = Some(at);
        Ok(at)
    }

    /// Stages a result.
    pub fn stage(&mut self, i: usize, token: u64, v: serde_json::Value) -> Result<(), ModelError> {
        self.fence(i, token, FencedWrite::Within)?;
        self.tasks[i].staged = Some(v);
        Ok(())
    }

    /// Completes.
    pub fn complete(
        &mut self,
        i: usize,
        token: u64,
        v: serde_json::Value,
    ) -> Result<control_plane_core::TaskState, ModelError> {
        use control_plane_core::TaskState;
        if self.fence(i, token, FencedWrite::End { kind: "complete" })? == Verdict::Repeat {
            return Ok(self.tasks[i].state);
        }
        let t = &mut self.tasks[i];
        t.state = TaskState::Completed;
        t.result = Some(v);
        t.staged = None;
        t.expires_at = None;
        t.last_outcome = Some("complete");
        Ok(t.state)
    }

    /// Fails.
    pub fn fail(
        &mut self,
        i: usize,
        token: u64,
        error: &str,
        retryable: bool,
    ) -> Result<control_plane_core::TaskState, ModelError> {
        use control_plane_core::TaskState;
        if self.fence(i, token, FencedWrite::End { kind: "fail" })? == Verdict::Repeat {
            return Ok(self.tasks[i].state);
        }
        let now = self.now;
        let policy = self.policy;
        let t = &mut self.tasks[i];
        if !retryable || t.attempts >= t.max_attempts {
            t.state = TaskState::DeadLettered;
        } else {
            t.state = TaskState::Pending;
            t.run_at = now.plus(policy.backoff(&t.id, t.attempts));
        }
        t.last_error = Some(error.to_string());
        t.staged = None;
        t.expires_at = None;
        t.last_outcome = Some("fail");
        Ok(t.state)
    }

    /// Releases.
    pub fn release(&mut self, i: usize, token: u64) -> Result<(), ModelError> {
        self.fence(i, token, FencedWrite::Within)?;
        let now = self.now;
        let t = &mut self.tasks[i];
        t.state = control_plane_core::TaskState::Pending;
        t.attempts -= 1;
        t.run_at = now;
        t.token = None;
        t.expires_at = None;
        t.staged = None;
        Ok(())
    }

    /// Retries a dead letter.
    pub fn retry_dead(&mut self, i: usize) -> Result<(), ModelError> {
        let now = self.now;
        let max = self.policy.max_attempts;
        let t = self.tasks.get_mut(i).ok_or(ModelError::Conflict)?;
        if t.state != control_plane_core::TaskState::DeadLettered {
            return Err(ModelError::Conflict);
        }
        t.state = control_plane_core::TaskState::Pending;
        t.run_at = now;
        t.max_attempts = t.attempts + max;
        t.token = None;
        t.last_outcome = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use control_plane_core::AttemptReport;

    #[test]
    fn model_claims_each_delivery_once_and_orders_an_ordered_endpoint() {
        let mut m = DeliveryModel::new(Timestamp::from_millis(0), StoreOptions::default());
        let e = m.add_endpoint(true);
        m.publish();
        m.publish();
        let c = m.claim(10, Duration::from_secs(30));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].delivery, 0);
        assert!(m.claim(10, Duration::from_secs(30)).is_empty());
        let ok = DeliveryOutcome::Delivered(AttemptReport::default());
        assert_eq!(
            m.record(0, c[0].token, &ok),
            Ok((DeliveryState::Delivered, false))
        );
        assert_eq!(
            m.record(0, c[0].token, &ok),
            Ok((DeliveryState::Delivered, true))
        );
        let c2 = m.claim(10, Duration::from_secs(30));
        assert_eq!(c2.len(), 1);
        assert_eq!(c2[0].delivery, 1);
        m.delete_endpoint(e);
        assert_eq!(m.deliveries[1].state, DeliveryState::Dead);
    }
}
