//! Every contract of the port as a plain async function. Run them through
//! [`crate::conformance_suite!`]; each names the rustdoc bullet it enforces.

use std::collections::HashSet;
use std::time::Duration;

use control_plane_core::*;
use serde_json::json;

use crate::{Harness, StoreFactory};

pub use crate::ops_contracts::*;

const LEASE: Duration = Duration::from_secs(30);

fn acct(s: &str) -> AccountId {
    AccountId::new(s).unwrap()
}

async fn open(f: &dyn StoreFactory) -> Harness {
    f.open(StoreOptions::default()).await
}

fn with_attempts(n: u32) -> StoreOptions {
    StoreOptions {
        max_attempts: n,
        ..StoreOptions::default()
    }
}

fn with_breaker(threshold: u32, cooldown_s: u64, max_s: u64) -> StoreOptions {
    StoreOptions {
        breaker: BreakerPolicy {
            failure_threshold: threshold,
            cooldown: Duration::from_secs(cooldown_s),
            max_cooldown: Duration::from_secs(max_s),
        },
        ..StoreOptions::default()
    }
}

fn with_endpoint_concurrency(n: u32) -> StoreOptions {
    StoreOptions {
        endpoint_concurrency: n,
        ..StoreOptions::default()
    }
}

async fn endpoint(h: &Harness, account: &str, ordered: bool) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdA=="),
    );
    req.ordered = ordered;
    h.store.endpoint_create(req).await.unwrap()
}

async fn endpoint_for(h: &Harness, account: &str, types: &[&str]) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdA=="),
    );
    req.event_types = types.iter().map(|s| s.to_string()).collect();
    h.store.endpoint_create(req).await.unwrap()
}

fn publish_req(account: &str, ty: &str) -> PublishRequest {
    PublishRequest::new(acct(account), ty.to_string(), json!({"n": 1}))
}

async fn publish(h: &Harness, account: &str) -> Published {
    h.store
        .event_publish(publish_req(account, "invoice.paid"))
        .await
        .unwrap()
}

async fn claim(h: &Harness, limit: u32) -> Vec<ClaimedDelivery> {
    claim_for(h, limit, LEASE).await
}

async fn claim_for(h: &Harness, limit: u32, lease_for: Duration) -> Vec<ClaimedDelivery> {
    h.store
        .delivery_claim(ClaimRequest::new("w", limit, lease_for))
        .await
        .unwrap()
}

fn ids(c: &[ClaimedDelivery]) -> Vec<DeliveryId> {
    c.iter().map(|c| c.delivery.id).collect()
}

fn ok() -> DeliveryOutcome {
    DeliveryOutcome::Delivered(AttemptReport {
        status_code: Some(200),
        error: None,
        latency_ms: 12,
    })
}

fn fail_at(at: Timestamp) -> DeliveryOutcome {
    DeliveryOutcome::Retry {
        at,
        report: AttemptReport {
            status_code: Some(500),
            error: None,
            latency_ms: 7,
        },
    }
}

async fn record(h: &Harness, c: &ClaimedDelivery, o: DeliveryOutcome) -> OutcomeRecorded {
    h.store.delivery_record_outcome(&c.lease, o).await.unwrap()
}

async fn get(h: &Harness, account: &str, id: DeliveryId) -> Delivery {
    h.store.delivery_get(&acct(account), id).await.unwrap()
}

/// `EndpointStore::endpoint_create`: the stored endpoint reads back equal.
pub async fn endpoint_create_then_get_round_trips(f: &dyn StoreFactory) {
    let h = open(f).await;
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/x",
        Secret::new("whsec_c2VjcmV0"),
    );
    req.event_types = vec!["invoice.paid".into(), "invoice.void".into()];
    req.ordered = true;
    req.rate_limit_per_s = Some(7);
    req.description = Some("billing".into());
    let e = h.store.endpoint_create(req).await.unwrap();
    assert!(e.enabled);
    assert_eq!(e.secrets.current.expose(), "whsec_c2VjcmV0");
    assert_eq!(e.created_at, h.clock.now());
    let got = h.store.endpoint_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(got, e);
    assert_eq!(
        h.store.endpoint_list(&acct("a")).await.unwrap(),
        vec![e.clone()]
    );
    assert_eq!(
        h.store.circuit_get(&acct("a"), e.id).await.unwrap(),
        Circuit::closed()
    );
}

/// `EndpointStore::endpoint_create`: a bad URL is `InvalidInput` and stores nothing.
pub async fn endpoint_create_rejects_bad_url(f: &dyn StoreFactory) {
    let h = open(f).await;
    for url in [
        "ftp://example.com",
        "example.com",
        "https://",
        "https://a b",
    ] {
        let r = h
            .store
            .endpoint_create(EndpointCreateRequest::new(
                acct("a"),
                url,
                Secret::new("whsec_eA=="),
            ))
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{url}: {r:?}"
        );
    }
    assert!(h.store.endpoint_list(&acct("a")).await.unwrap().is_empty());
}

/// `EndpointStore::endpoint_get`: another account's endpoint is `NotFound` everywhere.
pub async fn endpoint_of_another_account_is_not_found(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let b = acct("b");
    let nf = |r: StoreResult<()>| assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    nf(h.store.endpoint_get(&b, e.id).await.map(drop));
    nf(h.store
        .endpoint_update(&b, e.id, EndpointUpdateRequest::default())
        .await
        .map(drop));
    nf(h.store
        .endpoint_set_enabled(&b, e.id, Enablement::Disabled { reason: None })
        .await
        .map(drop));
    nf(h.store
        .endpoint_rotate_secret(&b, e.id, Secret::new("x"), LEASE)
        .await
        .map(drop));
    nf(h.store.endpoint_delete(&b, e.id).await.map(drop));
    nf(h.store.circuit_get(&b, e.id).await.map(drop));
    assert!(h.store.endpoint_list(&b).await.unwrap().is_empty());
    assert!(
        h.store
            .endpoint_get(&acct("a"), e.id)
            .await
            .unwrap()
            .enabled
    );
}

/// `EndpointStore::endpoint_update`: fields not given keep their values.
pub async fn endpoint_update_changes_only_given_fields(f: &dyn StoreFactory) {
    let h = open(f).await;
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/1",
        Secret::new("whsec_eA=="),
    );
    req.description = Some("d".into());
    req.rate_limit_per_s = Some(5);
    let e = h.store.endpoint_create(req).await.unwrap();
    h.clock.advance(Duration::from_secs(1));
    let u = h
        .store
        .endpoint_update(
            &acct("a"),
            e.id,
            EndpointUpdateRequest {
                url: Some("https://example.com/2".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(u.url, "https://example.com/2");
    assert_eq!(u.description.as_deref(), Some("d"));
    assert_eq!(u.rate_limit_per_s, Some(5));
    assert_eq!(u.updated_at, h.clock.now());
    let u = h
        .store
        .endpoint_update(
            &acct("a"),
            e.id,
            EndpointUpdateRequest {
                description: Some(None),
                event_types: Some(vec!["x".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(u.description, None);
    assert_eq!(u.event_types, vec!["x".to_string()]);
    assert_eq!(u.url, "https://example.com/2");
    let bad = h
        .store
        .endpoint_update(
            &acct("a"),
            e.id,
            EndpointUpdateRequest {
                url: Some("nope".into()),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
}

/// `EndpointStore::endpoint_rotate_secret`: the old secret signs during the grace period only.
pub async fn rotate_secret_keeps_previous_for_grace(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let r = h
        .store
        .endpoint_rotate_secret(
            &acct("a"),
            e.id,
            Secret::new("whsec_bmV3"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(r.secrets.current.expose(), "whsec_bmV3");
    assert_eq!(
        r.secrets.previous.as_ref().map(Secret::expose),
        Some(e.secrets.current.expose())
    );
    assert_eq!(r.secrets.signing_at(h.clock.now()).len(), 2);
    publish(&h, "a").await;
    let c = claim(&h, 1).await;
    assert_eq!(c[0].secrets, r.secrets);
    assert_eq!(
        r.secrets
            .signing_at(h.clock.now().plus(Duration::from_secs(60)))
            .len(),
        1
    );
}

/// `DeliveryStore::event_publish`: one delivery per matching endpoint, disabled ones held.
/// Endpoint filters (ADR 0024): a publish goes to the endpoints whose
/// filter its type and payload pass, decided in the publish's transaction;
/// a payload a filter cannot evaluate does not pass and fails nothing; the
/// filter is stored, read back, changed and removed.
pub async fn endpoint_filters_decide_which_events_fan_out(f: &dyn StoreFactory) {
    let h = open(f).await;
    let filtered = |v: serde_json::Value| {
        let mut req = EndpointCreateRequest::new(
            acct("a"),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdA=="),
        );
        req.filter = Some(EventFilter::parse(v).unwrap());
        req
    };
    let big = h
        .store
        .endpoint_create(filtered(json!({"data.amount": {"$gte": 100}})))
        .await
        .unwrap();
    let eur_or_void = h
        .store
        .endpoint_create(filtered(json!({"$or": [
            {"data.currency": "EUR"},
            {"type": "invoice.void"}
        ]})))
        .await
        .unwrap();
    let all = endpoint(&h, "a", false).await;
    assert_eq!(
        h.store
            .endpoint_get(&acct("a"), big.id)
            .await
            .unwrap()
            .filter,
        big.filter,
        "the filter is stored and read back"
    );
    let targets = |p: &Published| p.deliveries.clone();
    let publish_payload = |ty: &str, payload: serde_json::Value| {
        PublishRequest::new(acct("a"), ty.to_string(), payload)
    };
    let published = h
        .store
        .event_publish_batch(vec![
            publish_payload("invoice.paid", json!({"amount": 150, "currency": "USD"})),
            publish_payload("invoice.paid", json!({"amount": 50, "currency": "EUR"})),
            publish_payload("invoice.void", json!({"amount": "a lot"})),
            publish_payload("invoice.paid", json!(["not", "an", "object"])),
        ])
        .await
        .unwrap();
    let mut reached = Vec::new();
    for p in &published {
        let mut eps = Vec::new();
        for d in targets(p) {
            eps.push(get(&h, "a", d).await.endpoint_id);
        }
        eps.sort();
        reached.push(eps);
    }
    let sorted = |mut v: Vec<EndpointId>| {
        v.sort();
        v
    };
    assert_eq!(reached[0], sorted(vec![big.id, all.id]));
    assert_eq!(reached[1], sorted(vec![eur_or_void.id, all.id]));
    assert_eq!(
        reached[2],
        sorted(vec![eur_or_void.id, all.id]),
        "a string amount does not pass $gte 100, and fails nothing"
    );
    assert_eq!(reached[3], vec![all.id]);

    // Changed, then removed.
    let update = |filter| EndpointUpdateRequest {
        filter: Some(filter),
        ..EndpointUpdateRequest::default()
    };
    let changed = h
        .store
        .endpoint_update(
            &acct("a"),
            big.id,
            update(Some(
                EventFilter::parse(json!({"data.amount": {"$lt": 100}})).unwrap(),
            )),
        )
        .await
        .unwrap();
    assert_eq!(
        changed.filter.map(|f| f.to_json()),
        Some(json!({"data.amount": {"$lt": 100}}))
    );
    let p = h
        .store
        .event_publish(publish_payload("invoice.paid", json!({"amount": 50})))
        .await
        .unwrap();
    assert_eq!(
        p.deliveries.len(),
        2,
        "the changed filter lets a small amount through"
    );
    let cleared = h
        .store
        .endpoint_update(&acct("a"), big.id, update(None))
        .await
        .unwrap();
    assert_eq!(cleared.filter, None);
    let p = h
        .store
        .event_publish(publish_payload("invoice.paid", json!({"amount": 500})))
        .await
        .unwrap();
    assert_eq!(
        p.deliveries.len(),
        2,
        "without its filter the endpoint takes every event"
    );
}

pub async fn publish_fans_out_to_matching_endpoints(f: &dyn StoreFactory) {
    let h = open(f).await;
    let all = endpoint(&h, "a", false).await;
    let paid = endpoint_for(&h, "a", &["invoice.paid"]).await;
    let other = endpoint_for(&h, "a", &["invoice.void"]).await;
    let disabled = endpoint(&h, "a", false).await;
    h.store
        .endpoint_set_enabled(
            &acct("a"),
            disabled.id,
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

/// `DeliveryStore::event_publish`: a repeated idempotency key returns the first event.
pub async fn publish_with_same_idempotency_key_creates_nothing_new(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    let mut req = publish_req("a", "invoice.paid");
    req.idempotency_key = Some("key-1".into());
    let first = h.store.event_publish(req.clone()).await.unwrap();
    h.clock.advance(Duration::from_secs(5));
    let again = h.store.event_publish(req.clone()).await.unwrap();
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
    let b = h.store.event_publish(other).await.unwrap();
    assert!(b.created, "keys are scoped by account");
    assert_ne!(b.event.id, first.event.id);
}

/// `DeliveryStore::event_publish`: an idempotency key is bound to its
/// request: the same key with another payload or type is `InvalidInput`,
/// alone or in a batch, and stores nothing; the same request still answers
/// with the first event.
pub async fn an_idempotency_key_reused_for_another_request_is_refused(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let mut req = publish_req("a", "invoice.paid");
    req.idempotency_key = Some("key-1".into());
    let first = h.store.event_publish(req.clone()).await.unwrap();
    let mut other_payload = req.clone();
    other_payload.payload = json!({"n": 2});
    let mut other_type = req.clone();
    other_type.event_type = "invoice.voided".into();
    for bad in [other_payload.clone(), other_type] {
        let e = h.store.event_publish(bad).await;
        assert!(matches!(e, Err(StoreError::InvalidInput(_))), "{e:?}");
    }
    // In a batch, beside a new event: the whole batch stores nothing.
    let batch = h
        .store
        .event_publish_batch(vec![publish_req("a", "fresh"), other_payload.clone()])
        .await;
    assert!(
        matches!(batch, Err(StoreError::InvalidInput(_))),
        "{batch:?}"
    );
    // Within one batch, a key used twice for two requests is refused too.
    let mut twice = publish_req("a", "x");
    twice.idempotency_key = Some("key-2".into());
    let mut twice_other = twice.clone();
    twice_other.payload = json!({"n": 3});
    let within = h.store.event_publish_batch(vec![twice, twice_other]).await;
    assert!(
        matches!(within, Err(StoreError::InvalidInput(_))),
        "{within:?}"
    );
    let page = h
        .store
        .delivery_list(DeliveryListRequest::all(acct("a"), PageRequest::first(100)))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1, "nothing stored beside the first event");
    let again = h.store.event_publish(req).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.event, first.event);
}

/// `DeliveryStore::event_publish_batch`: all or nothing.
pub async fn publish_batch_is_all_or_nothing(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let bad = h
        .store
        .event_publish_batch(vec![publish_req("a", "ok"), publish_req("a", "")])
        .await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))), "{bad:?}");
    assert!(claim(&h, 10).await.is_empty());
    let good = h
        .store
        .event_publish_batch(vec![
            publish_req("a", "x"),
            publish_req("a", "y"),
            publish_req("a", "z"),
        ])
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
        .event_publish_batch(vec![first, again, publish_req("a", "k.other")])
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

/// `DeliveryStore::event_publish`: text an adapter cannot store is refused
/// alike by every adapter, before anything is stored (PostgreSQL cannot
/// store NUL in text; DuckDB can).
/// Only the store publishes operational events: a caller's publish of one of
/// their types is bad input, alone, in a batch or by the outbox path, and
/// stores nothing.
pub async fn reserved_event_types_are_invalid_input(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    for kind in AlertKind::ALL {
        let single = h.store.event_publish(publish_req("a", kind.as_str())).await;
        assert!(
            matches!(single, Err(StoreError::InvalidInput(_))),
            "{kind:?}: {single:?}"
        );
    }
    let batch = h
        .store
        .event_publish_batch(vec![
            publish_req("a", "ok"),
            publish_req("a", "delivery.dead"),
        ])
        .await;
    assert!(
        matches!(batch, Err(StoreError::InvalidInput(_))),
        "{batch:?}"
    );
    assert!(
        claim(&h, 10).await.is_empty(),
        "a refused publish stored nothing"
    );
    // A type that only starts like one is the caller's.
    h.store
        .event_publish(publish_req("a", "delivery.dead.custom"))
        .await
        .unwrap();
}

pub async fn control_characters_are_invalid_input(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let single = h
        .store
        .event_publish(publish_req("a", "bad\u{0}type"))
        .await;
    assert!(
        matches!(single, Err(StoreError::InvalidInput(_))),
        "{single:?}"
    );
    let batch = h
        .store
        .event_publish_batch(vec![publish_req("a", "ok"), publish_req("a", "tab\there")])
        .await;
    assert!(
        matches!(batch, Err(StoreError::InvalidInput(_))),
        "{batch:?}"
    );
    let mut keyed = publish_req("a", "ok");
    keyed.idempotency_key = Some("key\u{0}".into());
    let keyed = h.store.event_publish(keyed).await;
    assert!(
        matches!(keyed, Err(StoreError::InvalidInput(_))),
        "{keyed:?}"
    );
    assert!(
        claim(&h, 10).await.is_empty(),
        "a refused publish stored nothing"
    );
    // A description may hold line breaks, never NUL.
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdA=="),
    );
    req.description = Some("line one\nline two".into());
    let e = h.store.endpoint_create(req.clone()).await.unwrap();
    assert_eq!(e.description.as_deref(), Some("line one\nline two"));
    req.description = Some("nul\u{0}".into());
    let created = h.store.endpoint_create(req).await;
    assert!(
        matches!(created, Err(StoreError::InvalidInput(_))),
        "{created:?}"
    );
    let update = EndpointUpdateRequest {
        description: Some(Some("nul\u{0}".into())),
        ..EndpointUpdateRequest::default()
    };
    let updated = h.store.endpoint_update(&acct("a"), e.id, update).await;
    assert!(
        matches!(updated, Err(StoreError::InvalidInput(_))),
        "{updated:?}"
    );
    let kept = h.store.endpoint_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(kept.description.as_deref(), Some("line one\nline two"));
    assert!(TaskId::new("id\u{0}").is_err());
    // A task kind with NUL; JSON can carry a NUL in any string or key of a
    // task's payload.
    for (kind, payload) in [
        ("kind\u{0}", json!({})),
        ("kind", json!({"note": "nul\u{0}"})),
        ("kind", json!({"a": ["x", {"nul\u{0}": 1}]})),
    ] {
        let task = h
            .store
            .workflow_enqueue(TaskEnqueueRequest {
                id: TaskId::new("t2").unwrap(),
                account: acct("a"),
                kind: kind.into(),
                payload,
                run_at: None,
            })
            .await;
        assert!(matches!(task, Err(StoreError::InvalidInput(_))), "{task:?}");
    }
    assert!(
        h.store
            .workflow_get(&acct("a"), &TaskId::new("t2").unwrap())
            .await
            .is_err(),
        "a refused task was not stored"
    );
    // An endpoint's URL and event types, on create and on update.
    let mut bad_url = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/nul\u{0}",
        Secret::new("whsec_dGVzdA=="),
    );
    let created = h.store.endpoint_create(bad_url.clone()).await;
    assert!(
        matches!(created, Err(StoreError::InvalidInput(_))),
        "{created:?}"
    );
    bad_url.url = "https://example.com/hook".into();
    bad_url.event_types = vec!["order.paid".into(), "nul\u{0}".into()];
    let created = h.store.endpoint_create(bad_url).await;
    assert!(
        matches!(created, Err(StoreError::InvalidInput(_))),
        "{created:?}"
    );
    for update in [
        EndpointUpdateRequest {
            url: Some("https://example.com/\u{7}".into()),
            ..EndpointUpdateRequest::default()
        },
        EndpointUpdateRequest {
            event_types: Some(vec!["tab\there".into()]),
            ..EndpointUpdateRequest::default()
        },
    ] {
        let updated = h.store.endpoint_update(&acct("a"), e.id, update).await;
        assert!(
            matches!(updated, Err(StoreError::InvalidInput(_))),
            "{updated:?}"
        );
    }
    let kept = h.store.endpoint_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(
        (kept.url.as_str(), kept.event_types.len()),
        ("https://example.com/hook", 0),
        "refused updates changed nothing"
    );
}

/// `DeliveryStore::delivery_enqueue`: exactly one concurrent caller wins.
pub async fn enqueue_is_insert_wins_under_concurrency(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint_for(&h, "a", &["only.this"]).await;
    let p = h
        .store
        .event_publish(publish_req("a", "not.that"))
        .await
        .unwrap();
    assert!(p.deliveries.is_empty());
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let s = h.store.clone();
            let ev = p.event.id;
            tokio::spawn(async move { s.delivery_enqueue(&acct("a"), e.id, ev).await.unwrap() })
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
        .delivery_enqueue(&acct("a"), e.id, p.event.id)
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued {
            delivery_id: id,
            won: false
        }
    );
    let nf = h.store.delivery_enqueue(&acct("b"), e.id, p.event.id).await;
    assert!(matches!(nf, Err(StoreError::NotFound { .. })));
}

/// `DeliveryStore::event_publish`: sequence numbers strictly increase per endpoint.
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
            tokio::spawn(async move { s.event_publish(publish_req("a", "t")).await.unwrap() })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for e in [e1.id, e2.id] {
        let page = h
            .store
            .delivery_list(DeliveryListRequest {
                account: acct("a"),
                state: None,
                endpoint_id: Some(e),
                event_id: None,
                page: PageRequest::first(100),
            })
            .await
            .unwrap();
        let seqs: Vec<i64> = page.items.iter().map(|d| d.seq).collect();
        assert_eq!(seqs.len(), 13);
        assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    }
}

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
    h.store.event_publish_batch(reqs).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|w| {
            let s = h.store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let c = s
                        .delivery_claim(ClaimRequest::new(format!("w{w}"), 3, LEASE))
                        .await
                        .unwrap();
                    if c.is_empty() {
                        return mine;
                    }
                    mine.extend(c.into_iter().map(|c| c.delivery.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
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

/// `DeliveryStore::delivery_claim`: limits outside 1..=1000 and empty leases are refused.
pub async fn claim_rejects_bad_limits(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    publish(&h, "a").await;
    for (limit, lease_for) in [(0, LEASE), (1001, LEASE), (1, Duration::ZERO)] {
        let r = h
            .store
            .delivery_claim(ClaimRequest::new("w", limit, lease_for))
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{limit}: {r:?}"
        );
    }
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
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap();
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
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap();
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
    assert_eq!(
        h.store
            .attempt_list_for_delivery(&acct("a"), id)
            .await
            .unwrap()
            .len(),
        1
    );
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
    assert_eq!(
        h.store
            .attempt_list_for_delivery(&acct("a"), id)
            .await
            .unwrap()
            .len(),
        1
    );
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
    let a1 = h
        .store
        .attempt_list_for_delivery(&acct("a"), d1.id)
        .await
        .unwrap();
    assert_eq!(a1.len(), 1);
    assert_eq!(
        (a1[0].result, a1[0].status_code, a1[0].latency_ms),
        (AttemptResult::Failed, Some(500), 7)
    );
    assert!(a1[0].will_retry);
    assert_eq!(a1[0].next_attempt_at, Some(later));
    let a0 = h
        .store
        .attempt_list_for_delivery(&acct("a"), d0.id)
        .await
        .unwrap();
    assert_eq!(
        (a0[0].result, a0[0].will_retry),
        (AttemptResult::Delivered, false)
    );
    let a2 = h
        .store
        .attempt_list_for_delivery(&acct("a"), d2.id)
        .await
        .unwrap();
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
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap();
    assert_eq!(
        log.iter().map(|a| a.will_retry).collect::<Vec<_>>(),
        vec![true, false]
    );
    assert!(claim(&h, 1).await.is_empty());
}

/// `DeliveryStore::delivery_record_outcome`: 410 disables the endpoint and holds the delivery.
pub async fn gone_disables_endpoint_and_holds_delivery(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    let gone = DeliveryOutcome::Gone(AttemptReport {
        status_code: Some(410),
        error: None,
        latency_ms: 1,
    });
    assert_eq!(record(&h, &c, gone).await.state, DeliveryState::Pending);
    let ep = h.store.endpoint_get(&acct("a"), e.id).await.unwrap();
    assert!(!ep.enabled);
    assert!(ep.disabled_reason.unwrap_or_default().contains("410"));
    assert!(claim(&h, 1).await.is_empty());
    h.store
        .endpoint_set_enabled(&acct("a"), e.id, Enablement::Enabled)
        .await
        .unwrap();
    let again = claim(&h, 1).await;
    assert_eq!(ids(&again), vec![id]);
    assert_eq!(again[0].lease.attempt, 2);
}

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
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap();
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

/// `control_plane_core::recover` over the port: an endpoint gets the
/// window's events it is subscribed to again, once each: finished ones
/// resent under their ids, missing ones created, queued ones left; events
/// outside the window or of other types are not touched.
pub async fn recovering_an_endpoint_sends_its_window_again_once(f: &dyn StoreFactory) {
    let h = open(f).await;
    let a = acct("a");
    let paid = endpoint_for(&h, "a", &["invoice.paid"]).await;
    let since = h.clock.now();
    let first = publish(&h, "a").await;
    let second = publish(&h, "a").await;
    h.store
        .event_publish(publish_req("a", "invoice.void"))
        .await
        .unwrap();
    for c in claim(&h, 10).await {
        record(&h, &c, ok()).await;
    }
    h.clock.advance(Duration::from_secs(60));
    let until = h.clock.now();
    let later = publish(&h, "a").await;
    // An endpoint made after the window has no delivery of it yet.
    let newcomer = endpoint_for(&h, "a", &["invoice.paid"]).await;

    let window = |e: EndpointId| Recovery::new(e, since, until).unwrap();
    let r = recover(h.store.as_ref(), &a, &window(paid.id))
        .await
        .unwrap();
    assert_eq!(
        r,
        Recovered {
            events: 3,
            matched: 2,
            created: 0,
            resent: 2,
            in_queue: 0
        }
    );
    for p in [&first, &second] {
        let d = get(&h, "a", p.deliveries[0]).await;
        assert_eq!(d.state, DeliveryState::Pending, "resent under its id");
    }
    assert_eq!(
        get(&h, "a", later.deliveries[0]).await.state,
        DeliveryState::Pending,
        "outside the window: as it was (never claimed)"
    );
    // Again at once: they are still queued, nothing is sent twice.
    let r = recover(h.store.as_ref(), &a, &window(paid.id))
        .await
        .unwrap();
    assert_eq!((r.resent, r.in_queue, r.created), (0, 2, 0));
    // The newcomer gets deliveries made for it, once.
    let r = recover(h.store.as_ref(), &a, &window(newcomer.id))
        .await
        .unwrap();
    assert_eq!((r.matched, r.created, r.resent), (2, 2, 0));
    let r = recover(h.store.as_ref(), &a, &window(newcomer.id))
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
    let r = recover(h.store.as_ref(), &a, &window(EndpointId::new())).await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    assert!(matches!(
        Recovery::new(paid.id, until, since),
        Err(StoreError::InvalidInput(_))
    ));
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
    let again = claim(&h, 10).await;
    assert_eq!(ids(&again), vec![first]);
    assert_eq!(
        (again[0].lease.attempt, again[0].delivery.seq),
        (2, c.delivery.seq)
    );
    assert_eq!(
        h.store.delivery_record_outcome(&c.lease, ok()).await,
        Err(StoreError::LeaseLost),
        "the retried lease still fenced"
    );
    assert_eq!(
        record(&h, &again[0], ok()).await.state,
        DeliveryState::Delivered
    );
    let log: Vec<(u32, AttemptResult)> = h
        .store
        .attempt_list_for_delivery(&acct("a"), first)
        .await
        .unwrap()
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
    let again = claim(&h, 10).await;
    assert_eq!(ids(&again), vec![first]);
    assert_eq!(
        (again[0].lease.attempt, again[0].delivery.seq),
        (2, c.delivery.seq)
    );
    assert_eq!(
        record(&h, &again[0], ok()).await.state,
        DeliveryState::Delivered
    );
    assert_eq!(
        h.store
            .attempt_list_for_delivery(&acct("a"), first)
            .await
            .unwrap()
            .len(),
        2
    );
}

/// Claims every due delivery and fails it for good (one attempt each);
/// returns (delivery, endpoint) pairs.
async fn kill_all(h: &Harness) -> Vec<(DeliveryId, EndpointId)> {
    let mut dead = Vec::new();
    for c in claim(h, 10).await {
        let state = record(h, &c, fail_at(h.clock.now())).await.state;
        assert_eq!(state, DeliveryState::Dead);
        dead.push((c.delivery.id, c.delivery.endpoint_id));
    }
    dead
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

/// `AttemptLogStore::attempt_stats`: one endpoint's window, nearest-rank latencies.
pub async fn attempt_stats_count_results_and_rank_latencies(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let quiet = endpoint_for(&h, "a", &["other.type"]).await;
    let answered = |latency_ms: u64| AttemptReport {
        status_code: Some(200),
        error: None,
        latency_ms,
    };
    // One attempt two hours ago, then four in the last hour.
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, DeliveryOutcome::Delivered(answered(1000))).await;
    h.clock.advance(Duration::from_secs(2 * 3600));
    for _ in 0..4 {
        publish(&h, "a").await;
    }
    let recent = claim(&h, 10).await;
    assert_eq!(recent.len(), 4);
    for (c, ms) in recent.iter().zip([40, 10, 30, 20]) {
        let outcome = if ms == 30 {
            DeliveryOutcome::Retry {
                at: h.clock.now().plus(Duration::from_secs(60)),
                report: answered(ms),
            }
        } else {
            DeliveryOutcome::Delivered(answered(ms))
        };
        record(&h, c, outcome).await;
    }
    let now = h.clock.now();
    let hour = h
        .store
        .attempt_stats(&acct("a"), e.id, now.minus(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(
        hour,
        AttemptStats {
            delivered: 3,
            failed: 1,
            lease_expired: 0,
            p50_latency_ms: Some(20),
            p95_latency_ms: Some(40),
        }
    );
    assert_eq!(hour.success_rate(), Some(0.75));
    let day = h
        .store
        .attempt_stats(&acct("a"), e.id, now.minus(Duration::from_secs(86_400)))
        .await
        .unwrap();
    assert_eq!((day.delivered, day.failed), (4, 1));
    assert_eq!(
        (day.p50_latency_ms, day.p95_latency_ms),
        (Some(30), Some(1000))
    );
    let none = h
        .store
        .attempt_stats(&acct("a"), quiet.id, now.minus(Duration::from_secs(86_400)))
        .await
        .unwrap();
    assert_eq!(none, AttemptStats::default());
    let r = h
        .store
        .attempt_stats(&acct("b"), e.id, now.minus(Duration::from_secs(86_400)))
        .await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
}

/// `DeliveryStore::event_list`: filters, newest first, pages that keep one
/// millisecond's events together.
pub async fn event_list_filters_and_pages_newest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    // Seven events: three in one millisecond, then one a second for four seconds.
    let mut published = Vec::new();
    for ty in ["a.one", "a.two", "a.one"] {
        published.push(
            h.store
                .event_publish(publish_req("a", ty))
                .await
                .unwrap()
                .event,
        );
    }
    let start = h.clock.now();
    for ty in ["a.two", "a.one", "a.two", "a.one"] {
        h.clock.advance(Duration::from_secs(1));
        published.push(
            h.store
                .event_publish(publish_req("a", ty))
                .await
                .unwrap()
                .event,
        );
    }
    h.store
        .event_publish(publish_req("b", "a.one"))
        .await
        .unwrap();
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
        let p = list(None, None, None, PageRequest { limit: 2, after })
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
    let bad = list(
        None,
        None,
        None,
        PageRequest {
            limit: 0,
            after: None,
        },
    )
    .await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))), "{bad:?}");
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
    assert!(h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap()
        .is_empty());
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

/// `DeliveryStore::delivery_list`: filters and keyset pages.
pub async fn delivery_list_filters_and_paginates(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    endpoint(&h, "a", false).await;
    let mut events = Vec::new();
    for _ in 0..5 {
        events.push(publish(&h, "a").await);
    }
    let list = |state, endpoint_id, event_id, page| {
        h.store.delivery_list(DeliveryListRequest {
            account: acct("a"),
            state,
            endpoint_id,
            event_id,
            page,
        })
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = list(None, None, None, PageRequest { limit: 3, after })
            .await
            .unwrap();
        assert!(p.items.len() <= 3);
        seen.extend(p.items.iter().map(|d| d.seq));
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no overlap: {seen:?}"
    );
    let by_ep = list(None, Some(e1.id), None, PageRequest::first(100))
        .await
        .unwrap();
    assert_eq!(by_ep.items.len(), 5);
    assert!(by_ep.items.iter().all(|d| d.endpoint_id == e1.id));
    let by_ev = list(
        None,
        None,
        Some(events[2].event.id),
        PageRequest::first(100),
    )
    .await
    .unwrap();
    assert_eq!(by_ev.items.len(), 2);
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, ok()).await;
    let delivered = list(
        Some(DeliveryState::Delivered),
        None,
        None,
        PageRequest::first(100),
    )
    .await
    .unwrap();
    assert_eq!(
        delivered.items.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![c.delivery.id]
    );
    assert_eq!(delivered.next, None);
    let bad = list(None, None, None, PageRequest::first(0)).await;
    assert!(matches!(bad, Err(StoreError::InvalidInput(_))));
}

/// `AttemptLogStore::attempt_list_for_delivery`: oldest first.
pub async fn attempt_log_lists_by_delivery_oldest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    for _ in 0..2 {
        let c = claim(&h, 1).await.remove(0);
        record(&h, &c, fail_at(h.clock.now())).await;
        h.clock.advance(Duration::from_secs(1));
    }
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, ok()).await;
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), id)
        .await
        .unwrap();
    assert_eq!(
        log.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        log.iter().map(|a| a.result).collect::<Vec<_>>(),
        vec![
            AttemptResult::Failed,
            AttemptResult::Failed,
            AttemptResult::Delivered
        ]
    );
    assert!(log
        .windows(2)
        .all(|w| w[0].recorded_at < w[1].recorded_at && w[0].id < w[1].id));
    assert!(log.iter().all(|a| a.delivery_id == id));
}

/// `AttemptLogStore::attempt_list_for_endpoint`: newest first, pages cover every row once.
pub async fn attempt_log_pages_by_endpoint_newest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", false).await;
    for _ in 0..4 {
        publish(&h, "a").await;
    }
    for c in claim(&h, 8).await {
        record(&h, &c, fail_at(h.clock.now())).await;
    }
    for c in claim(&h, 8)
        .await
        .into_iter()
        .filter(|c| c.delivery.endpoint_id == e1.id)
        .take(3)
    {
        record(&h, &c, ok()).await;
    }
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let p = h
            .store
            .attempt_list_for_endpoint(&acct("a"), e1.id, PageRequest { limit: 3, after })
            .await
            .unwrap();
        rows.extend(p.items);
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|a| a.endpoint_id == e1.id));
    assert!(rows.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert_eq!(rows[0].result, AttemptResult::Delivered);
    let e2_rows = h
        .store
        .attempt_list_for_endpoint(&acct("a"), e2.id, PageRequest::first(100))
        .await
        .unwrap();
    assert_eq!(e2_rows.items.len(), 4);
    let other = h
        .store
        .attempt_list_for_endpoint(&acct("b"), e1.id, PageRequest::first(10))
        .await;
    assert!(matches!(other, Err(StoreError::NotFound { .. })));
}

async fn open_circuit(h: &Harness, e: &Endpoint, failures: u32) {
    for _ in 0..failures {
        publish(h, "a").await;
        let c = claim(h, 1).await;
        assert_eq!(c.len(), 1, "circuit still closed");
        assert_eq!(c[0].delivery.endpoint_id, e.id);
        record(
            h,
            &c[0],
            fail_at(h.clock.now().plus(Duration::from_secs(3600))),
        )
        .await;
    }
}

/// `DeliveryStore::delivery_record_outcome`: consecutive failures open the circuit at the threshold.
pub async fn circuit_opens_at_threshold(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(3, 30, 600)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 2).await;
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!((c.mode, c.consecutive_failures), (CircuitMode::Closed, 2));
    assert_eq!(h.store.circuit_count_open().await.unwrap(), 0);
    open_circuit(&h, &e, 1).await;
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(c.mode, CircuitMode::Open);
    assert_eq!(h.store.circuit_count_open().await.unwrap(), 1);
    assert_eq!(
        c.open_until,
        Some(h.clock.now().plus(Duration::from_secs(30)))
    );
    publish(&h, "a").await;
    assert!(claim(&h, 10).await.is_empty(), "an open circuit is skipped");
}

/// `DeliveryStore::delivery_claim`: after the cooldown exactly one claimer gets
/// one probe, the claimers being replicas (each with its own connections and
/// housekeeping, where the adapter has them).
pub async fn circuit_admits_exactly_one_probe_after_cooldown(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 600)).await;
    let mut replicas = Vec::new();
    for _ in 0..4 {
        replicas.push(f.replica(&h, with_breaker(1, 30, 600)).await);
    }
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    for _ in 0..5 {
        publish(&h, "a").await;
    }
    h.clock.advance(Duration::from_secs(29));
    assert!(claim(&h, 10).await.is_empty());
    h.clock.advance(Duration::from_secs(1));
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                s.delivery_claim(ClaimRequest::new("w", 10, LEASE))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.unwrap());
    }
    assert_eq!(got.len(), 1, "exactly one probe");
    assert!(got[0].probe);
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(c.mode, CircuitMode::HalfOpen);
    assert_eq!(c.probe, Some(got[0].delivery.id));
    assert!(
        claim(&h, 10).await.is_empty(),
        "nothing else while the probe is out"
    );
}

/// `DeliveryStore::delivery_record_outcome`: the probe's success closes the circuit.
pub async fn circuit_closes_on_probe_success(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 600)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    h.clock.advance(Duration::from_secs(30));
    let probe = claim(&h, 10).await.remove(0);
    record(&h, &probe, ok()).await;
    assert_eq!(
        h.store.circuit_get(&acct("a"), e.id).await.unwrap(),
        Circuit::closed()
    );
    let rest = claim(&h, 10).await;
    assert_eq!(rest.len(), 2);
    assert!(rest.iter().all(|c| !c.probe));
}

/// `DeliveryStore::delivery_record_outcome`: a failed probe re-opens with a longer cooldown.
pub async fn circuit_reopens_longer_after_failed_probe(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 100)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    publish(&h, "a").await;
    publish(&h, "a").await;
    let mut expected = [60u64, 100, 100].into_iter();
    h.clock.advance(Duration::from_secs(30));
    for _ in 0..3 {
        let probe = claim(&h, 10).await;
        assert_eq!(probe.len(), 1);
        assert!(probe[0].probe);
        record(&h, &probe[0], fail_at(h.clock.now())).await;
        let cooldown = expected.next().unwrap();
        let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
        assert_eq!(c.mode, CircuitMode::Open);
        assert_eq!(
            c.open_until,
            Some(h.clock.now().plus(Duration::from_secs(cooldown)))
        );
        h.clock.advance(Duration::from_secs(cooldown - 1));
        assert!(claim(&h, 10).await.is_empty());
        h.clock.advance(Duration::from_secs(1));
    }
}

/// `DeliveryStore::delivery_record_outcome`: failing without success for the window disables.
pub async fn endpoint_is_disabled_after_failing_for_the_window(f: &dyn StoreFactory) {
    let opts = StoreOptions {
        disable_after: Duration::from_secs(3600),
        ..with_breaker(1000, 30, 600)
    };
    let h = f.open(opts).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    h.clock.advance(Duration::from_secs(1800));
    open_circuit(&h, &e, 1).await;
    assert!(
        h.store
            .endpoint_get(&acct("a"), e.id)
            .await
            .unwrap()
            .enabled
    );
    h.clock.advance(Duration::from_secs(1800));
    open_circuit(&h, &e, 1).await;
    let ep = h.store.endpoint_get(&acct("a"), e.id).await.unwrap();
    assert!(!ep.enabled);
    assert!(ep.disabled_reason.is_some());
}

/// `EndpointStore::endpoint_set_enabled`: a disabled endpoint's deliveries are held, then resume.
pub async fn disabled_endpoint_holds_deliveries_until_enabled(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let before = publish(&h, "a").await.deliveries[0];
    let d = h
        .store
        .endpoint_set_enabled(
            &acct("a"),
            e.id,
            Enablement::Disabled {
                reason: Some("maintenance".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (d.enabled, d.disabled_reason.as_deref()),
        (false, Some("maintenance"))
    );
    endpoint(&h, "b", false).await;
    assert_eq!(h.store.endpoint_count_disabled().await.unwrap(), 1);
    let during = publish(&h, "a").await.deliveries[0];
    h.clock.advance(Duration::from_secs(3600));
    assert!(claim(&h, 10).await.is_empty());
    assert_eq!(get(&h, "a", before).await.state, DeliveryState::Pending);
    assert_eq!(get(&h, "a", during).await.state, DeliveryState::Pending);
    let d = h
        .store
        .endpoint_set_enabled(&acct("a"), e.id, Enablement::Enabled)
        .await
        .unwrap();
    assert_eq!((d.enabled, d.disabled_reason), (true, None));
    assert_eq!(h.store.endpoint_count_disabled().await.unwrap(), 0);
    assert_eq!(ids(&claim(&h, 10).await), vec![before, during]);
}

/// `DeliveryStore::delivery_count_by_account_and_state`: exact counts per
/// account and state, which sum to `delivery_count_by_state`.
pub async fn deliveries_are_counted_by_account_and_state(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    publish(&h, "b").await;
    let c = claim(&h, 2).await;
    record(&h, &c[0], ok()).await;
    let mut counts = h.store.delivery_count_by_account_and_state().await.unwrap();
    counts.sort_by(|x, y| (x.0.as_str(), x.1.as_str()).cmp(&(y.0.as_str(), y.1.as_str())));
    let leased_account = c[1].delivery.account.as_str().to_string();
    let delivered_account = c[0].delivery.account.as_str().to_string();
    let mut expected: Vec<(String, DeliveryState, u64)> = Vec::new();
    for account in ["a", "b"] {
        let total = if account == "a" { 3 } else { 1 };
        let delivered = u64::from(account == delivered_account);
        let leased = u64::from(account == leased_account);
        for (state, n) in [
            (DeliveryState::Delivered, delivered),
            (DeliveryState::Leased, leased),
            (DeliveryState::Pending, total - delivered - leased),
        ] {
            if n > 0 {
                expected.push((account.to_string(), state, n));
            }
        }
    }
    expected.sort_by(|x, y| (x.0.as_str(), x.1.as_str()).cmp(&(y.0.as_str(), y.1.as_str())));
    let got: Vec<(String, DeliveryState, u64)> = counts
        .iter()
        .map(|(a, s, n)| (a.as_str().to_string(), *s, *n))
        .collect();
    assert_eq!(got, expected);
    let mut by_state = h.store.delivery_count_by_state().await.unwrap();
    by_state.sort_by_key(|(s, _)| s.as_str());
    let mut summed: std::collections::BTreeMap<&str, u64> = Default::default();
    for (_, s, n) in &counts {
        *summed.entry(s.as_str()).or_default() += n;
    }
    let by_state: Vec<(&str, u64)> = by_state.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    assert_eq!(by_state, summed.into_iter().collect::<Vec<_>>());
}

/// `EndpointStore::endpoint_delete`: undelivered deliveries are parked as dead.
pub async fn deleting_endpoint_parks_deliveries_as_dead(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let keep = endpoint(&h, "b", false).await;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(publish(&h, "a").await.deliveries[0]);
    }
    let other = publish(&h, "b").await.deliveries[0];
    // Claims of one: account a's turn comes first (its delivery is oldest).
    let c = claim(&h, 1).await;
    let done = c.iter().find(|c| c.delivery.id == mine[0]).unwrap();
    record(&h, done, ok()).await;
    let leased = claim(&h, 1).await.remove(0);
    assert_eq!(leased.delivery.id, mine[1]);
    assert_eq!(h.store.endpoint_delete(&acct("a"), e.id).await.unwrap(), 2);
    assert_eq!(get(&h, "a", mine[0]).await.state, DeliveryState::Delivered);
    for id in &mine[1..] {
        let d = get(&h, "a", *id).await;
        assert_eq!(d.state, DeliveryState::Dead);
        assert_eq!(d.last_error.as_deref(), Some("endpoint removed"));
        assert!(matches!(
            h.store.delivery_replay(&acct("a"), *id).await,
            Err(StoreError::Conflict(_))
        ));
    }
    assert_eq!(
        h.store.delivery_record_outcome(&leased.lease, ok()).await,
        Err(StoreError::LeaseLost)
    );
    assert!(matches!(
        h.store.endpoint_get(&acct("a"), e.id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(publish(&h, "a").await.deliveries.is_empty());
    assert_eq!(
        get(&h, "b", other).await.state,
        DeliveryState::Pending,
        "other accounts are untouched"
    );
    assert!(h.store.endpoint_get(&acct("b"), keep.id).await.is_ok());
}

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
            account: b.clone(),
            state: None,
            endpoint_id: Some(e.id),
            event_id: None,
            page: PageRequest::first(10),
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
    rx.borrow_and_update();
    assert!(claim(&h, 1).await.is_empty());
    let woken = |rx: &mut tokio::sync::watch::Receiver<u64>| {
        let changed = rx.has_changed().unwrap();
        rx.borrow_and_update();
        changed
    };
    assert!(!woken(&mut rx), "nothing happened yet");
    let id = publish(&h, "a").await.deliveries[0];
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("a publish wakes")
        .unwrap();
    rx.borrow_and_update();
    let c = claim(&h, 1).await.remove(0);
    h.store.delivery_release(&c.lease).await.unwrap();
    assert!(woken(&mut rx), "a release wakes");
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, fail_at(h.clock.now())).await;
    rx.borrow_and_update();
    h.store.delivery_replay(&acct("a"), id).await.unwrap();
    assert!(woken(&mut rx), "a replay wakes");
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
    let d1 = h
        .store
        .delivery_get(&acct("a"), claimed[1].delivery.id)
        .await
        .unwrap();
    assert_eq!(d1.due_at, h.clock.now().plus(Duration::from_secs(60)));
    let log = h
        .store
        .attempt_list_for_delivery(&acct("a"), claimed[0].delivery.id)
        .await
        .unwrap();
    assert_eq!(log.len(), 1, "one attempt, however often it is repeated");
    let c = h.store.circuit_get(&acct("a"), ok.id).await.unwrap();
    assert_eq!(
        c.consecutive_failures, 1,
        "the failure counted on the circuit"
    );
    let still = h
        .store
        .delivery_get(&acct("a"), claimed[2].delivery.id)
        .await
        .unwrap();
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
    };
    let failing = AttemptReport {
        status_code: Some(503),
        error: Some("unavailable".into()),
        latency_ms: 5,
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
    let d0 = h
        .store
        .delivery_get(&acct("a"), c[0].delivery.id)
        .await
        .unwrap();
    let d1 = h
        .store
        .delivery_get(&acct("a"), c[1].delivery.id)
        .await
        .unwrap();
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
    let l0 = h
        .store
        .attempt_list_for_delivery(&acct("a"), c[0].delivery.id)
        .await
        .unwrap();
    let l1 = h
        .store
        .attempt_list_for_delivery(&acct("a"), c[1].delivery.id)
        .await
        .unwrap();
    assert_eq!(l0.len(), 1);
    assert_eq!(log(l0), log(l1), "the same attempt-log row");
    assert_eq!(
        h.store.circuit_get(&acct("a"), e.id).await.unwrap(),
        circuit_after_fast,
        "the same circuit"
    );
}

/// An endpoint receiving only `ty`, with the given flow limits.
async fn limited_endpoint(
    h: &Harness,
    account: &str,
    ty: &str,
    max_in_flight: Option<u32>,
    rate_limit_per_s: Option<u32>,
) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdA=="),
    );
    req.event_types = vec![ty.to_string()];
    req.max_in_flight = max_in_flight;
    req.rate_limit_per_s = rate_limit_per_s;
    h.store.endpoint_create(req).await.unwrap()
}

async fn publish_n(h: &Harness, account: &str, ty: &str, n: usize) {
    let reqs: Vec<_> = (0..n).map(|_| publish_req(account, ty)).collect();
    h.store.event_publish_batch(reqs).await.unwrap();
}

/// Claims with `workers` concurrent claimers, `limit` each, until every one
/// gets nothing; returns everything claimed.
async fn claim_until_empty(h: &Harness, workers: usize, limit: u32) -> Vec<ClaimedDelivery> {
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let s = h.store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let c = s
                        .delivery_claim(ClaimRequest::new(format!("w{w}"), limit, LEASE))
                        .await
                        .unwrap();
                    if c.is_empty() {
                        return mine;
                    }
                    mine.extend(c);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn count_for(c: &[ClaimedDelivery], e: &Endpoint) -> usize {
    c.iter().filter(|c| c.delivery.endpoint_id == e.id).count()
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
            account: acct("a"),
            state: Some(DeliveryState::Pending),
            endpoint_id: Some(limited.id),
            event_id: None,
            page: PageRequest::first(100),
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
    let rare = h
        .store
        .event_publish(publish_req("a", "rare"))
        .await
        .unwrap()
        .deliveries[0];
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
    h.store
        .delivery_record_outcome(&first_slow.lease, ok())
        .await
        .unwrap();
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
    let throttled = |budget: u32| ClaimRequest {
        throttle: Throttle {
            caps: vec![(e1.id, 2), (e2.id, 3)],
            budget,
        },
        ..ClaimRequest::new("w", 100, LEASE)
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
