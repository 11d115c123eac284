//! Contracts of the workflow queue, idempotency, ticks, usage, alerts and
//! maintenance. Re-exported by [`crate::contracts`].

use std::time::Duration;

use control_plane_core::maintenance::run_maintenance;
use control_plane_core::*;
use serde_json::json;

use crate::{Harness, StoreFactory};

const LEASE: Duration = Duration::from_secs(30);

fn acct(s: &str) -> AccountId {
    AccountId::new(s).unwrap()
}

fn tid(s: &str) -> TaskId {
    TaskId::new(s).unwrap()
}

fn task(id: &str, account: &str, kind: &str) -> TaskEnqueueRequest {
    TaskEnqueueRequest {
        id: tid(id),
        account: acct(account),
        kind: kind.into(),
        payload: json!({"id": id}),
        run_at: None,
    }
}

fn with_workflow(max_attempts: u32) -> StoreOptions {
    StoreOptions {
        workflow: WorkflowPolicy {
            max_attempts,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
        },
        ..StoreOptions::default()
    }
}

/// An endpoint of `account` that receives every event.
async fn endpoint_for_all(h: &Harness, account: &str) -> Endpoint {
    h.store
        .endpoint_create(EndpointCreateRequest::new(
            acct(account),
            "https://example.com/x",
            Secret::new("whsec_eA=="),
        ))
        .await
        .unwrap()
}

/// Claims up to `limit` due deliveries.
async fn claim_deliveries(h: &Harness, limit: u32) -> Vec<ClaimedDelivery> {
    h.store
        .delivery_claim(ClaimRequest::new("w", limit, LEASE))
        .await
        .unwrap()
}

async fn claim_kinds(h: &Harness, kinds: &[&str], limit: u32) -> Vec<ClaimedTask> {
    h.store
        .workflow_claim(TaskClaimRequest {
            worker: "w".into(),
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
            limit,
            lease_for: LEASE,
        })
        .await
        .unwrap()
}

/// `WorkflowStore::workflow_enqueue`: idempotent by id within an account; a
/// different kind or payload conflicts; another account's same id is its own task.
pub async fn workflow_enqueue_is_idempotent_and_conflicts_on_difference(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let first = h
        .store
        .workflow_enqueue(task("t1", "a", "email"))
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(first.task.state, TaskState::Pending);
    assert_eq!(first.task.run_at, h.clock.now());
    let again = h
        .store
        .workflow_enqueue(task("t1", "a", "email"))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.task, first.task);
    // Another account may use the same id: a task of its own, created, and
    // no hint that account "a" has one.
    let theirs = h
        .store
        .workflow_enqueue(task("t1", "b", "sms"))
        .await
        .unwrap();
    assert!(theirs.created, "{theirs:?}");
    assert_eq!(theirs.task.account, acct("b"));
    assert_eq!(theirs.task.kind, "sms");
    assert_eq!(
        h.store.workflow_get(&acct("a"), &tid("t1")).await.unwrap(),
        first.task,
        "account a's task is untouched"
    );
    for other in [
        task("t1", "a", "sms"),
        TaskEnqueueRequest {
            payload: json!({"x": 1}),
            ..task("t1", "a", "email")
        },
    ] {
        let r = h.store.workflow_enqueue(other).await;
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    }
    let bad = h.store.workflow_enqueue(task("t2", "a", "")).await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
    // Both tasks named t1 are claimable, each leased under its own account,
    // and completing one leaves the other leased.
    let claimed = claim_kinds(&h, &["email", "sms"], 10).await;
    let mut owners: Vec<(String, String)> = claimed
        .iter()
        .map(|c| (c.lease.account.as_str().to_string(), c.task.kind.clone()))
        .collect();
    owners.sort();
    assert_eq!(
        owners,
        vec![("a".into(), "email".into()), ("b".into(), "sms".into())]
    );
    let b_lease = claimed
        .iter()
        .find(|c| c.lease.account == acct("b"))
        .unwrap()
        .lease
        .clone();
    let done = h.store.workflow_complete(&b_lease, json!(1)).await.unwrap();
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.account, acct("b"));
    assert_eq!(
        h.store
            .workflow_get(&acct("a"), &tid("t1"))
            .await
            .unwrap()
            .state,
        TaskState::Leased
    );
}

/// `WorkflowStore::workflow_claim`: only due tasks of the given kinds, oldest first.
pub async fn workflow_claim_takes_due_tasks_of_given_kinds(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let later = h.clock.now().plus(Duration::from_secs(60));
    h.store
        .workflow_enqueue(TaskEnqueueRequest {
            run_at: Some(later),
            ..task("late", "a", "email")
        })
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(1));
    h.store
        .workflow_enqueue(task("e1", "a", "email"))
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(1));
    h.store
        .workflow_enqueue(task("s1", "a", "sms"))
        .await
        .unwrap();
    h.store
        .workflow_enqueue(task("e2", "a", "email"))
        .await
        .unwrap();
    let c = claim_kinds(&h, &["email"], 10).await;
    assert_eq!(
        c.iter().map(|c| c.task.id.as_str()).collect::<Vec<_>>(),
        vec!["e1", "e2"]
    );
    assert!(c
        .iter()
        .all(|c| c.task.state == TaskState::Leased && c.lease.attempt == 1));
    assert_eq!(c[0].lease.account, acct("a"));
    assert!(claim_kinds(&h, &["email"], 10).await.is_empty());
    let s = claim_kinds(&h, &["sms"], 10).await;
    assert_eq!(
        s.iter().map(|c| c.task.id.as_str()).collect::<Vec<_>>(),
        vec!["s1"]
    );
    h.clock.advance(Duration::from_secs(60));
    let c = claim_kinds(&h, &["email", "sms"], 1).await;
    assert_eq!(c[0].task.id, tid("late"));
    let bad = h
        .store
        .workflow_claim(TaskClaimRequest {
            worker: "w".into(),
            kinds: vec![],
            limit: 1,
            lease_for: LEASE,
        })
        .await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
}

/// `WorkflowStore::workflow_claim`: exclusive under concurrent claimers.
pub async fn workflow_claim_is_exclusive_under_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for i in 0..40 {
        h.store
            .workflow_enqueue(task(&format!("t{i}"), "a", "k"))
            .await
            .unwrap();
    }
    let tasks: Vec<_> = (0..6)
        .map(|w| {
            let s = h.store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let c = s
                        .workflow_claim(TaskClaimRequest {
                            worker: format!("w{w}"),
                            kinds: vec!["k".into()],
                            limit: 3,
                            lease_for: LEASE,
                        })
                        .await
                        .unwrap();
                    if c.is_empty() {
                        return mine;
                    }
                    for t in c {
                        s.workflow_complete(&t.lease, json!("ok")).await.unwrap();
                        mine.push(t.task.id);
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (40, 40));
}

/// `WorkflowStore::workflow_fail`: backoff grows, then the task is dead-lettered with the last error.
pub async fn workflow_fail_backs_off_then_dead_letters(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(3)).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    let policy = with_workflow(3).workflow;
    for attempt in 1..=2 {
        let c = claim_kinds(&h, &["k"], 1).await.remove(0);
        assert_eq!(c.lease.attempt, attempt);
        let t = h
            .store
            .workflow_fail(&c.lease, format!("boom {attempt}"), TaskFailure::Retryable)
            .await
            .unwrap();
        let delay = policy.backoff(&tid("t"), attempt);
        assert_eq!(
            (t.state, t.run_at),
            (TaskState::Pending, h.clock.now().plus(delay))
        );
        assert!(
            delay >= Duration::from_secs(5 * u64::from(attempt)),
            "{delay:?}"
        );
        h.clock.advance(delay - Duration::from_millis(1));
        assert!(
            claim_kinds(&h, &["k"], 1).await.is_empty(),
            "not before the backoff"
        );
        h.clock.advance(Duration::from_millis(1));
    }
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    let t = h
        .store
        .workflow_fail(&c.lease, "boom 3".into(), TaskFailure::Retryable)
        .await
        .unwrap();
    assert_eq!(t.state, TaskState::DeadLettered);
    assert_eq!(t.last_error.as_deref(), Some("boom 3"));
    let again = h
        .store
        .workflow_fail(&c.lease, "boom 3".into(), TaskFailure::Retryable)
        .await
        .unwrap();
    assert_eq!(again, t, "a repeated failure is a no-op");
    assert!(matches!(
        h.store.workflow_complete(&c.lease, json!(1)).await,
        Err(StoreError::Conflict(_))
    ));
}

/// `WorkflowStore::workflow_fail`: a non-retryable failure dead-letters at once.
pub async fn workflow_non_retryable_failure_dead_letters_at_once(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(5)).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    let t = h
        .store
        .workflow_fail(&c.lease, "invalid input".into(), TaskFailure::Permanent)
        .await
        .unwrap();
    assert_eq!((t.state, t.attempts), (TaskState::DeadLettered, 1));
    h.clock.advance(Duration::from_secs(3600));
    assert!(claim_kinds(&h, &["k"], 1).await.is_empty());
}

/// `WorkflowStore::workflow_claim`: a staged result is finalized without running the handler again.
pub async fn workflow_staged_result_is_finalized_without_rerun(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    h.store.workflow_enqueue(task("u", "a", "k")).await.unwrap();
    let c = claim_kinds(&h, &["k"], 2).await;
    h.store
        .workflow_stage_result(&c[0].lease, json!({"charged": true}))
        .await
        .unwrap();
    h.clock.advance(LEASE);
    let again = claim_kinds(&h, &["k"], 10).await;
    assert_eq!(
        again.iter().map(|c| c.task.id.as_str()).collect::<Vec<_>>(),
        vec!["u"],
        "t is not handed out again"
    );
    let t = h.store.workflow_get(&acct("a"), &tid("t")).await.unwrap();
    assert_eq!(t.state, TaskState::Completed);
    assert_eq!(t.result, Some(json!({"charged": true})));
    assert_eq!(t.attempts, 1);
}

/// `WorkflowStore::workflow_complete`: another account's lease or read is refused.
pub async fn workflow_account_scoping_fails_closed(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    let forged = TaskLease {
        account: acct("b"),
        ..c.lease.clone()
    };
    assert!(matches!(
        h.store.workflow_complete(&forged, json!(1)).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store
            .workflow_fail(&forged, "x".into(), TaskFailure::Permanent)
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.workflow_get(&acct("b"), &tid("t")).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.workflow_retry_dead(&acct("b"), &tid("t")).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        h.store
            .workflow_get(&acct("a"), &tid("t"))
            .await
            .unwrap()
            .state,
        TaskState::Leased
    );
    let done = h
        .store
        .workflow_complete(&c.lease, json!({"ok": 1}))
        .await
        .unwrap();
    assert_eq!(
        (done.state, done.result.clone()),
        (TaskState::Completed, Some(json!({"ok": 1})))
    );
    assert_eq!(
        h.store
            .workflow_complete(&c.lease, json!({"ok": 1}))
            .await
            .unwrap(),
        done,
        "repeat is a no-op"
    );
}

/// The same task id in two accounts is two tasks: each lease completes,
/// fails, heartbeats and releases its own account's task only, and a lease
/// carried over to the other account (same id, same token) is refused there.
pub async fn workflow_same_id_in_two_accounts_stays_apart(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for a in ["a", "b"] {
        h.store.workflow_enqueue(task("t", a, "k")).await.unwrap();
    }
    let claimed = claim_kinds(&h, &["k"], 2).await;
    assert_eq!(claimed.len(), 2);
    let lease_of = |a: &str| {
        claimed
            .iter()
            .find(|c| c.lease.account == acct(a))
            .unwrap()
            .lease
            .clone()
    };
    let (la, lb) = (lease_of("a"), lease_of("b"));
    let state = |a: &'static str| {
        let store = h.store.clone();
        async move { store.workflow_get(&acct(a), &tid("t")).await.unwrap().state }
    };
    // a's token presented as b's: b's task has another token.
    let crossed = TaskLease {
        account: acct("b"),
        ..la.clone()
    };
    assert!(matches!(
        h.store.workflow_complete(&crossed, json!(0)).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(h.store.workflow_heartbeat(&crossed, LEASE).await.is_err());
    assert_eq!(state("b").await, TaskState::Leased);
    h.store.workflow_complete(&la, json!(1)).await.unwrap();
    assert_eq!(
        (state("a").await, state("b").await),
        (TaskState::Completed, TaskState::Leased)
    );
    h.store.workflow_heartbeat(&lb, LEASE).await.unwrap();
    h.store
        .workflow_fail(&lb, "x".into(), TaskFailure::Permanent)
        .await
        .unwrap();
    assert_eq!(
        (state("a").await, state("b").await),
        (TaskState::Completed, TaskState::DeadLettered)
    );
    let done = h.store.workflow_get(&acct("a"), &tid("t")).await.unwrap();
    assert_eq!(
        done.result,
        Some(json!(1)),
        "b's failure left a's result alone"
    );
}

/// `WorkflowStore::workflow_release`: release keeps the attempt budget.
pub async fn workflow_release_keeps_the_attempt_budget(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(1)).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    for _ in 0..3 {
        let c = claim_kinds(&h, &["k"], 1).await.remove(0);
        assert_eq!(c.lease.attempt, 1);
        h.store.workflow_release(&c.lease).await.unwrap();
        assert_eq!(
            h.store.workflow_release(&c.lease).await,
            Err(StoreError::LeaseLost)
        );
    }
    let t = h.store.workflow_get(&acct("a"), &tid("t")).await.unwrap();
    assert_eq!((t.state, t.attempts), (TaskState::Pending, 0));
}

/// `WorkflowStore::workflow_heartbeat`: extends a live lease; stale and expired leases are lost.
pub async fn workflow_heartbeat_extends_and_stale_lease_is_lost(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    h.clock.advance(Duration::from_secs(20));
    let l = h.store.workflow_heartbeat(&c.lease, LEASE).await.unwrap();
    assert_eq!(l.expires_at, h.clock.now().plus(LEASE));
    h.clock.advance(Duration::from_secs(20));
    assert!(
        claim_kinds(&h, &["k"], 1).await.is_empty(),
        "the heartbeat kept it"
    );
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(
        h.store.workflow_heartbeat(&c.lease, LEASE).await,
        Err(StoreError::LeaseLost)
    );
    let again = claim_kinds(&h, &["k"], 1).await.remove(0);
    assert_eq!(again.lease.attempt, 2);
    assert_eq!(
        h.store.workflow_complete(&c.lease, json!(1)).await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(
        h.store.workflow_stage_result(&c.lease, json!(1)).await,
        Err(StoreError::LeaseLost)
    );
}

/// `WorkflowStore::workflow_claim`: an expired lease makes the task claimable again, and spends an attempt.
pub async fn workflow_expired_lease_is_claimable_again(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(2)).await;
    h.store.workflow_enqueue(task("t", "a", "k")).await.unwrap();
    claim_kinds(&h, &["k"], 1).await.remove(0);
    h.clock.advance(LEASE);
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    assert_eq!(c.lease.attempt, 2);
    h.clock.advance(LEASE);
    assert!(claim_kinds(&h, &["k"], 1).await.is_empty());
    let t = h.store.workflow_get(&acct("a"), &tid("t")).await.unwrap();
    assert_eq!(t.state, TaskState::DeadLettered);
    assert!(t.last_error.unwrap_or_default().contains("lease expired"));
}

/// `WorkflowStore::workflow_list_dead`: dead letters are listed newest first and retried.
pub async fn workflow_dead_letters_are_listed_and_retried(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(1)).await;
    for id in ["t1", "t2", "t3"] {
        h.store.workflow_enqueue(task(id, "a", "k")).await.unwrap();
    }
    h.store
        .workflow_enqueue(task("other", "b", "k"))
        .await
        .unwrap();
    for c in claim_kinds(&h, &["k"], 10).await {
        h.store
            .workflow_fail(
                &c.lease,
                format!("failed {}", c.task.id),
                TaskFailure::Retryable,
            )
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = h
            .store
            .workflow_list_dead(&acct("a"), PageRequest { limit: 2, after })
            .await
            .unwrap();
        seen.extend(p.items.iter().map(|t| t.id.to_string()));
        assert!(p
            .items
            .iter()
            .all(|t| t.state == TaskState::DeadLettered && t.last_error.is_some()));
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, vec!["t3", "t2", "t1"]);
    let t = h
        .store
        .workflow_retry_dead(&acct("a"), &tid("t2"))
        .await
        .unwrap();
    assert_eq!((t.state, t.max_attempts), (TaskState::Pending, 2));
    let c = claim_kinds(&h, &["k"], 10).await;
    assert_eq!(
        c.iter().map(|c| c.task.id.as_str()).collect::<Vec<_>>(),
        vec!["t2"]
    );
    assert!(matches!(
        h.store.workflow_retry_dead(&acct("a"), &tid("t2")).await,
        Err(StoreError::Conflict(_))
    ));
}

/// `IdempotencyStore::idempotency_begin`: started, in progress, replay, mismatch.
pub async fn idempotency_begin_reports_every_outcome(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(3600);
    let IdempotencyBegin::Started(token) = h
        .store
        .idempotency_begin("a:/events", "k1", "h1", ttl)
        .await
        .unwrap()
    else {
        panic!("expected Started");
    };
    assert_eq!(
        h.store
            .idempotency_begin("a:/events", "k1", "h1", ttl)
            .await
            .unwrap(),
        IdempotencyBegin::InProgress
    );
    assert_eq!(
        h.store
            .idempotency_begin("a:/events", "k1", "h2", ttl)
            .await
            .unwrap(),
        IdempotencyBegin::Mismatch
    );
    let resp = StoredResponse {
        status: 202,
        body: "{\"id\":1}".into(),
    };
    h.store
        .idempotency_complete(&token, resp.clone())
        .await
        .unwrap();
    assert_eq!(
        h.store
            .idempotency_begin("a:/events", "k1", "h1", ttl)
            .await
            .unwrap(),
        IdempotencyBegin::Replay(resp)
    );
    assert_eq!(
        h.store
            .idempotency_begin("a:/events", "k1", "h2", ttl)
            .await
            .unwrap(),
        IdempotencyBegin::Mismatch
    );
    assert!(
        matches!(
            h.store
                .idempotency_begin("b:/events", "k1", "h2", ttl)
                .await
                .unwrap(),
            IdempotencyBegin::Started(_)
        ),
        "scopes are separate"
    );
    assert!(matches!(
        h.store.idempotency_begin("", "k", "h", ttl).await,
        Err(StoreError::InvalidInput(_))
    ));
}

/// `IdempotencyStore::idempotency_abandon`: frees the key.
pub async fn idempotency_abandon_frees_the_key(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(60);
    let IdempotencyBegin::Started(t) = h.store.idempotency_begin("s", "k", "h", ttl).await.unwrap()
    else {
        panic!("expected Started");
    };
    h.store.idempotency_abandon(&t).await.unwrap();
    assert_eq!(
        h.store.idempotency_abandon(&t).await,
        Err(StoreError::LeaseLost)
    );
    assert!(matches!(
        h.store
            .idempotency_begin("s", "k", "other", ttl)
            .await
            .unwrap(),
        IdempotencyBegin::Started(_)
    ));
}

/// `IdempotencyStore::idempotency_complete`: a stale token is an error, never a silent success.
pub async fn idempotency_complete_with_a_stale_token_is_an_error(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(60);
    let IdempotencyBegin::Started(old) =
        h.store.idempotency_begin("s", "k", "h", ttl).await.unwrap()
    else {
        panic!("expected Started");
    };
    h.clock.advance(ttl);
    let IdempotencyBegin::Started(new) =
        h.store.idempotency_begin("s", "k", "h", ttl).await.unwrap()
    else {
        panic!("an expired record is free again");
    };
    let resp = StoredResponse {
        status: 200,
        body: "x".into(),
    };
    assert_eq!(
        h.store.idempotency_complete(&old, resp.clone()).await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(
        h.store.idempotency_begin("s", "k", "h", ttl).await.unwrap(),
        IdempotencyBegin::InProgress
    );
    h.store
        .idempotency_complete(&new, resp.clone())
        .await
        .unwrap();
    assert_eq!(
        h.store.idempotency_begin("s", "k", "h", ttl).await.unwrap(),
        IdempotencyBegin::Replay(resp)
    );
}

/// `MaintenanceStore::maintenance_purge`: expired idempotency records are swept.
pub async fn idempotency_records_expire_and_are_swept(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for k in ["a", "b", "c"] {
        h.store
            .idempotency_begin("s", k, "h", Duration::from_secs(10))
            .await
            .unwrap();
    }
    h.store
        .idempotency_begin("s", "keep", "h", Duration::from_secs(100))
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(10));
    let r = h
        .store
        .maintenance_purge(Duration::from_secs(86_400), 2)
        .await
        .unwrap();
    assert_eq!(r.idempotency_records, 2, "batches are bounded");
    let r = h
        .store
        .maintenance_purge(Duration::from_secs(86_400), 2)
        .await
        .unwrap();
    assert_eq!(r.idempotency_records, 1);
    assert_eq!(
        h.store
            .maintenance_purge(Duration::from_secs(86_400), 2)
            .await
            .unwrap()
            .idempotency_records,
        0
    );
    assert_eq!(
        h.store
            .idempotency_begin("s", "keep", "h", Duration::from_secs(100))
            .await
            .unwrap(),
        IdempotencyBegin::InProgress
    );
}

/// `TickStore::tick_claim`: one holder until completion or lease expiry.
pub async fn tick_is_single_flight_until_completed_or_expired(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = h.store.clone();
            tokio::spawn(async move {
                s.tick_claim("sweep", Duration::from_secs(30), Duration::ZERO)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut held = Vec::new();
    for t in tasks {
        held.extend(t.await.unwrap());
    }
    assert_eq!(held.len(), 1, "single flight");
    h.clock.advance(Duration::from_secs(29));
    assert!(h
        .store
        .tick_claim("sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    assert!(h
        .store
        .tick_claim("other", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .is_some());
    h.clock.advance(Duration::from_secs(1));
    let next = h
        .store
        .tick_claim("sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .expect("expired lease");
    assert_eq!(
        h.store.tick_complete(&held[0], json!(1)).await,
        Err(StoreError::LeaseLost)
    );
    h.store.tick_complete(&next, json!(2)).await.unwrap();
    assert!(h
        .store
        .tick_claim("sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .is_some());
    assert!(matches!(
        h.store.tick_claim("", LEASE, Duration::ZERO).await,
        Err(StoreError::InvalidInput(_))
    ));
}

/// `TickStore::tick_claim`: the stored state comes back and the interval holds.
pub async fn tick_state_is_kept_and_interval_respected(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let every = Duration::from_secs(60);
    let t = h
        .store
        .tick_claim("t", LEASE, every)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.state, None);
    h.store
        .tick_complete(&t, json!({"cursor": 42}))
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(59));
    assert!(
        h.store
            .tick_claim("t", LEASE, every)
            .await
            .unwrap()
            .is_none(),
        "not due yet"
    );
    h.clock.advance(Duration::from_secs(1));
    let t = h
        .store
        .tick_claim("t", LEASE, every)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.state, Some(json!({"cursor": 42})));
}

/// `UsageStore::usage_record`: batches are idempotent, totals are per window.
pub async fn usage_batches_are_idempotent_and_queryable_by_window(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let t0 = usage_window(h.clock.now());
    let hour = Duration::from_secs(3600);
    let entry = |account: &str, metric, at: Timestamp, amount| UsageEntry {
        account: acct(account),
        metric,
        at,
        amount,
    };
    let batch = UsageBatch {
        batch_id: "b1".into(),
        entries: vec![
            entry("a", UsageMetric::EventsPublished, t0, 3),
            entry(
                "a",
                UsageMetric::EventsPublished,
                t0.plus(Duration::from_secs(10)),
                2,
            ),
            entry("a", UsageMetric::BytesSent, t0.plus(hour), 100),
            entry("b", UsageMetric::Attempts, t0, 7),
        ],
    };
    assert!(h.store.usage_record(batch.clone()).await.unwrap());
    assert!(
        !h.store.usage_record(batch).await.unwrap(),
        "a repeated batch is not counted twice"
    );
    let more = UsageBatch {
        batch_id: "b2".into(),
        entries: vec![entry("a", UsageMetric::EventsPublished, t0, 1)],
    };
    assert!(h.store.usage_record(more).await.unwrap());
    let rows = h
        .store
        .usage_query(&acct("a"), t0, t0.plus(hour * 2))
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            UsageRow {
                metric: UsageMetric::EventsPublished,
                window_start: t0,
                amount: 6
            },
            UsageRow {
                metric: UsageMetric::BytesSent,
                window_start: t0.plus(hour),
                amount: 100
            },
        ]
    );
    assert_eq!(
        h.store
            .usage_query(&acct("a"), t0.plus(hour), t0.plus(hour * 2))
            .await
            .unwrap()
            .len(),
        1
    );
    let bad = h
        .store
        .usage_record(UsageBatch {
            batch_id: String::new(),
            entries: vec![],
        })
        .await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
}

/// `AlertStore::alert_list`: alerts come with the transitions that raise them.
pub async fn alerts_are_recorded_with_their_transitions(f: &dyn StoreFactory) {
    let opts = StoreOptions {
        max_attempts: 1,
        breaker: BreakerPolicy {
            failure_threshold: 1,
            cooldown: Duration::from_secs(10),
            max_cooldown: Duration::from_secs(10),
        },
        ..StoreOptions::default()
    };
    let h = f.open(opts).await;
    let e = endpoint_for_all(&h, "a").await;
    let publish = || {
        h.store
            .event_publish(PublishRequest::new(acct("a"), "t", json!(1)))
    };
    publish().await.unwrap();
    let claim = || h.store.delivery_claim(ClaimRequest::new("w", 1, LEASE));
    let c = claim().await.unwrap().remove(0);
    let fail = DeliveryOutcome::Retry {
        at: h.clock.now(),
        report: AttemptReport {
            status_code: Some(500),
            error: None,
            latency_ms: 1,
        },
    };
    h.store
        .delivery_record_outcome(&c.lease, fail)
        .await
        .unwrap();
    let kinds = |p: Page<Alert>| p.items.iter().map(|a| a.kind).collect::<Vec<_>>();
    let first = h
        .store
        .alert_list(&acct("a"), PageRequest::first(10))
        .await
        .unwrap();
    assert!(first.items.iter().all(|a| a.endpoint_id == e.id));
    let mut k = kinds(first);
    k.sort_by_key(|k| k.as_str());
    assert_eq!(k, vec![AlertKind::CircuitOpened, AlertKind::DeliveryDead]);
    h.clock.advance(Duration::from_secs(10));
    publish().await.unwrap();
    let probe = claim().await.unwrap().remove(0);
    let gone = DeliveryOutcome::Gone(AttemptReport {
        status_code: Some(410),
        error: None,
        latency_ms: 1,
    });
    h.store
        .delivery_record_outcome(&probe.lease, gone)
        .await
        .unwrap();
    let all = h
        .store
        .alert_list(&acct("a"), PageRequest::first(10))
        .await
        .unwrap();
    assert!(
        all.items.windows(2).all(|w| w[0].id > w[1].id),
        "newest first"
    );
    let newest: Vec<_> = all.items.iter().take(3).map(|a| a.kind).collect();
    assert!(newest.contains(&AlertKind::EndpointDisabled), "{newest:?}");
    assert!(
        newest.contains(&AlertKind::CircuitOpened),
        "a failed probe re-opens: {newest:?}"
    );
    assert!(h
        .store
        .alert_list(&acct("b"), PageRequest::first(10))
        .await
        .unwrap()
        .items
        .is_empty());
}

/// Alerts are published as events, in the transaction that raised them, to
/// the account's endpoints that name the alert type; never to the endpoint
/// concerned, never to catch-all endpoints, never to another account.
pub async fn alerts_are_published_to_endpoints_that_subscribe_by_name(f: &dyn StoreFactory) {
    let opts = StoreOptions {
        max_attempts: 1,
        ..StoreOptions::default()
    };
    let h = f.open(opts).await;
    let create = |account: &str, types: Vec<&str>| {
        let mut req = EndpointCreateRequest::new(
            acct(account),
            "https://example.com/x",
            Secret::new("whsec_eA=="),
        );
        req.event_types = types.into_iter().map(String::from).collect();
        h.store.endpoint_create(req)
    };
    let failing = create("a", vec!["order.paid", "delivery.dead"])
        .await
        .unwrap();
    let watcher = create("a", vec!["delivery.dead"]).await.unwrap();
    let catch_all = create("a", vec![]).await.unwrap();
    let other_account = create("b", vec!["delivery.dead"]).await.unwrap();
    let p = h
        .store
        .event_publish(PublishRequest::new(acct("a"), "order.paid", json!(1)))
        .await
        .unwrap();
    assert_eq!(p.deliveries.len(), 2, "failing + catch-all");
    let mut claimed = claim_deliveries(&h, 10).await;
    let c = claimed
        .iter()
        .position(|c| c.delivery.endpoint_id == failing.id)
        .map(|i| claimed.remove(i))
        .unwrap();
    h.store
        .delivery_record_outcome(
            &c.lease,
            DeliveryOutcome::GiveUp(AttemptReport {
                status_code: Some(400),
                error: None,
                latency_ms: 1,
            }),
        )
        .await
        .unwrap();
    let to = |e: &Endpoint| {
        let id = e.id;
        let account = e.account.clone();
        let store = h.store.clone();
        async move {
            store
                .delivery_list(DeliveryListRequest {
                    account,
                    state: None,
                    endpoint_id: Some(id),
                    event_id: None,
                    page: PageRequest::first(10),
                })
                .await
                .unwrap()
                .items
        }
    };
    let got = to(&watcher).await;
    assert_eq!(got.len(), 1, "the watcher gets delivery.dead");
    let event = h
        .store
        .event_get(&acct("a"), got[0].event_id)
        .await
        .unwrap();
    assert_eq!(event.event_type, "delivery.dead");
    let body: serde_json::Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!(body["data"]["endpoint_id"], json!(failing.id.to_string()));
    assert_eq!(
        body["data"]["delivery_id"],
        json!(c.delivery.id.to_string())
    );
    assert_eq!(to(&failing).await.len(), 1, "not told about itself");
    assert_eq!(
        to(&catch_all).await.len(),
        1,
        "catch-all gets only order.paid"
    );
    assert!(to(&other_account).await.is_empty());
}

/// `SessionStore`: a session is found by its id's hash until it expires
/// (store time) or is ended, and retention removes it after its expiry.
pub async fn a_session_lives_until_it_expires_or_ends(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let hex = |c: char| c.to_string().repeat(64);
    let hour = Duration::from_secs(3600);
    let req = |id: char, life: Duration| {
        SessionCreateRequest::new(hex(id), hex('e'), hex('c'), life).unwrap()
    };
    let a = h.store.session_create(req('a', hour)).await.unwrap();
    assert_eq!(
        (a.created_at, a.expires_at),
        (h.clock.now(), h.clock.now().plus(hour))
    );
    assert_eq!(h.store.session_get(&hex('a')).await.unwrap(), Some(a));
    assert!(matches!(
        h.store.session_create(req('a', hour)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(h.store.session_get(&hex('9')).await.unwrap(), None);
    h.store.session_create(req('b', 2 * hour)).await.unwrap();
    h.store.session_end(&hex('b')).await.unwrap();
    assert_eq!(h.store.session_get(&hex('b')).await.unwrap(), None, "ended");
    h.store.session_end(&hex('b')).await.unwrap();
    let c = h.store.session_create(req('c', 2 * hour)).await.unwrap();
    h.clock.advance(hour);
    assert_eq!(
        h.store.session_get(&hex('a')).await.unwrap(),
        None,
        "expired at its end"
    );
    assert_eq!(
        h.store.session_get(&hex('c')).await.unwrap(),
        Some(c.clone())
    );
    let purged = h
        .store
        .maintenance_purge(Duration::from_secs(30 * 86_400), 100)
        .await
        .unwrap();
    assert_eq!(purged.sessions, 1, "only the expired one goes");
    assert_eq!(h.store.session_get(&hex('c')).await.unwrap(), Some(c));
}

/// `SessionStore::session_extend` and `session_list`: an extended session
/// outlives its first expiry, an expired or ended one is not revived; the
/// list holds the live sessions, newest first.
pub async fn a_session_is_extended_listed_and_revoked(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let hex = |c: char| c.to_string().repeat(64);
    let hour = Duration::from_secs(3600);
    let req = |id: char| SessionCreateRequest::new(hex(id), hex('e'), hex('c'), hour).unwrap();
    h.store.session_create(req('a')).await.unwrap();
    h.clock.advance(Duration::from_secs(60));
    h.store.session_create(req('b')).await.unwrap();
    let listed: Vec<String> = h
        .store
        .session_list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id_hash)
        .collect();
    assert_eq!(listed, vec![hex('b'), hex('a')], "newest first");
    h.clock.advance(Duration::from_secs(50 * 60));
    let until = h.clock.now().plus(hour);
    assert!(h.store.session_extend(&hex('a'), until).await.unwrap());
    h.clock.advance(Duration::from_secs(30 * 60));
    let a = h.store.session_get(&hex('a')).await.unwrap();
    assert_eq!(
        a.map(|s| s.expires_at),
        Some(until),
        "outlived its first expiry"
    );
    assert_eq!(
        h.store.session_get(&hex('b')).await.unwrap(),
        None,
        "b expired"
    );
    assert!(
        !h.store.session_extend(&hex('b'), until).await.unwrap(),
        "an expired session is not revived"
    );
    assert_eq!(h.store.session_get(&hex('b')).await.unwrap(), None);
    h.store.session_end(&hex('a')).await.unwrap();
    assert!(!h.store.session_extend(&hex('a'), until).await.unwrap());
    assert!(h.store.session_list().await.unwrap().is_empty());
}

/// `AccountKeyStore`: keys are found by hash, scoped to their account, revoked.
pub async fn account_keys_are_found_by_hash_and_revoked(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let k1 = h
        .store
        .account_key_create(&acct("a"), "hash-1")
        .await
        .unwrap();
    let k2 = h
        .store
        .account_key_create(&acct("a"), "hash-2")
        .await
        .unwrap();
    let k3 = h
        .store
        .account_key_create(&acct("b"), "hash-3")
        .await
        .unwrap();
    assert_ne!(k1.id, k2.id);
    assert_eq!(k1.account, acct("a"));
    assert_eq!(k1.created_at, h.clock.now());
    let found = h.store.account_key_find("hash-2").await.unwrap().unwrap();
    assert_eq!(found, k2);
    assert_eq!(
        h.store.account_key_find("hash-3").await.unwrap(),
        Some(k3.clone())
    );
    assert_eq!(h.store.account_key_find("hash-x").await.unwrap(), None);
    assert!(matches!(
        h.store.account_key_create(&acct("b"), "hash-1").await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        h.store.account_key_create(&acct("b"), "").await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        h.store.account_key_revoke(&acct("b"), k1.id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(h.store.account_key_find("hash-1").await.unwrap().is_some());
    h.store.account_key_revoke(&acct("a"), k1.id).await.unwrap();
    assert_eq!(h.store.account_key_find("hash-1").await.unwrap(), None);
    assert!(h.store.account_key_find("hash-2").await.unwrap().is_some());
    assert!(matches!(
        h.store.account_key_revoke(&acct("a"), k1.id).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// `MaintenanceStore::maintenance_purge`: old delivered history goes in batches; live work stays.
pub async fn maintenance_purges_old_history_in_batches(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    endpoint_for_all(&h, "a").await;
    let reqs = (0..5)
        .map(|i| PublishRequest::new(acct("a"), "t", json!(i)))
        .collect();
    h.store.event_publish_batch(reqs).await.unwrap();
    let claimed = claim_deliveries(&h, 4).await;
    for c in &claimed[..3] {
        let ok = DeliveryOutcome::Delivered(AttemptReport::default());
        h.store.delivery_record_outcome(&c.lease, ok).await.unwrap();
    }
    let fail = DeliveryOutcome::Retry {
        at: h.clock.now().plus(Duration::from_secs(7200)),
        report: AttemptReport::default(),
    };
    h.store
        .delivery_record_outcome(&claimed[3].lease, fail)
        .await
        .unwrap();
    let retention = Duration::from_secs(3600);
    assert_eq!(
        h.store.maintenance_purge(retention, 2).await.unwrap(),
        PurgeReport::default(),
        "nothing is old yet"
    );
    h.clock.advance(retention);
    let r = h.store.maintenance_purge(retention, 2).await.unwrap();
    assert_eq!((r.deliveries, r.attempts), (2, 2));
    let r = h.store.maintenance_purge(retention, 2).await.unwrap();
    assert_eq!((r.deliveries, r.attempts), (1, 2));
    assert_eq!(
        h.store.maintenance_purge(retention, 2).await.unwrap(),
        PurgeReport::default()
    );
    let mut counts = h.store.delivery_count_by_state().await.unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        counts,
        vec![(DeliveryState::Pending, 2)],
        "live deliveries stay"
    );
    assert!(matches!(
        h.store.maintenance_purge(retention, 0).await,
        Err(StoreError::InvalidInput(_))
    ));
}

/// `maintenance::run_maintenance`: one replica runs it per interval, on a tick.
pub async fn maintenance_runs_on_a_single_flight_tick(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for k in 0..5 {
        h.store
            .idempotency_begin("s", &format!("k{k}"), "h", Duration::from_secs(1))
            .await
            .unwrap();
    }
    h.clock.advance(Duration::from_secs(1));
    let every = Duration::from_secs(600);
    let day = Duration::from_secs(86_400);
    let report = run_maintenance(h.store.as_ref(), day, 2, every)
        .await
        .unwrap()
        .expect("first run");
    assert_eq!(
        report.idempotency_records, 5,
        "batches continue until nothing is left"
    );
    assert!(
        run_maintenance(h.store.as_ref(), day, 2, every)
            .await
            .unwrap()
            .is_none(),
        "not due again yet"
    );
    h.clock.advance(every);
    assert_eq!(
        run_maintenance(h.store.as_ref(), day, 2, every)
            .await
            .unwrap(),
        Some(PurgeReport::default())
    );
}

/// `MaintenanceStore::maintenance_purge`: a rotated-out signing secret stays
/// for its grace, then maintenance clears it (it would sign nothing, and it
/// is a credential kept for no use).
pub async fn a_rotated_out_secret_is_cleared_after_its_grace(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let a = AccountId::new("a").unwrap();
    let e = h
        .store
        .endpoint_create(EndpointCreateRequest::new(
            a.clone(),
            "https://example.com/hook",
            Secret::new("whsec_b2xk"),
        ))
        .await
        .unwrap();
    h.store
        .endpoint_rotate_secret(
            &a,
            e.id,
            Secret::new("whsec_bmV3"),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let r = purge_all(&h, Duration::from_secs(86_400)).await;
    assert_eq!(r.previous_secrets, 0, "still in its grace");
    let kept = h.store.endpoint_get(&a, e.id).await.unwrap();
    assert_eq!(
        kept.secrets.previous.as_ref().map(Secret::expose),
        Some("whsec_b2xk")
    );
    h.clock.advance(Duration::from_secs(3601));
    let r = purge_all(&h, Duration::from_secs(86_400)).await;
    assert_eq!(r.previous_secrets, 1);
    let cleared = h.store.endpoint_get(&a, e.id).await.unwrap();
    assert_eq!(cleared.secrets.previous, None);
    assert_eq!(cleared.secrets.previous_expires_at, None);
    assert_eq!(cleared.secrets.current.expose(), "whsec_bmV3");
}

/// Purges with `retention` until a batch removes nothing; the sum.
async fn purge_all(h: &Harness, retention: Duration) -> PurgeReport {
    let mut total = PurgeReport::default();
    loop {
        let r = h.store.maintenance_purge(retention, 2).await.unwrap();
        if r.total() == 0 {
            return total;
        }
        total.add(&r);
    }
}

fn event(account: &str, n: i64) -> PublishRequest {
    PublishRequest::new(acct(account), "t", json!(n))
}

/// `MaintenanceStore::maintenance_purge`: an old event goes once no delivery
/// refers to it (delivered and purged, or never fanned out); an event with a
/// pending or dead delivery stays, and so does a recent one.
pub async fn retention_purges_events_left_without_deliveries(f: &dyn StoreFactory) {
    let h = &f.open(StoreOptions::default()).await;
    let retention = Duration::from_secs(3600);
    let orphan = h.store.event_publish(event("a", 0)).await.unwrap();
    assert!(orphan.deliveries.is_empty(), "no endpoint yet");
    endpoint_for_all(h, "a").await;
    let delivered = h.store.event_publish(event("a", 1)).await.unwrap();
    let waiting = h.store.event_publish(event("a", 2)).await.unwrap();
    let c = claim_deliveries(h, 1).await.remove(0);
    assert_eq!(c.delivery.event_id, delivered.event.id);
    h.store
        .delivery_record_outcome(
            &c.lease,
            DeliveryOutcome::Delivered(AttemptReport::default()),
        )
        .await
        .unwrap();
    h.clock.advance(retention);
    let recent = h.store.event_publish(event("a", 3)).await.unwrap();
    let r = purge_all(h, retention).await;
    assert_eq!((r.events, r.deliveries), (2, 1), "{r:?}");
    let exists = |id| async move { h.store.event_get(&acct("a"), id).await.is_ok() };
    assert!(!exists(orphan.event.id).await, "never fanned out");
    assert!(!exists(delivered.event.id).await, "its delivery was purged");
    assert!(exists(waiting.event.id).await, "its delivery is pending");
    assert!(exists(recent.event.id).await, "recent");
}

/// `MaintenanceStore::maintenance_purge`: dead deliveries are kept for replay
/// while their endpoint exists; once it is deleted, they go when older than
/// the retention, like delivered ones.
pub async fn retention_purges_dead_deliveries_of_deleted_endpoints(f: &dyn StoreFactory) {
    let h = &f.open(StoreOptions::default()).await;
    let retention = Duration::from_secs(3600);
    let kept = endpoint_for_all(h, "a").await;
    let deleted = endpoint_for_all(h, "a").await;
    let published = h.store.event_publish(event("a", 1)).await.unwrap();
    assert_eq!(published.deliveries.len(), 2);
    for c in claim_deliveries(h, 2).await {
        let give_up = DeliveryOutcome::GiveUp(AttemptReport::default());
        h.store
            .delivery_record_outcome(&c.lease, give_up)
            .await
            .unwrap();
    }
    h.store
        .endpoint_delete(&acct("a"), deleted.id)
        .await
        .unwrap();
    let dead_of = |e: EndpointId| async move {
        let list = h
            .store
            .delivery_list(DeliveryListRequest {
                endpoint_id: Some(e),
                ..DeliveryListRequest::all(acct("a"), PageRequest::first(100))
            })
            .await
            .unwrap();
        list.items
            .iter()
            .filter(|d| d.state == DeliveryState::Dead)
            .count()
    };
    assert_eq!((dead_of(kept.id).await, dead_of(deleted.id).await), (1, 1));
    let r = purge_all(h, retention).await;
    assert_eq!(r.deliveries, 0, "too recent: {r:?}");
    h.clock.advance(retention);
    let r = purge_all(h, retention).await;
    assert_eq!(r.deliveries, 1, "{r:?}");
    assert_eq!(
        (dead_of(kept.id).await, dead_of(deleted.id).await),
        (1, 0),
        "the live endpoint's dead delivery stays for replay"
    );
    assert!(
        h.store
            .event_get(&acct("a"), published.event.id)
            .await
            .is_ok(),
        "the event still has a delivery"
    );
}

/// `MaintenanceStore::maintenance_purge`: old completed tasks go; pending,
/// leased and dead-lettered ones stay whatever their age.
pub async fn retention_purges_completed_tasks_only(f: &dyn StoreFactory) {
    let h = &f.open(with_workflow(1)).await;
    let retention = Duration::from_secs(3600);
    for id in ["done", "dead", "leased", "pending"] {
        h.store.workflow_enqueue(task(id, "a", "k")).await.unwrap();
    }
    let claimed = claim_kinds(h, &["k"], 3).await;
    let by_id = |id: &str| claimed.iter().find(|c| c.task.id.as_str() == id).unwrap();
    h.store
        .workflow_complete(&by_id("done").lease, json!(1))
        .await
        .unwrap();
    h.store
        .workflow_fail(&by_id("dead").lease, "no".into(), TaskFailure::Permanent)
        .await
        .unwrap();
    h.clock.advance(retention);
    let r = purge_all(h, retention).await;
    assert_eq!(r.tasks, 1, "{r:?}");
    let get = |id: &'static str| async move { h.store.workflow_get(&acct("a"), &tid(id)).await };
    assert!(matches!(
        get("done").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(get("dead").await.unwrap().state, TaskState::DeadLettered);
    assert!(get("leased").await.is_ok() && get("pending").await.is_ok());
}

/// `MaintenanceStore::maintenance_purge`: alerts older than the retention go;
/// recent ones stay.
pub async fn retention_purges_old_alerts(f: &dyn StoreFactory) {
    let opts = StoreOptions {
        max_attempts: 1,
        ..StoreOptions::default()
    };
    let h = &f.open(opts).await;
    let retention = Duration::from_secs(3600);
    endpoint_for_all(h, "a").await;
    let dead_letter = |n| async move {
        h.store.event_publish(event("a", n)).await.unwrap();
        let c = claim_deliveries(h, 1).await.remove(0);
        let fail = DeliveryOutcome::GiveUp(AttemptReport::default());
        h.store
            .delivery_record_outcome(&c.lease, fail)
            .await
            .unwrap();
    };
    dead_letter(1).await;
    let alerts = || async {
        h.store
            .alert_list(&acct("a"), PageRequest::first(100))
            .await
            .unwrap()
            .items
    };
    let old = alerts().await;
    assert!(!old.is_empty(), "a dead letter raises an alert");
    h.clock.advance(retention);
    dead_letter(2).await;
    let r = purge_all(h, retention).await;
    assert_eq!(r.alerts, old.len() as u64, "{r:?}");
    let left = alerts().await;
    assert!(!left.is_empty(), "the recent alert stays");
    assert!(left.iter().all(|a| old.iter().all(|o| o.id != a.id)));
}

/// `MaintenanceStore::maintenance_purge`: usage windows that ended before the
/// cutoff go with the batch ids recorded before it; the current window stays.
pub async fn retention_purges_ended_usage_windows(f: &dyn StoreFactory) {
    let h = &f.open(StoreOptions::default()).await;
    let hour = Duration::from_secs(3600);
    let retention = hour * 2;
    let record = |id: &'static str| async move {
        let batch = UsageBatch {
            batch_id: id.into(),
            entries: vec![UsageEntry {
                account: acct("a"),
                metric: UsageMetric::Attempts,
                at: h.clock.now(),
                amount: 1,
            }],
        };
        h.store.usage_record(batch).await.unwrap()
    };
    let t0 = usage_window(h.clock.now());
    assert!(record("old").await);
    h.clock.advance(retention + hour);
    assert!(record("new").await);
    let r = purge_all(h, retention).await;
    assert_eq!(r.usage, 2, "one window and one batch id: {r:?}");
    let rows = h
        .store
        .usage_query(&acct("a"), t0, h.clock.now().plus(hour))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "only the current window: {rows:?}");
    assert!(
        record("old").await,
        "the purged batch id is forgotten, so it counts again"
    );
}
