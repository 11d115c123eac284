//! Contracts of the workflow queue.

use crate::contracts::fixtures::{
    acct, claim_kinds, drain_concurrently, enqueue, is_invalid, task, tid, with_workflow, LEASE,
};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    Check, Clock, PageRequest, StoreError, StoreOptions, TaskClaimRequest, TaskEnqueueRequest,
    TaskFailed, TaskHeartbeat, TaskId, TaskLease, TaskListRequest, TaskState,
};
use serde_json::json;
use std::time::Duration;

/// `WorkflowStore::workflow_enqueue`: idempotent by id within an account; a
/// different kind or payload conflicts; another account's same id is its own task.
pub async fn workflow_enqueue_is_idempotent_and_conflicts_on_difference(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let first = enqueue(&h, "t1", "a", "email").await;
    assert!(first.created);
    assert_eq!(first.task.state, TaskState::Pending);
    assert_eq!(first.task.run_at, h.clock.now());
    let again = enqueue(&h, "t1", "a", "email").await;
    assert!(!again.created);
    assert_eq!(again.task, first.task);
    // Another account may use the same id: a task of its own, created, and
    // no hint that account "a" has one.
    let theirs = enqueue(&h, "t1", "b", "sms").await;
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
        let r = h.store.workflow_enqueue(other.checked().unwrap()).await;
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    }
    let bad = task("t2", "a", "").checked();
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
        .workflow_enqueue(
            TaskEnqueueRequest {
                run_at: Some(later),
                ..task("late", "a", "email")
            }
            .checked()
            .unwrap(),
        )
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(1));
    enqueue(&h, "e1", "a", "email").await;
    h.clock.advance(Duration::from_secs(1));
    enqueue(&h, "s1", "a", "sms").await;
    enqueue(&h, "e2", "a", "email").await;
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
    // A claim of no kinds cannot be asked for: the request refuses it.
    let bad = TaskClaimRequest::new("w", vec![], 1, LEASE);
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
}

/// `WorkflowStore::workflow_claim`: exclusive under concurrent claimers.
pub async fn workflow_claim_is_exclusive_under_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for i in 0..40 {
        h.store
            .workflow_enqueue(task(&format!("t{i}"), "a", "k").checked().unwrap())
            .await
            .unwrap();
    }
    let all = drain_concurrently(&h, 6, |s, w| async move {
        let claim = TaskClaimRequest::new(format!("w{w}"), vec!["k".into()], 3, LEASE).unwrap();
        let mut done = Vec::new();
        for t in s.workflow_claim(claim).await.unwrap() {
            s.workflow_complete(&t.lease, json!("ok")).await.unwrap();
            done.push(t.task.id);
        }
        done
    })
    .await;
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (40, 40));
}

/// `WorkflowStore::workflow_fail`: backoff grows, then the task is dead-lettered with the last error.
pub async fn workflow_fail_backs_off_then_dead_letters(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(3)).await;
    enqueue(&h, "t", "a", "k").await;
    let policy = with_workflow(3).workflow;
    for attempt in 1..=2 {
        let c = claim_kinds(&h, &["k"], 1).await.remove(0);
        assert_eq!(c.lease.attempt, attempt);
        let t = h
            .store
            .workflow_fail(&c.lease, TaskFailed::retryable(format!("boom {attempt}")))
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
        .workflow_fail(&c.lease, TaskFailed::retryable("boom 3"))
        .await
        .unwrap();
    assert_eq!(t.state, TaskState::DeadLettered);
    assert_eq!(t.last_error.as_deref(), Some("boom 3"));
    let again = h
        .store
        .workflow_fail(&c.lease, TaskFailed::retryable("boom 3"))
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
    enqueue(&h, "t", "a", "k").await;
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    let t = h
        .store
        .workflow_fail(&c.lease, TaskFailed::permanent("invalid input"))
        .await
        .unwrap();
    assert_eq!((t.state, t.attempts), (TaskState::DeadLettered, 1));
    h.clock.advance(Duration::from_secs(3600));
    assert!(claim_kinds(&h, &["k"], 1).await.is_empty());
}

/// `WorkflowStore::workflow_claim`: a staged result is finalized without running the handler again.
pub async fn workflow_staged_result_is_finalized_without_rerun(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    enqueue(&h, "t", "a", "k").await;
    enqueue(&h, "u", "a", "k").await;
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
    enqueue(&h, "t", "a", "k").await;
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
            .workflow_fail(&forged, TaskFailed::permanent("x"))
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
        enqueue(&h, "t", a, "k").await;
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
    assert!(h
        .store
        .workflow_heartbeat(&crossed, TaskHeartbeat::extend(LEASE))
        .await
        .is_err());
    assert_eq!(state("b").await, TaskState::Leased);
    h.store.workflow_complete(&la, json!(1)).await.unwrap();
    assert_eq!(
        (state("a").await, state("b").await),
        (TaskState::Completed, TaskState::Leased)
    );
    h.store
        .workflow_heartbeat(&lb, TaskHeartbeat::extend(LEASE))
        .await
        .unwrap();
    h.store
        .workflow_fail(&lb, TaskFailed::permanent("x"))
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
    enqueue(&h, "t", "a", "k").await;
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

/// `WorkflowStore::workflow_heartbeat`: the progress a heartbeat carries is
/// readable at once, kept by a heartbeat without one, refused with a lost
/// lease, given to the next claim after a crash, and kept at completion;
/// another account's reader does not see the task.
pub async fn workflow_heartbeat_stores_progress_for_readers_and_the_next_run(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    enqueue(&h, "t", "a", "k").await;
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    assert_eq!(c.task.progress, None);
    let id = TaskId::new("t").unwrap();
    let read = |h: &Harness| {
        let store = h.store.clone();
        let id = id.clone();
        async move { store.workflow_get(&acct("a"), &id).await.unwrap().progress }
    };
    h.store
        .workflow_heartbeat(
            &c.lease,
            TaskHeartbeat::with_progress(LEASE, json!({"done": 1})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(read(&h).await, Some(json!({"done": 1})));
    h.store
        .workflow_heartbeat(&c.lease, TaskHeartbeat::extend(LEASE))
        .await
        .unwrap();
    assert_eq!(read(&h).await, Some(json!({"done": 1})), "None keeps it");
    // Progress is checked as payloads are, alike on every adapter: when the
    // heartbeat is built, so a refused one never reaches a store.
    for bad in [json!({"note": "a\u{0}b"}), json!("x".repeat(70_000))] {
        let r = TaskHeartbeat::with_progress(LEASE, bad);
        is_invalid(r);
    }
    assert_eq!(
        read(&h).await,
        Some(json!({"done": 1})),
        "a refused one stores nothing"
    );
    h.store
        .workflow_heartbeat(
            &c.lease,
            TaskHeartbeat::with_progress(LEASE, json!({"done": 2})).unwrap(),
        )
        .await
        .unwrap();
    // The worker dies: its lease expires and the next run starts from 2.
    h.clock.advance(LEASE + Duration::from_secs(1));
    let again = claim_kinds(&h, &["k"], 1).await.remove(0);
    assert_eq!(again.task.progress, Some(json!({"done": 2})));
    assert_eq!(
        h.store
            .workflow_heartbeat(
                &c.lease,
                TaskHeartbeat::with_progress(LEASE, json!({"done": 99})).unwrap()
            )
            .await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(
        read(&h).await,
        Some(json!({"done": 2})),
        "a lost lease writes nothing"
    );
    assert!(h.store.workflow_get(&acct("b"), &id).await.is_err());
    h.store
        .workflow_heartbeat(
            &again.lease,
            TaskHeartbeat::with_progress(LEASE, json!({"done": 3})).unwrap(),
        )
        .await
        .unwrap();
    let done = h
        .store
        .workflow_complete(&again.lease, json!({"total": 3}))
        .await
        .unwrap();
    assert_eq!(done.progress, Some(json!({"done": 3})));
    assert_eq!(done.result, Some(json!({"total": 3})));
}

/// `WorkflowStore::workflow_heartbeat`: extends a live lease; stale and expired leases are lost.
pub async fn workflow_heartbeat_extends_and_stale_lease_is_lost(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    enqueue(&h, "t", "a", "k").await;
    let c = claim_kinds(&h, &["k"], 1).await.remove(0);
    h.clock.advance(Duration::from_secs(20));
    let l = h
        .store
        .workflow_heartbeat(&c.lease, TaskHeartbeat::extend(LEASE))
        .await
        .unwrap();
    assert_eq!(l.expires_at, h.clock.now().plus(LEASE));
    h.clock.advance(Duration::from_secs(20));
    assert!(
        claim_kinds(&h, &["k"], 1).await.is_empty(),
        "the heartbeat kept it"
    );
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(
        h.store
            .workflow_heartbeat(&c.lease, TaskHeartbeat::extend(LEASE))
            .await,
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
    enqueue(&h, "t", "a", "k").await;
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

/// `WorkflowStore::workflow_list` of dead letters: listed newest first and retried.
pub async fn workflow_dead_letters_are_listed_and_retried(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(1)).await;
    for id in ["t1", "t2", "t3"] {
        enqueue(&h, id, "a", "k").await;
    }
    enqueue(&h, "other", "b", "k").await;
    for c in claim_kinds(&h, &["k"], 10).await {
        h.store
            .workflow_fail(
                &c.lease,
                TaskFailed::retryable(format!("failed {}", c.task.id)),
            )
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = h
            .store
            .workflow_list(TaskListRequest {
                account: acct("a"),
                state: TaskState::DeadLettered,
                page: PageRequest::new(2, after).unwrap(),
            })
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

/// `WorkflowStore::workflow_list` by state: pending and leased tasks of one
/// account, newest first; completed ones are refused.
pub async fn workflow_tasks_are_listed_by_state(f: &dyn StoreFactory) {
    let h = f.open(with_workflow(3)).await;
    for id in ["p1", "p2", "p3"] {
        enqueue(&h, id, "a", "k").await;
    }
    enqueue(&h, "theirs", "b", "k").await;
    let list = |state: TaskState| {
        let h = &h;
        async move {
            h.store
                .workflow_list(TaskListRequest {
                    account: acct("a"),
                    state,
                    page: PageRequest::first(10),
                })
                .await
                .unwrap()
                .items
                .iter()
                .map(|t| t.id.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(TaskState::Pending).await, vec!["p3", "p2", "p1"]);
    assert!(list(TaskState::Leased).await.is_empty());
    let claimed = claim_kinds(&h, &["k"], 10).await;
    let leased_of_a: Vec<String> = claimed
        .iter()
        .filter(|c| c.task.account == acct("a"))
        .map(|c| c.task.id.to_string())
        .collect();
    assert_eq!(leased_of_a.len(), 3);
    let mut leased = list(TaskState::Leased).await;
    leased.sort();
    assert_eq!(leased, vec!["p1", "p2", "p3"]);
    assert!(list(TaskState::Pending).await.is_empty());
    let done = h
        .store
        .workflow_list(TaskListRequest {
            account: acct("a"),
            state: TaskState::Completed,
            page: PageRequest::first(10),
        })
        .await;
    assert!(matches!(done, Err(StoreError::InvalidInput(_))), "{done:?}");
}
