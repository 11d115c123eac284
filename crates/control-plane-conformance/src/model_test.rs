//! The model-based property test: the reference model and an adapter get the
//! same random operations, and every result and every delivery's state must
//! agree.

use proptest::prelude::{any, prop_oneof, Just, Strategy};
use std::time::Duration;

use crate::model::{DeliveryModel, ModelClaim, ModelError};
use control_plane_core::{
    AccountId, AttemptReport, BreakerPolicy, ClaimRequest, Delivery, DeliveryId,
    DeliveryListRequest, DeliveryOutcome, Enablement, EndpointCreateRequest, EndpointKey, Lease,
    PageRequest, PublishRequest, Secret, StoreError, StoreOptions, StoreResult, TaskClaimRequest,
    TaskEnqueueRequest, TaskFailed, TaskFailure, TaskHeartbeat, TaskId, TaskLease, Timestamp,
    WorkflowPolicy,
};

use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::StoreFactory;
use control_plane_core::{Check, Clock};

const ENDPOINTS: usize = 3;

/// One random operation.
#[derive(Clone, Debug)]
pub enum Op {
    /// Publish one event to every endpoint.
    Publish,
    /// Claim up to `limit` with a lease of `lease_s` seconds.
    Claim { limit: u32, lease_s: u64 },
    /// Record an outcome (0 delivered, 1 retry in 10 s, 2 give up, 3 gone) on a lease ever handed out.
    Record { lease: usize, kind: u8 },
    /// Release a lease.
    Release { lease: usize },
    /// Extend a lease.
    Extend { lease: usize, secs: u64 },
    /// Move both clocks.
    Advance { secs: u64 },
    /// Replay a delivery.
    Replay { delivery: usize },
    /// Enable or disable an endpoint.
    SetEnabled { endpoint: usize, enabled: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Publish),
        4 => (1u32..4, 5u64..60).prop_map(|(limit, lease_s)| Op::Claim { limit, lease_s }),
        5 => (0usize..64, 0u8..4).prop_map(|(lease, kind)| Op::Record { lease, kind }),
        1 => (0usize..64).prop_map(|lease| Op::Release { lease }),
        1 => (0usize..64, 1u64..60).prop_map(|(lease, secs)| Op::Extend { lease, secs }),
        3 => (0u64..90).prop_map(|secs| Op::Advance { secs }),
        1 => (0usize..64).prop_map(|delivery| Op::Replay { delivery }),
        1 => (0usize..ENDPOINTS, any::<bool>()).prop_map(|(endpoint, enabled)| Op::SetEnabled { endpoint, enabled }),
    ]
}

fn options() -> StoreOptions {
    StoreOptions {
        max_attempts: 3,
        breaker: BreakerPolicy {
            failure_threshold: 2,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(120),
        },
        disable_after: Duration::from_secs(600),
        ..StoreOptions::default()
    }
}

fn outcome(kind: u8, now: Timestamp) -> DeliveryOutcome {
    let report = AttemptReport {
        status_code: Some(500),
        error: None,
        latency_ms: 1,
        response_body: None,
    };
    match kind {
        0 => DeliveryOutcome::Delivered(AttemptReport {
            status_code: Some(200),
            ..report
        }),
        1 => DeliveryOutcome::Retry {
            at: now.plus(Duration::from_secs(10)),
            report,
        },
        2 => DeliveryOutcome::GiveUp(report),
        _ => DeliveryOutcome::Gone(AttemptReport {
            status_code: Some(410),
            ..report
        }),
    }
}

fn same<T: std::fmt::Debug, U: std::fmt::Debug>(
    what: &str,
    model: Result<T, ModelError>,
    real: StoreResult<U>,
    eq: impl Fn(&T, &U) -> bool,
) -> Result<(), String> {
    let ok = match (&model, &real) {
        (Ok(m), Ok(r)) => eq(m, r),
        (Err(ModelError::LeaseLost), Err(StoreError::LeaseLost)) => true,
        (Err(ModelError::Conflict), Err(StoreError::Conflict(_))) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: model {model:?}, adapter {real:?}"))
    }
}

async fn run_case(factory: &dyn StoreFactory, ops: Vec<Op>) -> Result<(), String> {
    let h = factory.open(options()).await;
    let account = AccountId::new("model").map_err(|e| e.to_string())?;
    let mut model = DeliveryModel::new(h.clock.now(), options());
    let mut created = Vec::new();
    for i in 0..ENDPOINTS {
        let mut req = EndpointCreateRequest::new(
            account.clone(),
            "https://example.com/m",
            Secret::new("whsec_bW1tbW1tbW1tbW1tbW1tbW1tbW1tbW1t"),
        );
        req.ordered = i == 0;
        created.push((
            h.store
                .endpoint_create(req.checked().unwrap())
                .await
                .map_err(|e| e.to_string())?
                .id,
            i == 0,
        ));
    }
    // Publish fans out in endpoint-id order; the model in index order.
    created.sort();
    let mut endpoints = Vec::new();
    for (id, ordered) in created {
        endpoints.push(id);
        model.add_endpoint(ordered);
    }
    let mut deliveries: Vec<DeliveryId> = Vec::new();
    let mut leases: Vec<(ModelClaim, Lease)> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let now = h.clock.now();
        match op.clone() {
            Op::Publish => {
                let expected = model.publish();
                let p = h
                    .store
                    .event_publish(
                        PublishRequest::new(
                            account.clone(),
                            "t",
                            serde_json::json!({"step": step}),
                        )
                        .checked()
                        .unwrap(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if p.deliveries.len() != expected.len() {
                    return Err(format!(
                        "publish made {} deliveries, model {}",
                        p.deliveries.len(),
                        expected.len()
                    ));
                }
                for m in expected {
                    let want = endpoints[model.deliveries[m].endpoint];
                    let mut found = None;
                    for d in &p.deliveries {
                        if h.store
                            .delivery_get(&account, *d)
                            .await
                            .map_err(|e| e.to_string())?
                            .endpoint_id
                            == want
                        {
                            found = Some(*d);
                        }
                    }
                    deliveries.push(found.ok_or("publish missed an endpoint")?);
                }
            }
            Op::Claim { limit, lease_s } => {
                let lease_for = Duration::from_secs(lease_s);
                let m = model.claim(limit, lease_for);
                let r = h
                    .store
                    .delivery_claim(ClaimRequest::new("m", limit, lease_for).unwrap())
                    .await
                    .map_err(|e| e.to_string())?;
                let mv: Vec<_> = m
                    .iter()
                    .map(|c| (deliveries[c.delivery], c.attempt, c.probe))
                    .collect();
                let rv: Vec<_> = r
                    .iter()
                    .map(|c| (c.delivery.id, c.lease.attempt, c.probe))
                    .collect();
                if mv != rv {
                    return Err(format!("step {step} claim: model {mv:?}, adapter {rv:?}"));
                }
                leases.extend(m.into_iter().zip(r.into_iter().map(|c| c.lease)));
            }
            Op::Record { lease, kind } if !leases.is_empty() => {
                let (mc, l) = leases[lease % leases.len()].clone();
                let o = outcome(kind, now);
                let m = model.record(mc.delivery, mc.token, &o);
                let r = h.store.delivery_record_outcome(&l, o).await;
                same(&format!("step {step} record"), m, r, |m, r| {
                    m.0 == r.state && m.1 == r.duplicate
                })?;
            }
            Op::Release { lease } if !leases.is_empty() => {
                let (mc, l) = leases[lease % leases.len()].clone();
                let m = model.release(mc.delivery, mc.token);
                let r = h.store.delivery_release(&l).await;
                same(&format!("step {step} release"), m, r, |_, _| true)?;
            }
            Op::Extend { lease, secs } if !leases.is_empty() => {
                let (mc, l) = leases[lease % leases.len()].clone();
                let d = Duration::from_secs(secs);
                let m = model.extend(mc.delivery, mc.token, d);
                let r = h.store.delivery_extend(&l, d).await;
                same(&format!("step {step} extend"), m, r, |m, r| {
                    *m == r.expires_at
                })?;
            }
            Op::Advance { secs } => {
                model.advance(Duration::from_secs(secs));
                h.clock.advance(Duration::from_secs(secs));
            }
            Op::Replay { delivery } if !deliveries.is_empty() => {
                let i = delivery % deliveries.len();
                let m = model.replay(i);
                let r = h.store.delivery_replay(&account, deliveries[i]).await;
                same(&format!("step {step} replay"), m, r, |_, _| true)?;
            }
            Op::SetEnabled { endpoint, enabled } => {
                model.set_enabled(endpoint, enabled);
                h.store
                    .endpoint_set_enabled(
                        EndpointKey::new(&account, endpoints[endpoint]),
                        if enabled {
                            Enablement::Enabled
                        } else {
                            Enablement::Disabled { reason: None }
                        },
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            _ => {}
        }
        let listed = h
            .store
            .delivery_list(DeliveryListRequest::all(
                account.clone(),
                PageRequest::first(1000),
            ))
            .await
            .map_err(|e| e.to_string())?;
        let by_id: std::collections::HashMap<DeliveryId, Delivery> =
            listed.items.into_iter().map(|d| (d.id, d)).collect();
        if by_id.len() != deliveries.len() {
            return Err(format!(
                "after step {step}: adapter has {} deliveries, model {}",
                by_id.len(),
                deliveries.len()
            ));
        }
        for (i, id) in deliveries.iter().enumerate() {
            let d = by_id.get(id).ok_or("a delivery vanished")?;
            let m = &model.deliveries[i];
            if (d.state, d.attempts, d.max_attempts, d.due_at)
                != (m.state, m.attempts, m.max_attempts, m.due_at)
            {
                return Err(format!(
                    "after step {step} ({op:?}) delivery {i}: adapter {:?}/{}/{}/{:?}, model {:?}/{}/{}/{:?}",
                    d.state, d.attempts, d.max_attempts, d.due_at, m.state, m.attempts, m.max_attempts, m.due_at
                ));
            }
        }
        let listed = h
            .store
            .endpoint_list(&account)
            .await
            .map_err(|e| e.to_string())?;
        for (i, id) in endpoints.iter().enumerate() {
            let c = h
                .store
                .circuit_get(&account, *id)
                .await
                .map_err(|e| e.to_string())?;
            let e = listed
                .iter()
                .find(|e| e.id == *id)
                .ok_or("an endpoint vanished")?;
            let m = &model.endpoints[i];
            if c.mode != m.circuit.mode
                || c.open_until != m.circuit.open_until
                || e.enabled != m.enabled
            {
                return Err(format!(
                    "after step {step} ({op:?}) endpoint {i}: adapter {:?}/{:?}/{}, model {:?}/{:?}/{}",
                    c.mode, c.open_until, e.enabled, m.circuit.mode, m.circuit.open_until, m.enabled
                ));
            }
        }
    }
    for (i, id) in deliveries.iter().enumerate() {
        let log = h
            .store
            .attempt_list_for_delivery(&account, *id)
            .await
            .map_err(|e| e.to_string())?;
        let real: Vec<_> = log.iter().map(|a| (a.attempt, a.result)).collect();
        let want: Vec<_> = model
            .attempts
            .iter()
            .filter(|(d, _, _)| *d == i)
            .map(|(_, n, r)| (*n, *r))
            .collect();
        if real != want {
            return Err(format!(
                "attempt log of delivery {i}: adapter {real:?}, model {want:?}"
            ));
        }
    }
    Ok(())
}

/// Runs `case` on `PROPTEST_CASES` (default 16) random sequences of up to 40
/// operations drawn from `op`, each on its own runtime-driven store.
fn run_cases<O, F, Fut>(what: &str, op: impl Strategy<Value = O>, case: F)
where
    O: Clone + std::fmt::Debug,
    F: Fn(Vec<O>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runner.run(&proptest::collection::vec(op, 1..40), |ops| {
        rt.block_on(case(ops)).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("the adapter disagrees with the {what} model: {e}");
    }
}

/// Runs the delivery model-based test against `factory`.
pub fn run(factory: &dyn StoreFactory) {
    run_cases("delivery", op(), |ops| run_case(factory, ops));
}

/// Sequences the random runs once found the adapters and the model to
/// disagree on, replayed on every run.
pub fn run_found(factory: &dyn StoreFactory) {
    let found = vec![vec![
        Op::Publish,
        Op::Publish,
        Op::Claim {
            limit: 2,
            lease_s: 5,
        },
        Op::Record { lease: 14, kind: 2 },
        Op::Claim {
            limit: 2,
            lease_s: 57,
        },
        Op::Record { lease: 39, kind: 2 },
        Op::Advance { secs: 58 },
        Op::Claim {
            limit: 2,
            lease_s: 11,
        },
        Op::Replay { delivery: 60 },
        Op::Claim {
            limit: 1,
            lease_s: 9,
        },
    ]];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    for ops in found {
        if let Err(e) = rt.block_on(run_case(factory, ops.clone())) {
            panic!("the adapter disagrees with the delivery model on {ops:?}: {e}");
        }
    }
}

/// One random operation on the workflow queue.
#[derive(Clone, Debug)]
pub enum TaskOp {
    /// Enqueue task `id` (of 4) with kind and payload variants (a repeat with
    /// other variants must conflict).
    Enqueue { id: u8, kind: u8, payload: u8 },
    /// Claim kinds by mask (bit 0: `a`, bit 1: `b`).
    Claim { kinds: u8, limit: u32, lease_s: u64 },
    /// Heartbeat a lease.
    Heartbeat { lease: usize, secs: u64 },
    /// Stage a result.
    Stage { lease: usize },
    /// Complete.
    Complete { lease: usize },
    /// Fail.
    Fail { lease: usize, retryable: bool },
    /// Release.
    Release { lease: usize },
    /// Move the clocks.
    Advance { secs: u64 },
    /// Retry a dead letter.
    RetryDead { task: u8 },
}

fn task_op() -> impl Strategy<Value = TaskOp> {
    prop_oneof![
        3 => (0u8..4, 0u8..2, 0u8..2).prop_map(|(id, kind, payload)| TaskOp::Enqueue { id, kind, payload }),
        4 => (1u8..4, 1u32..3, 5u64..40).prop_map(|(kinds, limit, lease_s)| TaskOp::Claim { kinds, limit, lease_s }),
        1 => (0usize..32, 1u64..40).prop_map(|(lease, secs)| TaskOp::Heartbeat { lease, secs }),
        1 => (0usize..32).prop_map(|lease| TaskOp::Stage { lease }),
        2 => (0usize..32).prop_map(|lease| TaskOp::Complete { lease }),
        3 => (0usize..32, any::<bool>()).prop_map(|(lease, retryable)| TaskOp::Fail { lease, retryable }),
        1 => (0usize..32).prop_map(|lease| TaskOp::Release { lease }),
        3 => (0u64..60).prop_map(|secs| TaskOp::Advance { secs }),
        1 => (0u8..4).prop_map(|task| TaskOp::RetryDead { task }),
    ]
}

fn workflow_options() -> StoreOptions {
    StoreOptions {
        workflow: WorkflowPolicy {
            max_attempts: 3,
            backoff_base: Duration::from_secs(4),
            backoff_max: Duration::from_secs(20),
        },
        ..StoreOptions::default()
    }
}

async fn run_workflow_case(factory: &dyn StoreFactory, ops: Vec<TaskOp>) -> Result<(), String> {
    use crate::model::WorkflowModel;
    let h = factory.open(workflow_options()).await;
    let account = AccountId::new("model").map_err(|e| e.to_string())?;
    let mut model = WorkflowModel::new(h.clock.now(), workflow_options().workflow);
    let mut ids: Vec<TaskId> = Vec::new();
    let mut leases: Vec<(usize, u64, TaskLease)> = Vec::new();
    let kinds = ["a", "b"];
    for (step, op) in ops.into_iter().enumerate() {
        let now = h.clock.now();
        let pick =
            |l: usize, leases: &Vec<(usize, u64, TaskLease)>| leases[l % leases.len()].clone();
        match op.clone() {
            TaskOp::Enqueue { id, kind, payload } => {
                let task_id = TaskId::new(format!("task-{id}")).map_err(|e| e.to_string())?;
                let m = model.enqueue(
                    task_id.clone(),
                    kinds[kind as usize],
                    serde_json::json!(payload),
                );
                let r = h
                    .store
                    .workflow_enqueue(
                        TaskEnqueueRequest {
                            id: task_id.clone(),
                            account: account.clone(),
                            kind: kinds[kind as usize].into(),
                            payload: serde_json::json!(payload),
                            run_at: None,
                        }
                        .checked()
                        .unwrap(),
                    )
                    .await;
                same(&format!("step {step} enqueue"), m, r, |m, r| {
                    m.1 == r.created
                })?;
                if !ids.contains(&task_id) && model.tasks.iter().any(|t| t.id == task_id) {
                    ids.push(task_id);
                }
            }
            TaskOp::Claim {
                kinds: mask,
                limit,
                lease_s,
            } => {
                let ks: Vec<&str> = kinds
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, k)| *k)
                    .collect();
                let lease_for = Duration::from_secs(lease_s);
                let m = model.claim(&ks, limit, lease_for);
                let r = h
                    .store
                    .workflow_claim(
                        TaskClaimRequest::new(
                            "m",
                            ks.iter().map(|k| k.to_string()).collect(),
                            limit,
                            lease_for,
                        )
                        .unwrap(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let mv: Vec<_> = m
                    .iter()
                    .map(|(i, _, a)| (model.tasks[*i].id.clone(), *a))
                    .collect();
                let rv: Vec<_> = r
                    .iter()
                    .map(|c| (c.task.id.clone(), c.lease.attempt))
                    .collect();
                if mv != rv {
                    return Err(format!("step {step} claim: model {mv:?}, adapter {rv:?}"));
                }
                leases.extend(m.into_iter().zip(r).map(|((i, t, _), c)| (i, t, c.lease)));
            }
            TaskOp::Heartbeat { lease, secs } if !leases.is_empty() => {
                let (i, t, l) = pick(lease, &leases);
                let d = Duration::from_secs(secs);
                same(
                    &format!("step {step} heartbeat"),
                    model.heartbeat(i, t, d),
                    h.store
                        .workflow_heartbeat(&l, TaskHeartbeat::extend(d))
                        .await,
                    |m, r| *m == r.expires_at,
                )?;
            }
            TaskOp::Stage { lease } if !leases.is_empty() => {
                let (i, t, l) = pick(lease, &leases);
                let v = serde_json::json!({"staged": step});
                same(
                    &format!("step {step} stage"),
                    model.stage(i, t, v.clone()),
                    h.store.workflow_stage_result(&l, v).await,
                    |_, _| true,
                )?;
            }
            TaskOp::Complete { lease } if !leases.is_empty() => {
                let (i, t, l) = pick(lease, &leases);
                let v = serde_json::json!({"done": step});
                same(
                    &format!("step {step} complete"),
                    model.complete(i, t, v.clone()),
                    h.store.workflow_complete(&l, v).await,
                    |m, r| *m == r.state,
                )?;
            }
            TaskOp::Fail { lease, retryable } if !leases.is_empty() => {
                let (i, t, l) = pick(lease, &leases);
                let m = model.fail(i, t, "boom", retryable);
                let failure = if retryable {
                    TaskFailure::Retryable
                } else {
                    TaskFailure::Permanent
                };
                let r = h
                    .store
                    .workflow_fail(
                        &l,
                        TaskFailed {
                            error: "boom".into(),
                            failure,
                        },
                    )
                    .await;
                same(&format!("step {step} fail"), m, r, |m, r| *m == r.state)?;
            }
            TaskOp::Release { lease } if !leases.is_empty() => {
                let (i, t, l) = pick(lease, &leases);
                same(
                    &format!("step {step} release"),
                    model.release(i, t),
                    h.store.workflow_release(&l).await,
                    |_, _| true,
                )?;
            }
            TaskOp::Advance { secs } => {
                model.now = model.now.plus(Duration::from_secs(secs));
                h.clock.advance(Duration::from_secs(secs));
            }
            TaskOp::RetryDead { task } if !ids.is_empty() => {
                let id = ids[task as usize % ids.len()].clone();
                let i = model
                    .tasks
                    .iter()
                    .position(|t| t.id == id)
                    .ok_or("model lost a task")?;
                same(
                    &format!("step {step} retry"),
                    model.retry_dead(i),
                    h.store.workflow_retry_dead(&account, &id).await,
                    |_, _| true,
                )?;
            }
            _ => {}
        }
        let _ = now;
        for m in &model.tasks {
            let t = h
                .store
                .workflow_get(&account, &m.id)
                .await
                .map_err(|e| e.to_string())?;
            let got = (
                t.state,
                t.attempts,
                t.max_attempts,
                t.run_at,
                t.result.clone(),
            );
            let want = (
                m.state,
                m.attempts,
                m.max_attempts,
                m.run_at,
                m.result.clone(),
            );
            if got != want {
                return Err(format!(
                    "after step {step} ({op:?}) task {}: adapter {got:?}, model {want:?}",
                    m.id
                ));
            }
        }
    }
    Ok(())
}

/// Runs the workflow model-based test against `factory`.
pub fn run_workflow(factory: &dyn StoreFactory) {
    run_cases("workflow", task_op(), |ops| run_workflow_case(factory, ops));
}
