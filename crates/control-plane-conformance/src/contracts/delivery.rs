//! Contracts of a delivery's life: claims, leases, outcomes and retries.

use crate::contracts::fixtures::{
    acct, attempts, claim, claim_for, claim_second_attempt, claim_until_empty, create_endpoint,
    endpoint, fail_at, get, ids, is_invalid, ok, open, publish, publish_req, record, reread,
    with_attempts, with_breaker, with_endpoint_concurrency, LEASE,
};
use crate::StoreFactory;
use control_plane_core::{
    AttemptRecord, AttemptReport, AttemptResult, ClaimRequest, Clock, Delivery, DeliveryId,
    DeliveryOutcome, DeliveryState, EndpointCreateRequest, EndpointId, EndpointKey, EndpointRetry,
    EndpointUpdateRequest, Lease, LeaseToken, OutcomeRecorded, Secret, StoreError, StoreOptions,
    Throttle,
};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// `DeliveryStore::delivery_claim`: oldest due first, within the limit, nothing early.
pub async fn claim_returns_oldest_due_first_within_limit(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(publish(&h, "a").await.deliveries[0]);
        h.clock.advance(Duration::from_secs(1));
    }
    let first = claim(&h, 2).await;
    assert_eq!(ids(&first), order[..2].to_vec());
    record(
        &h,
        &first[0],
        fail_at(h.clock.now().plus(Duration::from_secs(100))),
    )
    .await;
    record(&h, &first[1], ok()).await;
    let rest = claim(&h, 10).await;
    assert_eq!(
        ids(&rest),
        order[2..].to_vec(),
        "the retried one is not due yet"
    );
    for c in &rest {
        record(&h, c, ok()).await;
    }
    assert!(claim(&h, 10).await.is_empty());
    h.clock.advance(Duration::from_secs(100));
    assert_eq!(ids(&claim(&h, 10).await), vec![order[0]]);
}

/// `DeliveryStore::delivery_claim`: exclusive under concurrent claimers.
pub async fn claim_is_exclusive_under_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(100)).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "a", false).await;
    let reqs: Vec<_> = (0..30).map(|_| publish_req("a", "t")).collect();
    h.store
        .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
        .await
        .unwrap();
    let all: Vec<DeliveryId> = claim_until_empty(&h, 8, 3)
        .await
        .into_iter()
        .map(|c| c.delivery.id)
        .collect();
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "every delivery claimed");
    assert_eq!(unique.len(), 60, "no delivery claimed twice");
}

/// `DeliveryStore::delivery_claim`: the attempt number increments at claim.
pub async fn claim_increments_attempt_number(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    publish(&h, "a").await;
    let c = claim(&h, 1).await;
    assert_eq!(c[0].lease.attempt, 1);
    assert_eq!(c[0].delivery.attempts, 1);
    assert_eq!(c[0].delivery.state, DeliveryState::Leased);
    assert_eq!(c[0].lease.expires_at, h.clock.now().plus(LEASE));
    record(&h, &c[0], fail_at(h.clock.now())).await;
    let c = claim(&h, 1).await;
    assert_eq!(c[0].lease.attempt, 2);
    assert_eq!(get(&h, "a", c[0].delivery.id).await.attempts, 2);
}

/// `DeliveryStore::delivery_claim`: limits outside 1..=1000 and empty leases
/// cannot be asked for (the request refuses them when built), and an
/// oversized throttle is refused the same way.
pub async fn claim_rejects_bad_limits(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    publish(&h, "a").await;
    for (limit, lease_for) in [(0, LEASE), (1001, LEASE), (1, Duration::ZERO)] {
        let r = ClaimRequest::new("w", limit, lease_for);
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{limit}: {r:?}"
        );
    }
    let too_many = Throttle {
        caps: (0..=control_plane_core::MAX_THROTTLED)
            .map(|_| (EndpointId::new(), 1))
            .collect(),
        budget: 1,
    };
    let r = ClaimRequest::new("w", 1, LEASE)
        .unwrap()
        .throttled(too_many);
    is_invalid(r);
    assert_eq!(
        claim(&h, 1).await.len(),
        1,
        "nothing was leased by the refused calls"
    );
}

/// `DeliveryStore::delivery_claim`: an expired lease is claimable again and its attempt logged.
pub async fn expired_lease_is_claimable_again_and_logged(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let first = claim_for(&h, 1, Duration::from_secs(10)).await;
    h.clock.advance(Duration::from_secs(9));
    assert!(claim(&h, 1).await.is_empty(), "still leased");
    h.clock.advance(Duration::from_secs(1));
    let second = claim(&h, 1).await;
    assert_eq!(ids(&second), vec![id]);
    assert_eq!(second[0].lease.attempt, 2);
    assert_ne!(second[0].lease.token, first[0].lease.token);
    let log = attempts(&h, "a", id).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].attempt, 1);
    assert_eq!(log[0].result, AttemptResult::LeaseExpired);
    assert!(log[0].will_retry);
}

/// `DeliveryStore::delivery_claim`: a delivery that crashes its worker every time still runs out.
pub async fn worker_crashing_every_attempt_still_runs_out_of_attempts(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(3)).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    for n in 1..=3 {
        let c = claim_for(&h, 1, Duration::from_secs(5)).await;
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].lease.attempt, n);
        h.clock.advance(Duration::from_secs(6));
    }
    assert!(claim(&h, 1).await.is_empty());
    let d = get(&h, "a", id).await;
    assert_eq!(d.state, DeliveryState::Dead);
    assert_eq!(d.attempts, 3);
    let log = attempts(&h, "a", id).await;
    assert_eq!(
        log.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(log.iter().all(|a| a.result == AttemptResult::LeaseExpired));
    assert!(!log[2].will_retry);
}

/// `DeliveryStore::delivery_record_outcome`: a stale token is `LeaseLost` and changes nothing.
pub async fn stale_lease_token_gets_lease_lost_and_changes_nothing(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let old = claim_for(&h, 1, Duration::from_secs(5)).await.remove(0);
    h.clock.advance(Duration::from_secs(5));
    let new = claim(&h, 1).await.remove(0);
    let before = get(&h, "a", id).await;
    assert_eq!(
        h.store.delivery_record_outcome(&old.lease, ok()).await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(
        h.store.delivery_extend(&old.lease, LEASE).await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(
        h.store.delivery_release(&old.lease).await,
        Err(StoreError::LeaseLost)
    );
    let unknown = Lease {
        token: LeaseToken::new(),
        ..new.lease.clone()
    };
    assert_eq!(
        h.store.delivery_record_outcome(&unknown, ok()).await,
        Err(StoreError::LeaseLost)
    );
    assert_eq!(get(&h, "a", id).await, before);
    assert_eq!(attempts(&h, "a", id).await.len(), 1);
    assert_eq!(record(&h, &new, ok()).await.state, DeliveryState::Delivered);
}

/// `DeliveryStore::delivery_record_outcome`: the same outcome twice is a no-op.
pub async fn repeated_outcome_is_a_noop(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(
        record(&h, &c, ok()).await,
        OutcomeRecorded {
            state: DeliveryState::Delivered,
            duplicate: false
        }
    );
    let after = get(&h, "a", id).await;
    h.clock.advance(Duration::from_secs(1));
    assert_eq!(
        record(&h, &c, ok()).await,
        OutcomeRecorded {
            state: DeliveryState::Delivered,
            duplicate: true
        }
    );
    assert_eq!(get(&h, "a", id).await, after);
    assert_eq!(attempts(&h, "a", id).await.len(), 1);
    let other = h
        .store
        .delivery_record_outcome(&c.lease, fail_at(h.clock.now()))
        .await;
    assert!(matches!(other, Err(StoreError::Conflict(_))), "{other:?}");
}

/// `DeliveryStore::delivery_record_outcome`: delivered, retry and give-up transitions.
pub async fn outcomes_move_the_delivery(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    let c = claim(&h, 3).await;
    let later = h.clock.now().plus(Duration::from_secs(60));
    record(&h, &c[0], ok()).await;
    record(&h, &c[1], fail_at(later)).await;
    let give_up = DeliveryOutcome::GiveUp(AttemptReport {
        status_code: Some(400),
        error: Some("bad request".into()),
        latency_ms: 3,
        response_body: None,
    });
    record(&h, &c[2], give_up).await;
    let d0 = get(&h, "a", c[0].delivery.id).await;
    let d1 = get(&h, "a", c[1].delivery.id).await;
    let d2 = get(&h, "a", c[2].delivery.id).await;
    assert_eq!(d0.state, DeliveryState::Delivered);
    assert_eq!(d0.lease_expires_at, None);
    assert_eq!((d1.state, d1.due_at), (DeliveryState::Pending, later));
    assert_eq!(d1.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(d2.state, DeliveryState::Dead);
    assert_eq!(d2.last_error.as_deref(), Some("bad request"));
    let a1 = attempts(&h, "a", d1.id).await;
    assert_eq!(a1.len(), 1);
    assert_eq!(
        (a1[0].result, a1[0].status_code, a1[0].latency_ms),
        (AttemptResult::Failed, Some(500), 7)
    );
    assert!(a1[0].will_retry);
    assert_eq!(a1[0].next_attempt_at, Some(later));
    let a0 = attempts(&h, "a", d0.id).await;
    assert_eq!(
        (a0[0].result, a0[0].will_retry),
        (AttemptResult::Delivered, false)
    );
    let a2 = attempts(&h, "a", d2.id).await;
    assert!(!a2[0].will_retry);
}

/// `DeliveryStore::delivery_record_outcome`: a retry with no attempts left is dead.
pub async fn exhausted_attempts_end_dead(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(2)).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(
        record(&h, &c, fail_at(h.clock.now())).await.state,
        DeliveryState::Pending
    );
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(
        record(&h, &c, fail_at(h.clock.now())).await.state,
        DeliveryState::Dead
    );
    let log = attempts(&h, "a", id).await;
    assert_eq!(
        log.iter().map(|a| a.will_retry).collect::<Vec<_>>(),
        vec![true, false]
    );
    assert!(claim(&h, 1).await.is_empty());
}

/// `DeliveryStore::delivery_record_outcome`: a retried delivery keeps its
/// identity, sequence number and log: its retry repeated is a duplicate,
/// the next claim continues its attempt count, the retried lease is lost.
pub async fn a_retried_delivery_keeps_its_place_and_its_log(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let first = publish(&h, "a").await.deliveries[0];
    let second = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(c.delivery.id, first);
    let later = h.clock.now().plus(Duration::from_secs(10));
    assert_eq!(
        record(&h, &c, fail_at(later)).await.state,
        DeliveryState::Pending
    );
    assert_eq!(
        record(&h, &c, fail_at(later)).await,
        OutcomeRecorded {
            state: DeliveryState::Pending,
            duplicate: true
        }
    );
    let meanwhile = claim(&h, 10).await;
    assert_eq!(ids(&meanwhile), vec![second], "the retry is not due yet");
    assert_eq!(
        record(&h, &meanwhile[0], ok()).await.state,
        DeliveryState::Delivered
    );
    h.clock.advance(Duration::from_secs(10));
    let again = claim_second_attempt(&h, &c).await;
    assert_eq!(
        h.store.delivery_record_outcome(&c.lease, ok()).await,
        Err(StoreError::LeaseLost),
        "the retried lease still fenced"
    );
    assert_eq!(
        record(&h, &again, ok()).await.state,
        DeliveryState::Delivered
    );
    let log: Vec<(u32, AttemptResult)> = attempts(&h, "a", first)
        .await
        .iter()
        .map(|a| (a.attempt, a.result))
        .collect();
    assert_eq!(
        log,
        vec![(1, AttemptResult::Failed), (2, AttemptResult::Delivered)]
    );
    let d = get(&h, "a", first).await;
    assert_eq!(
        (d.state, d.attempts, d.seq),
        (DeliveryState::Delivered, 2, c.delivery.seq)
    );
}

/// `DeliveryStore::delivery_release`: release keeps the attempt budget.
pub async fn release_keeps_the_attempt_budget(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    for _ in 0..3 {
        let c = claim(&h, 1).await.remove(0);
        assert_eq!(c.lease.attempt, 1);
        h.store.delivery_release(&c.lease).await.unwrap();
        let d = get(&h, "a", id).await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Pending, 0));
        assert_eq!(
            h.store.delivery_release(&c.lease).await,
            Err(StoreError::LeaseLost)
        );
        assert_eq!(
            h.store.delivery_record_outcome(&c.lease, ok()).await,
            Err(StoreError::LeaseLost)
        );
    }
    assert!(attempts(&h, "a", id).await.is_empty());
}

/// `DeliveryStore::delivery_extend`: a live lease is renewed; an expired one is lost.
pub async fn extend_renews_a_live_lease(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    publish(&h, "a").await;
    publish(&h, "a").await;
    let c = claim_for(&h, 1, Duration::from_secs(10)).await.remove(0);
    h.clock.advance(Duration::from_secs(8));
    let l = h
        .store
        .delivery_extend(&c.lease, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(l.expires_at, h.clock.now().plus(Duration::from_secs(10)));
    assert_eq!(l.token, c.lease.token);
    h.clock.advance(Duration::from_secs(8));
    let other = claim_for(&h, 10, Duration::from_secs(5)).await;
    assert_eq!(other.len(), 1, "the extended lease is still held");
    assert_ne!(other[0].delivery.id, c.delivery.id);
    assert_eq!(record(&h, &c, ok()).await.state, DeliveryState::Delivered);
    h.clock.advance(Duration::from_secs(5));
    assert_eq!(
        h.store.delivery_extend(&other[0].lease, LEASE).await,
        Err(StoreError::LeaseLost)
    );
}

/// `DeliveryStore::delivery_record_outcomes`: a batch answers per item what
/// single calls would, in one transaction.
pub async fn outcome_batches_agree_with_single_outcomes(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(2, 30, 600)).await;
    let ok = endpoint(&h, "a", false).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    let claimed = claim(&h, 10).await;
    assert_eq!(claimed.len(), 3);
    let report = |code: u16| AttemptReport {
        status_code: Some(code),
        error: None,
        latency_ms: 3,
        response_body: None,
    };
    let mut stale = claimed[2].lease.clone();
    stale.token = LeaseToken::new();
    let batch = vec![
        (
            claimed[0].lease.clone(),
            DeliveryOutcome::Delivered(report(200)),
        ),
        (
            claimed[1].lease.clone(),
            DeliveryOutcome::Retry {
                at: h.clock.now().plus(Duration::from_secs(60)),
                report: report(500),
            },
        ),
        (stale, DeliveryOutcome::Delivered(report(200))),
        (
            claimed[0].lease.clone(),
            DeliveryOutcome::Delivered(report(200)),
        ),
        (
            claimed[0].lease.clone(),
            DeliveryOutcome::GiveUp(report(400)),
        ),
    ];
    let got = h.store.delivery_record_outcomes(batch).await.unwrap();
    assert_eq!(got.len(), 5);
    assert_eq!(
        got[0].as_ref().unwrap(),
        &OutcomeRecorded {
            state: DeliveryState::Delivered,
            duplicate: false
        }
    );
    assert_eq!(got[1].as_ref().unwrap().state, DeliveryState::Pending);
    assert!(matches!(got[2], Err(StoreError::LeaseLost)));
    assert!(
        got[3].as_ref().unwrap().duplicate,
        "a repeat in the same batch"
    );
    assert!(matches!(got[4], Err(StoreError::Conflict(_))));
    let d1 = get(&h, "a", claimed[1].delivery.id).await;
    assert_eq!(d1.due_at, h.clock.now().plus(Duration::from_secs(60)));
    let log = attempts(&h, "a", claimed[0].delivery.id).await;
    assert_eq!(log.len(), 1, "one attempt, however often it is repeated");
    let c = h.store.circuit_get(&acct("a"), ok.id).await.unwrap();
    assert_eq!(
        c.consecutive_failures, 1,
        "the failure counted on the circuit"
    );
    let still = get(&h, "a", claimed[2].delivery.id).await;
    assert_eq!(
        still.state,
        DeliveryState::Leased,
        "the stale lease changed nothing"
    );
    assert!(h
        .store
        .delivery_record_outcomes(vec![])
        .await
        .unwrap()
        .is_empty());
}

/// `DeliveryStore::delivery_record_outcomes`: a success recorded in a batch
/// of successes (a set statement on PostgreSQL) and one recorded beside a
/// repeat of its own lease (the general transition) leave the same
/// delivery, attempt-log row and circuit.
pub async fn a_success_is_recorded_alike_on_every_path(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(5, 30, 600)).await;
    let e = endpoint(&h, "a", false).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    let c = claim(&h, 10).await;
    assert_eq!(c.len(), 3);
    let report = AttemptReport {
        status_code: Some(204),
        error: None,
        latency_ms: 17,
        response_body: None,
    };
    let failing = AttemptReport {
        status_code: Some(503),
        error: Some("unavailable".into()),
        latency_ms: 5,
        response_body: None,
    };
    // One failure on the circuit first, so both paths must reset it.
    let retry_at = h.clock.now().plus(Duration::from_secs(60));
    record(
        &h,
        &c[2],
        DeliveryOutcome::Retry {
            at: retry_at,
            report: failing,
        },
    )
    .await;
    assert_eq!(
        h.store
            .circuit_get(&acct("a"), e.id)
            .await
            .unwrap()
            .consecutive_failures,
        1
    );
    h.clock.advance(Duration::from_secs(1));
    let fast = h
        .store
        .delivery_record_outcomes(vec![(
            c[0].lease.clone(),
            DeliveryOutcome::Delivered(report.clone()),
        )])
        .await
        .unwrap();
    let circuit_after_fast = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(circuit_after_fast.consecutive_failures, 0);
    let general = h
        .store
        .delivery_record_outcomes(vec![
            (
                c[1].lease.clone(),
                DeliveryOutcome::Delivered(report.clone()),
            ),
            (c[1].lease.clone(), DeliveryOutcome::Delivered(report)),
        ])
        .await
        .unwrap();
    assert_eq!(
        fast[0].as_ref().unwrap(),
        general[0].as_ref().unwrap(),
        "the same answer"
    );
    assert!(general[1].as_ref().unwrap().duplicate);
    let shape = |d: Delivery| {
        (
            d.state,
            d.attempts,
            d.due_at,
            d.lease_expires_at,
            d.last_error,
            d.updated_at,
        )
    };
    let d0 = get(&h, "a", c[0].delivery.id).await;
    let d1 = get(&h, "a", c[1].delivery.id).await;
    assert_eq!(d0.state, DeliveryState::Delivered);
    assert_eq!(shape(d0), shape(d1), "the same delivery row");
    let log = |a: Vec<AttemptRecord>| -> Vec<_> {
        a.into_iter()
            .map(|r| {
                (
                    r.attempt,
                    r.result,
                    r.status_code,
                    r.error,
                    r.latency_ms,
                    r.will_retry,
                    r.next_attempt_at,
                    r.recorded_at,
                )
            })
            .collect()
    };
    let l0 = attempts(&h, "a", c[0].delivery.id).await;
    let l1 = attempts(&h, "a", c[1].delivery.id).await;
    assert_eq!(l0.len(), 1);
    assert_eq!(log(l0), log(l1), "the same attempt-log row");
    assert_eq!(
        h.store.circuit_get(&acct("a"), e.id).await.unwrap(),
        circuit_after_fast,
        "the same circuit"
    );
}

/// `EndpointStore::endpoint_create` and `DeliveryStore::delivery_record_outcome`:
/// an endpoint's own retry setting gives its new deliveries its attempt
/// limit (not the service's), reaches the dispatcher with every claim, is
/// given again at replay, and changes with an update.
pub async fn an_endpoint_retry_schedule_and_attempt_limit_are_its_own(f: &dyn StoreFactory) {
    let h = open(f).await;
    let retry = EndpointRetry::new(vec![Duration::from_secs(1)], Some(2)).unwrap();
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/own",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.retry = Some(retry.clone());
    let own = create_endpoint(&h, req).await;
    assert_eq!(own.retry.as_ref(), Some(&retry));
    assert_eq!(reread(&h, &own).await.retry.as_ref(), Some(&retry));
    let plain = endpoint(&h, "a", false).await;
    assert_eq!(plain.retry, None);
    let p = publish(&h, "a").await;
    let limit_of = |e: EndpointId, ds: &[Delivery]| {
        ds.iter()
            .find(|d| d.endpoint_id == e)
            .map(|d| d.max_attempts)
    };
    let mut made = Vec::new();
    for id in &p.deliveries {
        made.push(get(&h, "a", *id).await);
    }
    assert_eq!(limit_of(own.id, &made), Some(2), "the endpoint's limit");
    let service = StoreOptions::default().max_attempts;
    assert_eq!(limit_of(plain.id, &made), Some(service));
    // Two failed attempts each: the endpoint's delivery is dead, the
    // other one retries.
    let mut last = HashMap::new();
    for attempt in 1..=2u32 {
        let claimed = claim(&h, 10).await;
        assert_eq!(claimed.len(), 2, "attempt {attempt}");
        for c in &claimed {
            let expected = (c.delivery.endpoint_id == own.id).then(|| retry.clone());
            assert_eq!(c.retry, expected, "a claim carries the endpoint's schedule");
            let state = record(&h, c, fail_at(h.clock.now())).await.state;
            last.insert(c.delivery.endpoint_id, (c.delivery.id, state));
        }
    }
    assert_eq!(last[&own.id].1, DeliveryState::Dead);
    assert_eq!(last[&plain.id].1, DeliveryState::Pending);
    // A replay gives the endpoint's limit again.
    let replayed = h
        .store
        .delivery_replay(&acct("a"), last[&own.id].0)
        .await
        .unwrap();
    assert_eq!(replayed.max_attempts, 2 + 2);
    // Back to the service's: new deliveries and claims follow.
    let a = acct("a");
    let key = EndpointKey::new(&a, own.id);
    let back = h
        .store
        .endpoint_update(
            key,
            EndpointUpdateRequest {
                retry: Some(None),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(back.retry, None);
    let next = publish(&h, "a").await;
    for id in &next.deliveries {
        assert_eq!(get(&h, "a", *id).await.max_attempts, service);
    }
    let claimed = claim(&h, 10).await;
    assert!(claimed.iter().any(|c| c.delivery.endpoint_id == own.id));
    assert!(claimed.iter().all(|c| c.retry.is_none()));
}
