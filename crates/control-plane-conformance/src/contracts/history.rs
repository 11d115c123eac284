//! Contracts of a delivery after it finished: replay, resend, recovery,
//! bulk replay (listings and counts: `listings.rs`).

use crate::contracts::fixtures::{
    acct, attempts, claim, claim_second_attempt, endpoint, endpoint_for, event, fail_at, get, ids,
    kill_all, ok, open, publish, publish_ok, publish_req, record, with_attempts,
};
use crate::StoreFactory;
use control_plane_core::{
    Clock, Delivery, DeliveryId, DeliveryListRequest, DeliveryState, Endpoint, EndpointId,
    OutcomeRecorded, PageRequest, PublishRequest, Recovered, Recovery, ReplayFilter, StoreError,
    StoreResult,
};
use control_plane_runtime::recover;
use std::time::Duration;

/// `DeliveryStore::delivery_replay`: dead back to pending with a fresh budget.
pub async fn replay_gives_a_dead_delivery_a_fresh_budget(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    let r = h.store.delivery_replay(&acct("a"), id).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "leased is not replayable: {r:?}"
    );
    assert_eq!(
        record(&h, &c, fail_at(h.clock.now())).await.state,
        DeliveryState::Dead
    );
    h.clock.advance(Duration::from_secs(3));
    let d = h.store.delivery_replay(&acct("a"), id).await.unwrap();
    assert_eq!(d.state, DeliveryState::Pending);
    assert_eq!(d.due_at, h.clock.now());
    assert_eq!(d.max_attempts, 2);
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(c.lease.attempt, 2);
    assert_eq!(record(&h, &c, ok()).await.state, DeliveryState::Delivered);
    let r = h.store.delivery_replay(&acct("a"), id).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "delivered is not replayable: {r:?}"
    );
    let r = h.store.delivery_replay(&acct("a"), DeliveryId::new()).await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })));
}

/// `DeliveryStore::delivery_resend`: a delivered (or dead) delivery goes
/// back to pending under the same id, sequence number and log, with a fresh
/// budget; its old lease is lost; pending, leased, unknown and removed ones
/// are refused.
pub async fn a_finished_delivery_is_resent_under_its_id(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    let e = endpoint(&h, "a", false).await;
    let p = publish(&h, "a").await;
    let id = p.deliveries[0];
    let conflict = |r: StoreResult<Delivery>, what: &str| {
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{what}: {r:?}");
    };
    conflict(h.store.delivery_resend(&acct("a"), id).await, "pending");
    let c = claim(&h, 1).await.remove(0);
    conflict(h.store.delivery_resend(&acct("a"), id).await, "leased");
    assert_eq!(record(&h, &c, ok()).await.state, DeliveryState::Delivered);
    let before = get(&h, "a", id).await;
    h.clock.advance(Duration::from_secs(5));
    let d = h.store.delivery_resend(&acct("a"), id).await.unwrap();
    assert_eq!(d.id, id);
    assert_eq!(d.state, DeliveryState::Pending);
    assert_eq!(d.seq, before.seq);
    assert_eq!(d.due_at, h.clock.now());
    assert_eq!(
        d.max_attempts, 2,
        "one attempt spent, a fresh budget of one"
    );
    let stale = h.store.delivery_record_outcome(&c.lease, ok()).await;
    assert!(matches!(stale, Err(StoreError::LeaseLost)), "{stale:?}");
    let again = claim(&h, 1).await.remove(0);
    assert_eq!(again.delivery.id, id);
    assert_eq!(again.lease.attempt, 2);
    assert_eq!(again.body, p.event.body, "the same message");
    let log = attempts(&h, "a", id).await;
    assert_eq!(log.len(), 1, "the first attempt stays in the log");
    // Dead ones are resent too.
    assert_eq!(
        record(&h, &again, fail_at(h.clock.now())).await.state,
        DeliveryState::Dead
    );
    let d = h.store.delivery_resend(&acct("a"), id).await.unwrap();
    assert_eq!(d.state, DeliveryState::Pending);
    let r = h.store.delivery_resend(&acct("a"), DeliveryId::new()).await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    let r = h.store.delivery_resend(&acct("b"), id).await;
    assert!(
        matches!(r, Err(StoreError::NotFound { .. })),
        "another account's: {r:?}"
    );
    // A removed endpoint's deliveries are not sent again.
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, ok()).await;
    h.store.endpoint_delete(&acct("a"), e.id).await.unwrap();
    conflict(
        h.store.delivery_resend(&acct("a"), id).await,
        "endpoint removed",
    );
}

/// `control_plane_core::recover` over the port: an endpoint gets again, once
/// each, the window's events it is subscribed to that did not reach it: dead
/// deliveries resent under their ids, missing ones created, queued ones
/// left, delivered ones left unless the recovery includes them; events
/// outside the window or of other types are not touched.
pub async fn recovering_an_endpoint_sends_its_window_again_once(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    let a = acct("a");
    let paid = endpoint_for(&h, "a", &["invoice.paid"]).await;
    let since = h.clock.now();
    let first = publish(&h, "a").await;
    let second = publish(&h, "a").await;
    publish_ok(&h, publish_req("a", "invoice.void")).await;
    // The first is delivered, the second fails its only attempt.
    for c in claim(&h, 10).await {
        let outcome = if c.delivery.id == first.deliveries[0] {
            ok()
        } else {
            fail_at(h.clock.now())
        };
        record(&h, &c, outcome).await;
    }
    let state = |d: DeliveryId| {
        let h = &h;
        async move { get(h, "a", d).await.state }
    };
    assert_eq!(state(second.deliveries[0]).await, DeliveryState::Dead);
    h.clock.advance(Duration::from_secs(60));
    let until = h.clock.now();
    let later = publish(&h, "a").await;
    // An endpoint made after the window has no delivery of it yet.
    let newcomer = endpoint_for(&h, "a", &["invoice.paid"]).await;

    let window = |e: EndpointId| Recovery::new(e, since, until).unwrap();
    // By default what failed goes again; what was delivered is left.
    let r = recover(h.store.as_ref(), &a, &window(paid.id), None, |_| {})
        .await
        .unwrap();
    assert_eq!(
        r,
        Recovered {
            events: 3,
            matched: 2,
            created: 0,
            resent: 1,
            in_queue: 0,
            already_delivered: 1,
        }
    );
    assert_eq!(
        state(second.deliveries[0]).await,
        DeliveryState::Pending,
        "the dead one resent under its id"
    );
    assert_eq!(state(first.deliveries[0]).await, DeliveryState::Delivered);
    assert_eq!(
        state(later.deliveries[0]).await,
        DeliveryState::Pending,
        "outside the window: as it was (never claimed)"
    );
    // Again at once: the resent one is still queued, nothing goes twice.
    let r = recover(h.store.as_ref(), &a, &window(paid.id), None, |_| {})
        .await
        .unwrap();
    assert_eq!(
        (r.resent, r.in_queue, r.already_delivered, r.created),
        (0, 1, 1, 0)
    );
    // The whole window, on request: the delivered one is sent again too.
    let all = window(paid.id).including_delivered();
    let r = recover(h.store.as_ref(), &a, &all, None, |_| {})
        .await
        .unwrap();
    assert_eq!((r.resent, r.in_queue, r.already_delivered), (1, 1, 0));
    assert_eq!(state(first.deliveries[0]).await, DeliveryState::Pending);
    // The newcomer gets deliveries made for it, once.
    let r = recover(h.store.as_ref(), &a, &window(newcomer.id), None, |_| {})
        .await
        .unwrap();
    assert_eq!((r.matched, r.created, r.resent), (2, 2, 0));
    let r = recover(h.store.as_ref(), &a, &window(newcomer.id), None, |_| {})
        .await
        .unwrap();
    assert_eq!((r.created, r.in_queue), (0, 2));
    let claimed = claim(&h, 10).await;
    let to_newcomer = claimed
        .iter()
        .filter(|c| c.delivery.endpoint_id == newcomer.id)
        .count();
    assert_eq!(
        to_newcomer, 2,
        "the two recovered (the later event came before it)"
    );
    // An unknown endpoint, or a window the wrong way round, is refused.
    let r = recover(
        h.store.as_ref(),
        &a,
        &window(EndpointId::new()),
        None,
        |_| {},
    )
    .await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    assert!(matches!(
        Recovery::new(paid.id, until, since),
        Err(StoreError::InvalidInput(_))
    ));
}

/// `DeliveryStore::delivery_replay`: a replayed dead delivery keeps its
/// sequence number (on an ordered endpoint it is the head again), its log
/// grows, and the lease that ended it is answered as a repeat until the
/// replay and lost after it.
pub async fn a_replayed_delivery_keeps_its_place_and_fences_its_old_lease(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    endpoint(&h, "a", true).await;
    let first = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    let died = fail_at(h.clock.now());
    assert_eq!(
        record(&h, &c, died.clone()).await.state,
        DeliveryState::Dead
    );
    assert_eq!(
        record(&h, &c, died.clone()).await,
        OutcomeRecorded {
            state: DeliveryState::Dead,
            duplicate: true
        }
    );
    let second = publish(&h, "a").await.deliveries[0];
    let next = claim(&h, 1).await;
    assert_eq!(
        ids(&next),
        vec![second],
        "a dead delivery blocked the order"
    );
    h.store.delivery_replay(&acct("a"), first).await.unwrap();
    assert!(
        claim(&h, 10).await.is_empty(),
        "two deliveries of an ordered endpoint in flight"
    );
    assert_eq!(
        record(&h, &next[0], ok()).await.state,
        DeliveryState::Delivered
    );
    assert_eq!(
        h.store.delivery_record_outcome(&c.lease, died).await,
        Err(StoreError::LeaseLost),
        "the lease that ended it outlived the replay"
    );
    let again = claim_second_attempt(&h, &c).await;
    assert_eq!(
        record(&h, &again, ok()).await.state,
        DeliveryState::Delivered
    );
    assert_eq!(attempts(&h, "a", first).await.len(), 2);
}

/// `DeliveryStore::delivery_replay_dead`: the filter's dead deliveries, once.
pub async fn bulk_replay_revives_matching_dead_deliveries_once(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    let (e1, e2) = (
        endpoint(&h, "a", false).await,
        endpoint(&h, "a", false).await,
    );
    endpoint(&h, "b", false).await;
    publish(&h, "a").await;
    let b_dead = publish(&h, "b").await.deliveries[0];
    let early = kill_all(&h).await;
    assert_eq!(early.len(), 3);
    h.clock.advance(Duration::from_secs(60));
    let cut = h.clock.now();
    publish(&h, "a").await;
    let late = kill_all(&h).await;
    let on = |dead: &[(DeliveryId, EndpointId)], e: &Endpoint| {
        dead.iter()
            .find(|(_, ep)| *ep == e.id)
            .map(|(id, _)| *id)
            .unwrap()
    };
    let (late_e1, late_e2) = (on(&late, &e1), on(&late, &e2));

    // One endpoint, died since the cut: one delivery, with a fresh budget.
    let mut filter = ReplayFilter::all(acct("a"));
    filter.endpoint_id = Some(e1.id);
    filter.dead_since = Some(cut);
    assert_eq!(
        h.store.delivery_replay_dead(filter.clone()).await.unwrap(),
        1
    );
    let d = get(&h, "a", late_e1).await;
    assert_eq!(
        (d.state, d.max_attempts, d.due_at),
        (DeliveryState::Pending, 2, h.clock.now())
    );
    assert_eq!(
        get(&h, "a", on(&early, &e1)).await.state,
        DeliveryState::Dead
    );
    assert_eq!(get(&h, "a", late_e2).await.state, DeliveryState::Dead);
    assert_eq!(
        h.store.delivery_replay_dead(filter).await.unwrap(),
        0,
        "once"
    );

    // Died before the cut, every endpoint of the account: not account b's.
    let mut filter = ReplayFilter::all(acct("a"));
    filter.dead_until = Some(cut);
    assert_eq!(h.store.delivery_replay_dead(filter).await.unwrap(), 2);
    assert_eq!(
        get(&h, "a", on(&early, &e2)).await.state,
        DeliveryState::Pending
    );
    assert_eq!(get(&h, "b", b_dead).await.state, DeliveryState::Dead);

    // A deleted endpoint's dead deliveries stay dead.
    h.store.endpoint_delete(&acct("a"), e2.id).await.unwrap();
    let left = h
        .store
        .delivery_replay_dead(ReplayFilter::all(acct("a")))
        .await
        .unwrap();
    assert_eq!(left, 0, "a deleted endpoint's deliveries stay dead");
    assert_eq!(get(&h, "a", late_e2).await.state, DeliveryState::Dead);
    assert_eq!(
        get(&h, "a", on(&early, &e2)).await.state,
        DeliveryState::Dead
    );

    // The revived deliveries are claimed again, on their second attempt.
    assert_eq!(
        h.store
            .delivery_replay_dead(ReplayFilter::all(acct("b")))
            .await
            .unwrap(),
        1
    );
    let again = claim(&h, 10).await;
    assert!(again
        .iter()
        .any(|c| c.delivery.id == late_e1 && c.lease.attempt == 2));
    assert!(again.iter().any(|c| c.delivery.id == b_dead));
}

/// `control_plane_core::recover`: progress is reported after every page but
/// the last, and a recovery given a reported progress goes on from that
/// page: the pages before it are not read again, and its counts carry on.
pub async fn a_recovery_goes_on_from_its_last_reported_page(f: &dyn StoreFactory) {
    let h = open(f).await;
    let a = acct("a");
    let since = h.clock.now();
    // 25 milliseconds of 10 events each: pages are cut between milliseconds.
    for ms in 0..25 {
        let reqs: Vec<PublishRequest> = (0..10).map(|n| event("a", ms * 10 + n)).collect();
        h.store
            .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
            .await
            .unwrap();
        h.clock.advance(Duration::from_millis(1));
    }
    h.clock.advance(Duration::from_secs(1));
    let until = h.clock.now();
    let first = endpoint_for(&h, "a", &["t"]).await;
    let second = endpoint_for(&h, "a", &["t"]).await;
    let mut reports = Vec::new();
    let window = |e: EndpointId| Recovery::new(e, since, until).unwrap();
    let all = recover(h.store.as_ref(), &a, &window(first.id), None, |p| {
        reports.push(*p)
    })
    .await
    .unwrap();
    assert_eq!((all.events, all.created), (250, 250));
    assert_eq!(reports.len(), 1, "one page before the last: {reports:?}");
    let cut = reports[0];
    assert_eq!((cut.done.events, cut.done.created), (200, 200));
    assert!(cut.after.is_some());
    // As if the first run had stopped after its first page: the second
    // endpoint gets only the last page's events, and the counts carry on.
    let rest = recover(h.store.as_ref(), &a, &window(second.id), Some(cut), |_| {})
        .await
        .unwrap();
    assert_eq!((rest.events, rest.created), (250, 250));
    let to_second = h
        .store
        .delivery_list(DeliveryListRequest {
            endpoint_id: Some(second.id),
            ..DeliveryListRequest::all(a.clone(), PageRequest::first(1000))
        })
        .await
        .unwrap();
    assert_eq!(
        to_second.items.len(),
        50,
        "the first page was not read again"
    );
}
