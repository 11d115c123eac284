//! Contracts of poll endpoints (ADR 0051): their consumers read their
//! deliveries in order, and reading is acknowledging.

use crate::contracts::fixtures::{acct, attempts, claim, create_endpoint, endpoint, get, publish};
use crate::contracts::fixtures::{is_invalid, publish_n, publish_ok, publish_req};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    AttemptResult, Check, Clock, DeliveryState, Enablement, Endpoint, EndpointCreateRequest,
    EndpointKey, EndpointUpdateRequest, EventId, PollPage, PollRequest, Secret, StoreError,
    StoreOptions,
};

async fn poll_endpoint(h: &Harness, account: &str, types: &[&str]) -> Endpoint {
    let mut req = EndpointCreateRequest::poll(
        acct(account),
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.event_types = types.iter().map(|s| s.to_string()).collect();
    let e = create_endpoint(h, req).await;
    assert!(e.is_poll() && e.url.is_empty(), "{e:?}");
    e
}

async fn read(h: &Harness, e: &Endpoint, after: Option<i64>, limit: u32) -> PollPage {
    let req = PollRequest::new(e.account.clone(), e.id, after, limit).unwrap();
    h.store.delivery_poll(req).await.unwrap()
}

fn events(p: &PollPage) -> Vec<EventId> {
    p.events.iter().map(|e| e.event_id).collect()
}

/// `PollStore::delivery_poll`: events come in publish order, each once,
/// with the body a pushed endpoint would get; each one read is delivered
/// with one attempt of result `delivered`, and the counts follow; the
/// cursor reads on from the last one, and a read past the end keeps it;
/// the endpoint's stats and the account's rollup count the reads.
pub async fn a_poll_reads_in_order_and_acknowledges_what_it_reads(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let e = poll_endpoint(&h, "a", &[]).await;
    let mut published = Vec::new();
    for _ in 0..5 {
        published.push(publish(&h, "a").await);
    }
    let first = read(&h, &e, None, 2).await;
    assert_eq!(
        events(&first),
        [published[0].event.id, published[1].event.id]
    );
    assert!(!first.done);
    for (p, polled) in published.iter().zip(&first.events) {
        assert_eq!(polled.body, p.event.body);
        assert_eq!(polled.event_type, p.event.event_type);
        assert_eq!(polled.delivery_id, p.deliveries[0]);
        assert_eq!(
            get(&h, "a", polled.delivery_id).await.state,
            DeliveryState::Delivered
        );
        let log = attempts(&h, "a", polled.delivery_id).await;
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(
            (log[0].result, log[0].attempt),
            (AttemptResult::Delivered, 1)
        );
        assert_eq!(log[0].id, polled.position);
    }
    assert_eq!(
        get(&h, "a", published[2].deliveries[0]).await.state,
        DeliveryState::Pending
    );
    let rest = read(&h, &e, Some(first.cursor), 10).await;
    let want: Vec<EventId> = published[2..].iter().map(|p| p.event.id).collect();
    assert_eq!(events(&rest), want);
    assert!(rest.done);
    let positions: Vec<i64> = first
        .events
        .iter()
        .chain(&rest.events)
        .map(|p| p.position)
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let end = read(&h, &e, Some(rest.cursor), 10).await;
    assert_eq!(
        (end.events.len(), end.cursor, end.done),
        (0, rest.cursor, true)
    );
    let counts = h.store.delivery_count_by_account_and_state().await.unwrap();
    assert_eq!(counts, [(acct("a"), DeliveryState::Delivered, 5)]);
    // The endpoint's stats and the account's rollup count the reads.
    let since = h.clock.now().minus(std::time::Duration::from_secs(3600));
    let key = EndpointKey::new(&e.account, e.id);
    let stats = h.store.attempt_stats(key, since).await.unwrap();
    assert_eq!((stats.delivered, stats.failed), (5, 0));
    let rollup = h
        .store
        .attempt_rollup_of_account(&acct("a"), since)
        .await
        .unwrap();
    let counted: i64 = rollup
        .iter()
        .filter(|r| r.endpoint_id == e.id)
        .map(|r| r.n)
        .sum();
    assert_eq!(counted, 5, "{rollup:?}");
}

/// `PollStore::delivery_poll`: a read with an earlier cursor (an answer the
/// consumer lost) returns the same events again and delivers nothing
/// twice; a resent delivery is read again after the rest; a disabled
/// endpoint hands out nothing new but what was read is read again.
pub async fn a_poll_from_an_earlier_cursor_reads_the_same_events_again(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let e = poll_endpoint(&h, "a", &[]).await;
    let mut published = Vec::new();
    for _ in 0..3 {
        published.push(publish(&h, "a").await);
    }
    let ev = |i: usize| published[i].event.id;
    let lost = read(&h, &e, None, 2).await;
    let again = read(&h, &e, None, 2).await;
    assert_eq!(events(&again), events(&lost));
    assert_eq!((again.cursor, lost.events.len()), (lost.cursor, 2));
    assert_eq!(
        get(&h, "a", published[2].deliveries[0]).await.state,
        DeliveryState::Pending
    );
    let all = read(&h, &e, None, 10).await;
    assert_eq!(events(&all), [ev(0), ev(1), ev(2)]);
    for p in &published {
        assert_eq!(attempts(&h, "a", p.deliveries[0]).await.len(), 1);
    }
    let resent = h
        .store
        .delivery_resend(&acct("a"), published[0].deliveries[0])
        .await
        .unwrap();
    assert_eq!(resent.state, DeliveryState::Pending);
    let after_resend = read(&h, &e, Some(all.cursor), 10).await;
    assert_eq!(events(&after_resend), [ev(0)]);
    assert_eq!(attempts(&h, "a", published[0].deliveries[0]).await.len(), 2);

    let key = EndpointKey::new(&e.account, e.id);
    let reason = Some("paused".to_string());
    h.store
        .endpoint_set_enabled(key, Enablement::Disabled { reason })
        .await
        .unwrap();
    let held = publish(&h, "a").await;
    let nothing = read(&h, &e, Some(after_resend.cursor), 10).await;
    assert_eq!(
        (nothing.events.len(), nothing.cursor),
        (0, after_resend.cursor)
    );
    assert_eq!(
        get(&h, "a", held.deliveries[0]).await.state,
        DeliveryState::Pending
    );
    assert_eq!(
        events(&read(&h, &e, None, 10).await),
        [ev(0), ev(1), ev(2), ev(0)]
    );
    h.store
        .endpoint_set_enabled(key, Enablement::Enabled)
        .await
        .unwrap();
    let released = read(&h, &e, Some(after_resend.cursor), 10).await;
    assert_eq!(events(&released), [held.event.id]);
}

/// `PollStore::delivery_poll` and `DeliveryStore::delivery_claim`: a claim
/// never takes a poll endpoint's deliveries; its event types choose its
/// deliveries as for any endpoint; another account's endpoint is not
/// found, a pushed one is refused, a deleted one is gone, a cursor ahead of
/// its reads is refused and hands nothing out; the settings that only shape
/// sending are refused on it.
pub async fn a_poll_endpoint_is_read_only_by_its_consumer(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let p = poll_endpoint(&h, "a", &["invoice.*"]).await;
    let pushed = endpoint(&h, "a", false).await;
    let paid = publish_ok(&h, publish_req("a", "invoice.paid")).await;
    publish_ok(&h, publish_req("a", "user.created")).await;
    let claimed = claim(&h, 10).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    assert!(claimed.iter().all(|c| c.delivery.endpoint_id == pushed.id));
    let page = read(&h, &p, None, 10).await;
    assert_eq!(events(&page), [paid.event.id]);

    // A cursor ahead of every read of this endpoint (another endpoint's,
    // or made up) is refused and hands nothing out unseen.
    let waiting = publish_ok(&h, publish_req("a", "invoice.sent")).await;
    let ahead = PollRequest::new(acct("a"), p.id, Some(i64::MAX / 2), 10).unwrap();
    is_invalid(h.store.delivery_poll(ahead).await);
    let delivery = waiting.deliveries[0];
    assert_eq!(get(&h, "a", delivery).await.state, DeliveryState::Pending);
    let next = read(&h, &p, Some(page.cursor), 10).await;
    assert_eq!(events(&next), [waiting.event.id]);

    let other = PollRequest::new(acct("b"), p.id, None, 10).unwrap();
    assert!(matches!(
        h.store.delivery_poll(other).await,
        Err(StoreError::NotFound { .. })
    ));
    let of_pushed = PollRequest::new(acct("a"), pushed.id, None, 10).unwrap();
    is_invalid(h.store.delivery_poll(of_pushed).await);

    let mut with_headers = EndpointCreateRequest::poll(acct("a"), p.secrets.current.clone());
    with_headers.headers.insert("x-key".into(), "v".into());
    assert!(with_headers.check().is_err());
    let moved = EndpointUpdateRequest {
        url: Some("https://example.com/hook".into()),
        ..EndpointUpdateRequest::default()
    };
    is_invalid(
        h.store
            .endpoint_update(EndpointKey::new(&acct("a"), p.id), moved)
            .await,
    );

    h.store.endpoint_delete(&acct("a"), p.id).await.unwrap();
    let gone = PollRequest::new(acct("a"), p.id, None, 10).unwrap();
    assert!(matches!(
        h.store.delivery_poll(gone).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// `PollStore::delivery_poll` under concurrency: readers of one endpoint,
/// each following its own cursor at once, all read every event once, in
/// one and the same order (a read never commits a position below one
/// another read already returned), and each event is delivered once.
pub async fn concurrent_polls_of_one_endpoint_read_every_event_once_in_one_order(
    f: &dyn StoreFactory,
) {
    let h = f.open(StoreOptions::default()).await;
    let e = poll_endpoint(&h, "a", &[]).await;
    publish_n(&h, "a", "invoice.paid", 120).await;
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (store, e) = (h.store.clone(), e.clone());
            tokio::spawn(async move {
                let (mut cursor, mut seen) = (None, Vec::new());
                loop {
                    let req = PollRequest::new(e.account.clone(), e.id, cursor, 7).unwrap();
                    let page = store.delivery_poll(req).await.unwrap();
                    if page.events.is_empty() {
                        return seen;
                    }
                    cursor = Some(page.cursor);
                    seen.extend(page.events.into_iter().map(|p| (p.position, p.delivery_id)));
                }
            })
        })
        .collect();
    let mut orders = Vec::new();
    for r in readers {
        orders.push(r.await.unwrap());
    }
    let all = read(&h, &e, None, 1000).await;
    let order: Vec<_> = all
        .events
        .iter()
        .map(|p| (p.position, p.delivery_id))
        .collect();
    assert_eq!(order.len(), 120);
    let mut ids: Vec<_> = order.iter().map(|(_, d)| *d).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120, "each event handed out once");
    for seen in &orders {
        assert_eq!(
            seen, &order,
            "a reader saw every event once, in the one order"
        );
    }
    let counts = h.store.delivery_count_by_account_and_state().await.unwrap();
    assert_eq!(counts, [(acct("a"), DeliveryState::Delivered, 120)]);
}
