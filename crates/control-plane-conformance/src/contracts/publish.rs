//! Contracts of publishing: fan-out, idempotency, input checks, enqueue,
//! sequence numbers, event listings, account isolation, wake-ups.

use crate::contracts::fixtures::{
    acct, claim, create_endpoint, endpoint, endpoint_for, fail_at, get, is_invalid, open, publish,
    publish_ok, publish_req, record, reread, with_attempts,
};
use crate::StoreFactory;
use control_plane_core::{
    AlertKind, Check, Checked, Clock, DeliveryListRequest, DeliveryState, Enablement,
    EndpointCreateRequest, EndpointKey, EndpointUpdateRequest, Enqueued, EventListRequest,
    PageRequest, PublishRequest, Secret, StoreError, TaskEnqueueRequest, TaskId, TraceParent,
};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

pub async fn publish_fans_out_to_matching_endpoints(f: &dyn StoreFactory) {
    let h = open(f).await;
    let all = endpoint(&h, "a", false).await;
    let paid = endpoint_for(&h, "a", &["invoice.paid"]).await;
    let other = endpoint_for(&h, "a", &["invoice.void"]).await;
    let disabled = endpoint(&h, "a", false).await;
    h.store
        .endpoint_set_enabled(
            EndpointKey::new(&acct("a"), disabled.id),
            Enablement::Disabled { reason: None },
        )
        .await
        .unwrap();
    let deleted = endpoint(&h, "a", false).await;
    h.store
        .endpoint_delete(&acct("a"), deleted.id)
        .await
        .unwrap();
    let _elsewhere = endpoint(&h, "b", false).await;

    let p = publish(&h, "a").await;
    assert!(p.created);
    assert_eq!(p.deliveries.len(), 3);
    let mut targets = HashSet::new();
    for d in &p.deliveries {
        let d = get(&h, "a", *d).await;
        assert_eq!(d.state, DeliveryState::Pending);
        assert_eq!(d.event_id, p.event.id);
        targets.insert(d.endpoint_id);
    }
    assert_eq!(targets, HashSet::from([all.id, paid.id, disabled.id]));
    assert!(!targets.contains(&other.id));
    let body: serde_json::Value = serde_json::from_str(&p.event.body).unwrap();
    assert_eq!(body["type"], "invoice.paid");
    assert_eq!(body["data"], json!({"n": 1}));
    let c = claim(&h, 10).await;
    assert_eq!(c.len(), 2, "the disabled endpoint's delivery is held");
    assert!(c.iter().all(|c| c.body == p.event.body));
}

/// `EventStore::event_publish`: the trace context of a publish is kept with
/// its event (single, batch and keyed publishes) and comes back on every
/// claimed delivery of it; a publish without one has none.
pub async fn the_trace_context_of_a_publish_reaches_its_deliveries(f: &dyn StoreFactory) {
    let h = open(f).await;
    let ep = endpoint(&h, "a", false).await;
    let trace = |n: u8| {
        TraceParent::parse(&format!(
            "00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01"
        ))
        .unwrap()
    };
    let traced = |n: u8, key: Option<&str>| PublishRequest {
        traceparent: Some(trace(n)),
        idempotency_key: key.map(str::to_string),
        ..publish_req("a", "invoice.paid")
    };
    let one = publish_ok(&h, traced(1, None)).await;
    let keyed = publish_ok(&h, traced(2, Some("k"))).await;
    let batch = h
        .store
        .event_publish_batch(
            Checked::all(vec![traced(3, None), publish_req("a", "invoice.paid")]).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(one.event.traceparent, Some(trace(1)));
    let read = h.store.event_get(&acct("a"), keyed.event.id).await.unwrap();
    assert_eq!(read.traceparent, Some(trace(2)));
    let mut want = HashMap::from([
        (one.event.id, Some(trace(1))),
        (keyed.event.id, Some(trace(2))),
        (batch[0].event.id, Some(trace(3))),
        (batch[1].event.id, None),
    ]);
    for c in claim(&h, 10).await {
        assert_eq!(c.delivery.endpoint_id, ep.id);
        let expected = want.remove(&c.delivery.event_id).unwrap();
        assert_eq!(c.traceparent, expected, "{}", c.delivery.event_id);
    }
    assert!(want.is_empty(), "not claimed: {want:?}");
}

/// `EventStore::event_publish`: a repeated idempotency key returns the first event.
pub async fn publish_with_same_idempotency_key_creates_nothing_new(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    let mut req = publish_req("a", "invoice.paid");
    req.idempotency_key = Some("key-1".into());
    let first = publish_ok(&h, req.clone()).await;
    h.clock.advance(Duration::from_secs(5));
    let again = publish_ok(&h, req.clone()).await;
    assert!(first.created);
    assert!(!again.created);
    assert_eq!(again.event, first.event);
    assert_eq!(again.deliveries, first.deliveries);
    let page = h
        .store
        .delivery_list(DeliveryListRequest::all(acct("a"), PageRequest::first(100)))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    let mut other = req.clone();
    other.account = acct("b");
    let b = publish_ok(&h, other).await;
    assert!(b.created, "keys are scoped by account");
    assert_ne!(b.event.id, first.event.id);
}

/// `EventStore::event_find_by_key`: the event a key was published with, in
/// its own account only; an unknown key finds nothing.
pub async fn an_event_is_found_by_its_idempotency_key(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let mut req = publish_req("a", "invoice.paid");
    req.idempotency_key = Some("order-77".into());
    let first = publish_ok(&h, req.clone()).await;
    publish_ok(&h, publish_req("a", "invoice.paid")).await;
    let found = h
        .store
        .event_find_by_key(&acct("a"), "order-77")
        .await
        .unwrap();
    assert_eq!(found, Some(first.event));
    for (account, key) in [("b", "order-77"), ("a", "order-78"), ("a", "")] {
        let none = h.store.event_find_by_key(&acct(account), key).await;
        assert_eq!(none.unwrap(), None, "{account} {key:?}");
    }
}

/// `EventStore::event_publish`: an idempotency key is bound to its
/// request: the same key with another payload or type is `InvalidInput`,
/// alone or in a batch, and stores nothing; the same request still answers
/// with the first event.
pub async fn an_idempotency_key_reused_for_another_request_is_refused(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let mut req = publish_req("a", "invoice.paid");
    req.idempotency_key = Some("key-1".into());
    let first = publish_ok(&h, req.clone()).await;
    let mut other_payload = req.clone();
    other_payload.payload = json!({"n": 2});
    let mut other_type = req.clone();
    other_type.event_type = "invoice.voided".into();
    for bad in [other_payload.clone(), other_type] {
        let e = h.store.event_publish(bad.checked().unwrap()).await;
        is_invalid(e);
    }
    // In a batch, beside a new event: the whole batch stores nothing.
    let batch = h
        .store
        .event_publish_batch(
            Checked::all(vec![publish_req("a", "fresh"), other_payload.clone()]).unwrap(),
        )
        .await;
    is_invalid(batch);
    // Within one batch, a key used twice for two requests is refused too.
    let mut twice = publish_req("a", "x");
    twice.idempotency_key = Some("key-2".into());
    let mut twice_other = twice.clone();
    twice_other.payload = json!({"n": 3});
    let within = h
        .store
        .event_publish_batch(Checked::all(vec![twice, twice_other]).unwrap())
        .await;
    is_invalid(within);
    let page = h
        .store
        .delivery_list(DeliveryListRequest::all(acct("a"), PageRequest::first(100)))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1, "nothing stored beside the first event");
    let again = publish_ok(&h, req).await;
    assert!(!again.created);
    assert_eq!(again.event, first.event);
}

/// `EventStore::event_publish_batch`: all or nothing.
pub async fn publish_batch_is_all_or_nothing(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    // The store's own refusal (a key reused within the batch for another
    // request) fails the whole batch.
    let keyed = |ty: &str| {
        let mut r = publish_req("a", ty);
        r.idempotency_key = Some("reused".into());
        r
    };
    let bad = h
        .store
        .event_publish_batch(
            Checked::all(vec![publish_req("a", "ok"), keyed("one"), keyed("two")]).unwrap(),
        )
        .await;
    is_invalid(bad);
    assert!(claim(&h, 10).await.is_empty());
    let good = h
        .store
        .event_publish_batch(
            Checked::all(vec![
                publish_req("a", "x"),
                publish_req("a", "y"),
                publish_req("a", "z"),
            ])
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(good.len(), 3);
    assert_eq!(good.iter().map(|p| p.deliveries.len()).sum::<usize>(), 3);
    let claimed = claim(&h, 10).await;
    let order: Vec<_> = claimed.iter().map(|c| c.event_type.as_str()).collect();
    assert_eq!(
        order,
        ["x", "y", "z"],
        "sequence numbers follow the batch's order"
    );
    // A request repeated with its key inside one batch: the later one
    // answers with the earlier one's event, and nothing new is stored for it.
    let mut first = publish_req("a", "k.first");
    first.idempotency_key = Some("same".into());
    let again = first.clone();
    let both = h
        .store
        .event_publish_batch(Checked::all(vec![first, again, publish_req("a", "k.other")]).unwrap())
        .await
        .unwrap();
    assert!(both[0].created && !both[1].created && both[2].created);
    assert_eq!(both[1].event, both[0].event);
    assert_eq!(both[1].deliveries, both[0].deliveries);
    assert_eq!(both[0].deliveries.len(), 1);
    let claimed = claim(&h, 10).await;
    let order: Vec<_> = claimed.iter().map(|c| c.event_type.as_str()).collect();
    assert_eq!(order, ["k.first", "k.other"]);
}

/// Only the store publishes operational events: a caller's publish of one of
/// their types is bad input, alone or in a batch, refused when the request
/// is sealed ([`Check::checked`]), so no adapter ever receives it.
pub async fn reserved_event_types_are_invalid_input(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    for kind in AlertKind::ALL {
        let single = publish_req("a", kind.as_str()).checked();
        assert!(
            matches!(single, Err(StoreError::InvalidInput(_))),
            "{kind:?}: {single:?}"
        );
    }
    let batch = Checked::all(vec![
        publish_req("a", "ok"),
        publish_req("a", "delivery.dead"),
    ]);
    is_invalid(batch);
    // A type that only starts like one is the caller's.
    publish_ok(&h, publish_req("a", "delivery.dead.custom")).await;
}

/// Text an adapter cannot store (PostgreSQL cannot store NUL in text;
/// DuckDB can) is refused alike for every adapter: by the request's seal
/// ([`Check::checked`]) on create and publish, by the store on update.
pub async fn control_characters_are_invalid_input(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let single = publish_req("a", "bad\u{0}type").checked();
    is_invalid(single);
    let batch = Checked::all(vec![publish_req("a", "ok"), publish_req("a", "tab\there")]);
    is_invalid(batch);
    let mut keyed = publish_req("a", "ok");
    keyed.idempotency_key = Some("key\u{0}".into());
    let keyed = keyed.checked();
    is_invalid(keyed);
    // A description may hold line breaks, never NUL.
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.description = Some("line one\nline two".into());
    let e = create_endpoint(&h, req.clone()).await;
    assert_eq!(e.description.as_deref(), Some("line one\nline two"));
    req.description = Some("nul\u{0}".into());
    let created = req.checked();
    is_invalid(created);
    assert!(TaskId::new("id\u{0}").is_err());
    // A task kind with NUL; JSON can carry a NUL in any string or key of a
    // task's payload.
    for (kind, payload) in [
        ("kind\u{0}", json!({})),
        ("kind", json!({"note": "nul\u{0}"})),
        ("kind", json!({"a": ["x", {"nul\u{0}": 1}]})),
    ] {
        let task = TaskEnqueueRequest {
            id: TaskId::new("t2").unwrap(),
            account: acct("a"),
            kind: kind.into(),
            payload,
            run_at: None,
        }
        .checked();
        is_invalid(task);
    }
    // An endpoint's URL and event types, on create and on update.
    let mut bad_url = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/nul\u{0}",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    let created = bad_url.clone().checked();
    is_invalid(created);
    bad_url.url = "https://example.com/hook".into();
    bad_url.event_types = vec!["order.paid".into(), "nul\u{0}".into()];
    let created = bad_url.checked();
    is_invalid(created);
    for update in [
        EndpointUpdateRequest {
            description: Some(Some("nul\u{0}".into())),
            ..EndpointUpdateRequest::default()
        },
        EndpointUpdateRequest {
            url: Some("https://example.com/\u{7}".into()),
            ..EndpointUpdateRequest::default()
        },
        EndpointUpdateRequest {
            event_types: Some(vec!["tab\there".into()]),
            ..EndpointUpdateRequest::default()
        },
    ] {
        let updated = h
            .store
            .endpoint_update(EndpointKey::new(&acct("a"), e.id), update)
            .await;
        is_invalid(updated);
    }
    let kept = reread(&h, &e).await;
    assert_eq!(
        (
            kept.url.as_str(),
            kept.event_types.len(),
            kept.description.as_deref()
        ),
        ("https://example.com/hook", 0, Some("line one\nline two")),
        "refused updates changed nothing"
    );
}

/// `DeliveryStore::delivery_enqueue`: exactly one concurrent caller wins.
pub async fn enqueue_is_insert_wins_under_concurrency(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint_for(&h, "a", &["only.this"]).await;
    let p = publish_ok(&h, publish_req("a", "not.that")).await;
    assert!(p.deliveries.is_empty());
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let s = h.store.clone();
            let ev = p.event.id;
            tokio::spawn(async move {
                s.delivery_enqueue(EndpointKey::new(&acct("a"), e.id), ev)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_eq!(results.iter().filter(|r| r.won).count(), 1);
    let id = results[0].delivery_id;
    assert!(results.iter().all(|r| r.delivery_id == id));
    let again = h
        .store
        .delivery_enqueue(EndpointKey::new(&acct("a"), e.id), p.event.id)
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued {
            delivery_id: id,
            won: false
        }
    );
    let nf = h
        .store
        .delivery_enqueue(EndpointKey::new(&acct("b"), e.id), p.event.id)
        .await;
    assert!(matches!(nf, Err(StoreError::NotFound { .. })));
}

/// `EventStore::event_publish`: sequence numbers strictly increase per endpoint.
pub async fn sequence_numbers_strictly_increase_per_endpoint(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", true).await;
    let mut last = std::collections::HashMap::new();
    for _ in 0..5 {
        let p = publish(&h, "a").await;
        for d in p.deliveries {
            let d = get(&h, "a", d).await;
            let prev = last.insert(d.endpoint_id, d.seq);
            assert!(prev.is_none_or(|p| p < d.seq), "{prev:?} then {}", d.seq);
        }
    }
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = h.store.clone();
            tokio::spawn(async move {
                s.event_publish(publish_req("a", "t").checked().unwrap())
                    .await
                    .unwrap()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for e in [e1.id, e2.id] {
        let page = h
            .store
            .delivery_list(DeliveryListRequest {
                endpoint_id: Some(e),
                ..DeliveryListRequest::all(acct("a"), PageRequest::first(100))
            })
            .await
            .unwrap();
        let seqs: Vec<i64> = page.items.iter().map(|d| d.seq).collect();
        assert_eq!(seqs.len(), 13);
        assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    }
}

/// `EventStore::event_list`: filters, newest first, pages that keep one
/// millisecond's events together.
pub async fn event_list_filters_and_pages_newest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    // Seven events: three in one millisecond, then one a second for four seconds.
    let mut published = Vec::new();
    for ty in ["a.one", "a.two", "a.one"] {
        published.push(publish_ok(&h, publish_req("a", ty)).await.event);
    }
    let start = h.clock.now();
    for ty in ["a.two", "a.one", "a.two", "a.one"] {
        h.clock.advance(Duration::from_secs(1));
        published.push(publish_ok(&h, publish_req("a", ty)).await.event);
    }
    publish_ok(&h, publish_req("b", "a.one")).await;
    let list = |event_type: Option<&str>, since, until, page| {
        h.store.event_list(EventListRequest {
            account: acct("a"),
            event_type: event_type.map(str::to_string),
            since,
            until,
            page,
        })
    };
    // Pages of two: the first millisecond's three events come together.
    let (mut seen, mut after, mut sizes) = (Vec::new(), None, Vec::new());
    loop {
        let p = list(None, None, None, PageRequest::new(2, after).unwrap())
            .await
            .unwrap();
        sizes.push(p.items.len());
        seen.extend(p.items);
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(
        sizes,
        vec![2, 2, 3],
        "the last page holds one millisecond's three"
    );
    let times: Vec<_> = seen.iter().map(|e| e.created_at).collect();
    let mut newest_first = times.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, newest_first);
    let mut ids: Vec<_> = seen.iter().map(|e| e.id).collect();
    ids.sort();
    let mut want: Vec<_> = published.iter().map(|e| e.id).collect();
    want.sort();
    assert_eq!(ids, want, "every event of the account once, none of b's");
    assert_eq!(seen[0], published[6]);

    // By type, and by time: [start + 1 s, start + 3 s).
    let ones = list(Some("a.one"), None, None, PageRequest::first(100))
        .await
        .unwrap();
    assert_eq!(ones.items.len(), 4);
    assert!(ones.items.iter().all(|e| e.event_type == "a.one"));
    let window = list(
        None,
        Some(start.plus(Duration::from_secs(1))),
        Some(start.plus(Duration::from_secs(3))),
        PageRequest::first(100),
    )
    .await
    .unwrap();
    let window_ids: Vec<_> = window.items.iter().map(|e| e.id).collect();
    assert_eq!(window_ids, vec![published[4].id, published[3].id]);
    // A limit of 0 cannot be asked for: the page request refuses it.
    let bad = PageRequest::new(0, None);
    is_invalid(bad);
}

/// Every read and write of a delivery is scoped to its account.
pub async fn accounts_never_see_each_others_deliveries(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    let e = endpoint(&h, "a", false).await;
    let p = publish(&h, "a").await;
    let id = p.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, fail_at(h.clock.now())).await;
    let b = acct("b");
    assert!(matches!(
        h.store.delivery_get(&b, id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.delivery_replay(&b, id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.event_get(&b, p.event.id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store.attempt_list_for_delivery(&b, id).await,
        Err(StoreError::NotFound { .. })
    ));
    let listed = h
        .store
        .delivery_list(DeliveryListRequest {
            endpoint_id: Some(e.id),
            ..DeliveryListRequest::all(b.clone(), PageRequest::first(10))
        })
        .await
        .unwrap();
    assert!(listed.items.is_empty());
    assert_eq!(get(&h, "a", id).await.state, DeliveryState::Dead);
    assert_eq!(
        h.store.event_get(&acct("a"), p.event.id).await.unwrap(),
        p.event
    );
}

/// `DeliveryStore::delivery_wakeups`: publishing, replaying and releasing wake an idle worker.
pub async fn publish_wakes_idle_workers(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    endpoint(&h, "a", false).await;
    let mut rx = h.store.delivery_wakeups();
    rx.seen();
    assert!(claim(&h, 1).await.is_empty());
    assert!(!rx.seen(), "nothing happened yet");
    let id = publish(&h, "a").await.deliveries[0];
    let woken = tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("a publish wakes");
    assert!(woken, "the store is open");
    rx.seen();
    let c = claim(&h, 1).await.remove(0);
    h.store.delivery_release(&c.lease).await.unwrap();
    assert!(rx.seen(), "a release wakes");
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, fail_at(h.clock.now())).await;
    rx.seen();
    h.store.delivery_replay(&acct("a"), id).await.unwrap();
    assert!(rx.seen(), "a replay wakes");
}
