//! Contracts of fair claims: in-flight caps, rate limits, ordered
//! endpoints, and the share of each endpoint and account (ADR 0009).

use crate::contracts::fixtures::{
    acct, claim, claim_until_empty, count_for, endpoint, fail_at, ids, limited_endpoint, ok, open,
    publish, publish_n, publish_ok, publish_req, record, with_endpoint_concurrency, LEASE,
};
use crate::StoreFactory;
use control_plane_core::{
    AttemptReport, ClaimRequest, Clock, DeliveryListRequest, DeliveryOutcome, DeliveryState,
    PageRequest, Throttle,
};
use std::collections::HashSet;
use std::time::Duration;

/// `DeliveryStore::delivery_claim`: an ordered endpoint has one delivery in flight, lowest first.
pub async fn ordered_endpoint_has_one_delivery_in_flight_lowest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", true).await;
    let ds: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(publish(&h, "a").await.deliveries[0]);
        }
        v
    };
    let c = claim(&h, 10).await;
    assert_eq!(ids(&c), vec![ds[0]]);
    assert!(claim(&h, 10).await.is_empty(), "one in flight");
    record(
        &h,
        &c[0],
        fail_at(h.clock.now().plus(Duration::from_secs(10))),
    )
    .await;
    assert!(
        claim(&h, 10).await.is_empty(),
        "the head is backing off; the rest wait"
    );
    h.clock.advance(Duration::from_secs(10));
    let c = claim(&h, 10).await;
    assert_eq!(ids(&c), vec![ds[0]]);
    record(&h, &c[0], ok()).await;
    let c = claim(&h, 10).await;
    assert_eq!(ids(&c), vec![ds[1]]);
    record(&h, &c[0], DeliveryOutcome::GiveUp(AttemptReport::default())).await;
    assert_eq!(
        ids(&claim(&h, 10).await),
        vec![ds[2]],
        "dead does not block the next"
    );
}

/// `DeliveryStore::delivery_claim`: leased deliveries of an endpoint never
/// exceed its cap (`max_in_flight`, or the service default) under
/// concurrent claimers; outcomes and expired leases free slots.
pub async fn claim_respects_the_in_flight_cap_under_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(3)).await;
    let capped = limited_endpoint(&h, "a", "x", Some(2), None).await;
    let default = limited_endpoint(&h, "a", "y", None, None).await;
    publish_n(&h, "a", "x", 20).await;
    publish_n(&h, "a", "y", 20).await;
    let first = claim_until_empty(&h, 6, 5).await;
    assert_eq!(count_for(&first, &capped), 2, "max_in_flight = 2");
    assert_eq!(count_for(&first, &default), 3, "the service default, 3");
    // One outcome frees one slot.
    let done = first
        .iter()
        .find(|c| c.delivery.endpoint_id == capped.id)
        .unwrap();
    record(&h, done, ok()).await;
    let next = claim(&h, 10).await;
    assert_eq!(ids(&next).len(), 1);
    assert_eq!(next[0].delivery.endpoint_id, capped.id);
    // Expired leases free theirs; no attempt was spent on waiting rows.
    h.clock.advance(LEASE + Duration::from_secs(1));
    let after = claim_until_empty(&h, 4, 5).await;
    assert_eq!(count_for(&after, &capped), 2);
    assert_eq!(count_for(&after, &default), 3);
    let all = h
        .store
        .delivery_list(DeliveryListRequest::all(acct("a"), PageRequest::first(100)))
        .await
        .unwrap();
    let spent: u32 = all.items.iter().map(|d| d.attempts).sum();
    let claims = first.len() + next.len() + after.len();
    assert_eq!(
        spent as usize, claims,
        "only claims spend attempts; waiting does not"
    );
}

/// `DeliveryStore::delivery_claim`: a cap far above one claim holds too
/// when many claimers lease one endpoint at the same moment: the leases
/// reach the cap and never pass it, and no delivery is handed out twice.
pub async fn a_large_cap_holds_under_many_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(10_000)).await;
    let e = limited_endpoint(&h, "a", "x", Some(450), None).await;
    for _ in 0..10 {
        publish_n(&h, "a", "x", 100).await;
    }
    let got = claim_until_empty(&h, 16, 100).await;
    let distinct: std::collections::HashSet<_> = ids(&got).into_iter().collect();
    assert_eq!(distinct.len(), got.len(), "no delivery is handed out twice");
    assert_eq!(
        count_for(&got, &e),
        450,
        "leases reach the cap of 450 and never pass it"
    );
}

/// `DeliveryStore::delivery_claim`: an endpoint's rate limit holds across
/// concurrent claimers: at most one second of sends at once, then the rate;
/// deliveries beyond it stay pending without spending attempts.
pub async fn claim_respects_the_rate_limit_under_concurrent_claimers(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(1000)).await;
    let limited = limited_endpoint(&h, "a", "x", None, Some(5)).await;
    publish_n(&h, "a", "x", 40).await;
    let burst = claim_until_empty(&h, 4, 3).await;
    assert_eq!(burst.len(), 5, "a full bucket: one second of sends");
    assert!(claim(&h, 10).await.is_empty(), "the bucket is empty");
    h.clock.advance(Duration::from_millis(400));
    assert_eq!(claim_until_empty(&h, 4, 3).await.len(), 2, "0.4 s at 5/s");
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(
        claim_until_empty(&h, 4, 10).await.len(),
        5,
        "the bucket never holds more than one second"
    );
    let d = h
        .store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Pending),
            endpoint_id: Some(limited.id),
            ..DeliveryListRequest::all(acct("a"), PageRequest::first(100))
        })
        .await
        .unwrap();
    assert_eq!(d.items.len(), 28);
    assert!(
        d.items.iter().all(|d| d.attempts == 0),
        "waiting spends no attempts"
    );
}

/// `DeliveryStore::delivery_claim`: a backlog on one endpoint never hides
/// another endpoint's due delivery from the next claim.
pub async fn quiet_endpoint_is_claimed_next_despite_a_backlog(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(10_000)).await;
    let busy = limited_endpoint(&h, "a", "flood", None, None).await;
    let quiet = limited_endpoint(&h, "a", "rare", None, None).await;
    for _ in 0..5 {
        publish_n(&h, "a", "flood", 200).await;
    }
    h.clock.advance(Duration::from_secs(1));
    let rare = publish_ok(&h, publish_req("a", "rare")).await.deliveries[0];
    let c = claim(&h, 10).await;
    assert_eq!(c.len(), 10);
    assert!(
        ids(&c).contains(&rare),
        "the quiet endpoint's delivery is in the next claim"
    );
    assert_eq!(count_for(&c, &busy), 9);
    assert_eq!(count_for(&c, &quiet), 1);
}

/// `DeliveryStore::delivery_claim`: accounts take turns: an account with
/// many busy endpoints gets no more of a claim than an account with one.
pub async fn claims_are_shared_fairly_between_accounts(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(10_000)).await;
    for ty in ["p", "q", "r"] {
        limited_endpoint(&h, "big", ty, None, None).await;
    }
    let small = limited_endpoint(&h, "small", "s", None, None).await;
    for ty in ["p", "q", "r"] {
        publish_n(&h, "big", ty, 30).await;
    }
    h.clock.advance(Duration::from_secs(1));
    publish_n(&h, "small", "s", 30).await;
    let c = claim(&h, 8).await;
    assert_eq!(c.len(), 8);
    assert_eq!(
        count_for(&c, &small),
        4,
        "half of the claim to each account"
    );
}

/// `DeliveryStore::delivery_claim`: a freed slot goes to the endpoint
/// holding the fewest leases, not to the oldest backlog: four slow endpoints
/// of one account fill their caps, one of them finishes a delivery, and the
/// next claim of one goes to a quiet endpoint of the same account whose one
/// delivery is younger than all their backlogs.
pub async fn a_freed_slot_goes_to_the_quiet_endpoint_not_the_slow_backlogs(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(4)).await;
    let mut slow = Vec::new();
    for ty in ["s1", "s2", "s3", "s4"] {
        slow.push(limited_endpoint(&h, "a", ty, None, None).await);
        publish_n(&h, "a", ty, 10).await;
    }
    let quiet = limited_endpoint(&h, "a", "q", None, None).await;
    let c = claim(&h, 100).await;
    for s in &slow {
        assert_eq!(count_for(&c, s), 4, "each slow endpoint fills its cap");
    }
    h.clock.advance(Duration::from_secs(1));
    publish_n(&h, "a", "q", 1).await;
    let first_slow = c
        .iter()
        .find(|d| d.delivery.endpoint_id == slow[0].id)
        .unwrap();
    record(&h, first_slow, ok()).await;
    let next = claim(&h, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].delivery.endpoint_id, quiet.id,
        "the freed slot goes to the endpoint holding none"
    );
    let after = claim(&h, 1).await;
    assert_eq!(
        count_for(&after, &slow[0]),
        1,
        "then the slow endpoint gets its slot back"
    );
}

/// `DeliveryStore::delivery_claim`: the account holding the fewest leases is
/// served first: an account whose five endpoints hold ten leases and have
/// older backlogs gets none of a claim of four while another account's
/// endpoint, holding none, has due work.
pub async fn the_account_holding_the_fewest_leases_gets_the_next_slots(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(10)).await;
    let mut busy = Vec::new();
    for ty in ["p", "q", "r", "s", "t"] {
        busy.push(limited_endpoint(&h, "big", ty, None, None).await);
        publish_n(&h, "big", ty, 20).await;
    }
    let small = limited_endpoint(&h, "small", "u", None, None).await;
    let c = claim(&h, 10).await;
    for b in &busy {
        assert_eq!(count_for(&c, b), 2, "ten slots over five endpoints");
    }
    h.clock.advance(Duration::from_secs(1));
    publish_n(&h, "small", "u", 10).await;
    let next = claim(&h, 4).await;
    assert_eq!(
        count_for(&next, &small),
        4,
        "the account holding none gets every slot until it holds as many"
    );
}

/// `DeliveryStore::delivery_claim`: a claim's throttle lowers the caps of the
/// endpoints it lists, counted against their live leases from every claim,
/// and those endpoints together get at most its budget; the others are
/// claimed as before.
pub async fn a_throttled_endpoint_gets_its_lowered_cap_within_the_budget(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(10)).await;
    let e1 = limited_endpoint(&h, "a", "x", None, None).await;
    let e2 = limited_endpoint(&h, "a", "y", None, None).await;
    let e3 = limited_endpoint(&h, "a", "z", None, None).await;
    for ty in ["x", "y", "z"] {
        publish_n(&h, "a", ty, 10).await;
    }
    let throttled = |budget: u32| {
        ClaimRequest::new("w", 100, LEASE)
            .unwrap()
            .throttled(Throttle {
                caps: vec![(e1.id, 2), (e2.id, 3)],
                budget,
            })
            .unwrap()
    };
    let c = h.store.delivery_claim(throttled(4)).await.unwrap();
    assert_eq!(
        count_for(&c, &e3),
        10,
        "the unlisted endpoint is not throttled"
    );
    assert!(
        count_for(&c, &e1) <= 2 && count_for(&c, &e2) <= 3,
        "caps lowered"
    );
    assert_eq!(
        count_for(&c, &e1) + count_for(&c, &e2),
        4,
        "the throttled endpoints share one budget"
    );
    // A second claim (another replica) counts the first one's leases.
    let again = h.store.delivery_claim(throttled(100)).await.unwrap();
    assert_eq!(count_for(&c, &e1) + count_for(&again, &e1), 2);
    assert_eq!(count_for(&c, &e2) + count_for(&again, &e2), 3);
    // Without the throttle their own cap applies again.
    let plain = claim(&h, 100).await;
    assert_eq!(count_for(&plain, &e1), 8);
    assert_eq!(count_for(&plain, &e2), 7);
}

/// `DeliveryStore::delivery_claim`: nothing starves: claims with outcomes
/// reach every due delivery of every endpoint, capped and rate-limited ones
/// included.
pub async fn every_due_delivery_is_eventually_claimed(f: &dyn StoreFactory) {
    let h = f.open(with_endpoint_concurrency(2)).await;
    let ends = [
        limited_endpoint(&h, "a", "x", None, None).await,
        limited_endpoint(&h, "a", "y", Some(1), Some(3)).await,
        limited_endpoint(&h, "b", "z", None, None).await,
    ];
    endpoint(&h, "b", true).await;
    publish_n(&h, "a", "x", 12).await;
    publish_n(&h, "a", "y", 7).await;
    publish_n(&h, "b", "z", 9).await;
    let mut seen = HashSet::new();
    for _ in 0..200 {
        for c in claim(&h, 4).await {
            seen.insert(c.delivery.id);
            record(&h, &c, ok()).await;
        }
        h.clock.advance(Duration::from_millis(250));
    }
    assert_eq!(seen.len(), 12 + 7 + 9 + 9, "every delivery of {ends:?}");
}
