//! Contracts of endpoints: create, read, change, filters, secrets and their
//! rotation, enabling, deleting, account keys (what a claim sends with:
//! `destinations.rs`).

use crate::contracts::fixtures::{
    acct, claim, create_endpoint, endpoint, get, ids, is_invalid, key_hash, ok, open, publish,
    publish_ok, purge_all, record, reread, rotate, LEASE,
};
use crate::StoreFactory;
use control_plane_core::{
    ed25519_secret, AccountId, Check, Circuit, Clock, DeliveryState, Enablement,
    EndpointCreateRequest, EndpointId, EndpointKey, EndpointUpdateRequest, EventFilter, KeyHash,
    PublishRequest, Published, Secret, SecretRotation, StoreError, StoreOptions, StoreResult,
};
use serde_json::json;
use std::time::Duration;

/// `EndpointStore::endpoint_create`: the stored endpoint reads back equal.
pub async fn endpoint_create_then_get_round_trips(f: &dyn StoreFactory) {
    let h = open(f).await;
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/x",
        Secret::new("whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"),
    );
    req.event_types = vec!["invoice.paid".into(), "invoice.void".into()];
    req.ordered = true;
    req.rate_limit_per_s = Some(7);
    req.description = Some("billing".into());
    let e = create_endpoint(&h, req).await;
    assert!(e.enabled);
    assert_eq!(
        e.secrets.current.expose(),
        "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"
    );
    assert_eq!(e.created_at, h.clock.now());
    let got = reread(&h, &e).await;
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

/// `EndpointStore::endpoint_create`: a bad URL is `InvalidInput` when the
/// request is sealed ([`Check::checked`]), so no adapter ever receives it.
pub async fn endpoint_create_rejects_bad_url(_: &dyn StoreFactory) {
    for url in [
        "ftp://example.com",
        "example.com",
        "https://",
        "https://a b",
    ] {
        let r = EndpointCreateRequest::new(
            acct("a"),
            url,
            Secret::new("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4"),
        )
        .checked();
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{url}: {r:?}"
        );
    }
}

/// `EndpointStore::endpoint_create` and `endpoint_rotate_secret`: a
/// signing secret meets core's one rule (its seal refuses a bad one), and
/// a rotation keeps the endpoint's scheme, refused by the store otherwise.
pub async fn a_signing_secret_is_checked_and_keeps_its_scheme(f: &dyn StoreFactory) {
    for bad in ["whsec_eA==", "whsec_!!", "whsk_eHh4", "plain"] {
        let r = EndpointCreateRequest::new(acct("a"), "https://example.com/x", Secret::new(bad))
            .checked();
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{bad}: {r:?}"
        );
    }
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let a = acct("a");
    let key = ed25519_secret(&[9; 32]);
    let to = |secret: &str| SecretRotation {
        secret: Secret::new(secret),
        grace: Duration::from_secs(60),
    };
    let r = h
        .store
        .endpoint_rotate_secret(EndpointKey::new(&a, e.id), to(&key))
        .await;
    is_invalid(r);
    is_invalid(
        h.store
            .endpoint_rotate_secret(EndpointKey::new(&a, e.id), to("whsec_eA=="))
            .await,
    );
    assert_eq!(
        reread(&h, &e).await.secrets.current,
        e.secrets.current,
        "unchanged"
    );
    let mut req = EndpointCreateRequest::new(acct("a"), "https://example.com/k", Secret::new(key));
    req.event_types = vec!["other".into()];
    let k = create_endpoint(&h, req).await;
    let next = ed25519_secret(&[8; 32]);
    let rotated = h
        .store
        .endpoint_rotate_secret(EndpointKey::new(&a, k.id), to(&next))
        .await
        .unwrap();
    assert_eq!(rotated.secrets.current.expose(), next);
}

/// `EndpointStore::endpoint_get`: another account's endpoint is `NotFound` everywhere.
pub async fn endpoint_of_another_account_is_not_found(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let b = acct("b");
    let nf = |r: StoreResult<()>| assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    nf(h.store.endpoint_get(&b, e.id).await.map(drop));
    nf(h.store
        .endpoint_update(EndpointKey::new(&b, e.id), EndpointUpdateRequest::default())
        .await
        .map(drop));
    nf(h.store
        .endpoint_set_enabled(
            EndpointKey::new(&b, e.id),
            Enablement::Disabled { reason: None },
        )
        .await
        .map(drop));
    nf(h.store
        .endpoint_rotate_secret(
            EndpointKey::new(&b, e.id),
            SecretRotation {
                secret: Secret::new("x"),
                grace: LEASE,
            },
        )
        .await
        .map(drop));
    nf(h.store.endpoint_delete(&b, e.id).await.map(drop));
    nf(h.store.circuit_get(&b, e.id).await.map(drop));
    assert!(h.store.endpoint_list(&b).await.unwrap().is_empty());
    assert!(reread(&h, &e).await.enabled);
}

/// `EndpointStore::endpoint_update`: fields not given keep their values.
pub async fn endpoint_update_changes_only_given_fields(f: &dyn StoreFactory) {
    let h = open(f).await;
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/1",
        Secret::new("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4"),
    );
    req.description = Some("d".into());
    req.rate_limit_per_s = Some(5);
    let e = create_endpoint(&h, req).await;
    h.clock.advance(Duration::from_secs(1));
    let u = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
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
            EndpointKey::new(&acct("a"), e.id),
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
            EndpointKey::new(&acct("a"), e.id),
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
    let r = rotate(&h, "a", &e, Duration::from_secs(60)).await;
    assert_eq!(
        r.secrets.current.expose(),
        "whsec_bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3"
    );
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

/// `EventStore::event_publish`: one delivery per matching endpoint, disabled ones held.
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
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.filter = Some(EventFilter::parse(v).unwrap());
        req
    };
    let big = create_endpoint(&h, filtered(json!({"data.amount": {"$gte": 100}}))).await;
    let eur_or_void = create_endpoint(
        &h,
        filtered(json!({"$or": [
            {"data.currency": "EUR"},
            {"type": "invoice.void"}
        ]})),
    )
    .await;
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
        .event_publish_batch(
            control_plane_core::Checked::all(vec![
                publish_payload("invoice.paid", json!({"amount": 150, "currency": "USD"})),
                publish_payload("invoice.paid", json!({"amount": 50, "currency": "EUR"})),
                publish_payload("invoice.void", json!({"amount": "a lot"})),
                publish_payload("invoice.paid", json!(["not", "an", "object"])),
            ])
            .unwrap(),
        )
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
            EndpointKey::new(&acct("a"), big.id),
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
    let p = publish_ok(&h, publish_payload("invoice.paid", json!({"amount": 50}))).await;
    assert_eq!(
        p.deliveries.len(),
        2,
        "the changed filter lets a small amount through"
    );
    let cleared = h
        .store
        .endpoint_update(EndpointKey::new(&acct("a"), big.id), update(None))
        .await
        .unwrap();
    assert_eq!(cleared.filter, None);
    let p = publish_ok(&h, publish_payload("invoice.paid", json!({"amount": 500}))).await;
    assert_eq!(
        p.deliveries.len(),
        2,
        "without its filter the endpoint takes every event"
    );
}

/// `EndpointStore::endpoint_set_enabled`: a disabled endpoint's deliveries are held, then resume.
pub async fn disabled_endpoint_holds_deliveries_until_enabled(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let before = publish(&h, "a").await.deliveries[0];
    let d = h
        .store
        .endpoint_set_enabled(
            EndpointKey::new(&acct("a"), e.id),
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
        .endpoint_set_enabled(EndpointKey::new(&acct("a"), e.id), Enablement::Enabled)
        .await
        .unwrap();
    assert_eq!((d.enabled, d.disabled_reason), (true, None));
    assert_eq!(h.store.endpoint_count_disabled().await.unwrap(), 0);
    assert_eq!(ids(&claim(&h, 10).await), vec![before, during]);
}

/// `EndpointStore::endpoint_set_enabled`: the store checks an operator's
/// reason (empty, over 500 bytes, NUL) and leaves the endpoint as it was.
pub async fn a_disable_reason_is_checked_by_the_store(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let a = acct("a");
    let key = || EndpointKey::new(&a, e.id);
    for bad in [String::new(), "x".repeat(501), "a\0b".into()] {
        let r = h
            .store
            .endpoint_set_enabled(key(), Enablement::Disabled { reason: Some(bad) })
            .await;
        is_invalid(r);
    }
    assert!(reread(&h, &e).await.enabled, "nothing changed");
    let ok = Enablement::Disabled {
        reason: Some("x".repeat(500)),
    };
    let d = h.store.endpoint_set_enabled(key(), ok).await.unwrap();
    assert!(!d.enabled);
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

/// `AccountKeyStore`: keys are found by hash, scoped to their account, revoked.
pub async fn account_keys_are_found_by_hash_and_revoked(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let k1 = h
        .store
        .account_key_create(&acct("a"), &key_hash("hash-1"))
        .await
        .unwrap();
    let k2 = h
        .store
        .account_key_create(&acct("a"), &key_hash("hash-2"))
        .await
        .unwrap();
    let k3 = h
        .store
        .account_key_create(&acct("b"), &key_hash("hash-3"))
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
        h.store
            .account_key_create(&acct("b"), &key_hash("hash-1"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    for bad in [String::new(), "h".repeat(256), "hash\u{0}".to_string()] {
        assert!(
            matches!(KeyHash::new(bad), Err(StoreError::InvalidInput(_))),
            "a bad key hash is refused before any store sees it"
        );
    }
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

/// `MaintenanceStore::maintenance_purge`: a rotated-out signing secret stays
/// for its grace, then maintenance clears it (it would sign nothing, and it
/// is a credential kept for no use).
pub async fn a_rotated_out_secret_is_cleared_after_its_grace(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let a = AccountId::new("a").unwrap();
    let e = create_endpoint(
        &h,
        EndpointCreateRequest::new(
            a.clone(),
            "https://example.com/hook",
            Secret::new("whsec_b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xk"),
        ),
    )
    .await;
    rotate(&h, "a", &e, Duration::from_secs(3600)).await;
    let r = purge_all(&h, Duration::from_secs(86_400)).await;
    assert_eq!(r.previous_secrets, 0, "still in its grace");
    let kept = h.store.endpoint_get(&a, e.id).await.unwrap();
    assert_eq!(
        kept.secrets.previous.as_ref().map(Secret::expose),
        Some("whsec_b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xk")
    );
    h.clock.advance(Duration::from_secs(3601));
    let r = purge_all(&h, Duration::from_secs(86_400)).await;
    assert_eq!(r.previous_secrets, 1);
    let cleared = h.store.endpoint_get(&a, e.id).await.unwrap();
    assert_eq!(cleared.secrets.previous, None);
    assert_eq!(cleared.secrets.previous_expires_at, None);
    assert_eq!(
        cleared.secrets.current.expose(),
        "whsec_bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3"
    );
}

/// `EndpointStore::endpoint_create` with a quota: creates that race at the
/// quota make no more endpoints than it (the others answer `OverQuota`
/// with what the account would hold, and write nothing); a deleted
/// endpoint no longer counts; another account's endpoints never do.
pub async fn creates_racing_at_an_endpoint_quota_make_no_more_than_it(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let removed = endpoint(&h, "a", false).await;
    for _ in 0..3 {
        endpoint(&h, "b", false).await;
    }
    h.store
        .endpoint_delete(&acct("a"), removed.id)
        .await
        .unwrap();
    let mut racers = Vec::new();
    for _ in 0..16 {
        let store = h.store.clone();
        racers.push(tokio::spawn(async move {
            let mut req = EndpointCreateRequest::new(
                acct("a"),
                "https://example.com/q",
                Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
            );
            req.quota = Some(5);
            store.endpoint_create(req.checked().unwrap()).await
        }));
    }
    let (mut made, mut refused) = (0, 0);
    for r in racers {
        match r.await.unwrap() {
            Ok(_) => made += 1,
            Err(StoreError::OverQuota { what, holds, quota }) => {
                assert_eq!((what, holds, quota), ("endpoints", 6, 5));
                refused += 1;
            }
            Err(e) => panic!("neither made nor over quota: {e:?}"),
        }
    }
    assert_eq!((made, refused), (4, 12));
    assert_eq!(h.store.endpoint_list(&acct("a")).await.unwrap().len(), 5);
    assert_eq!(h.store.endpoint_list(&acct("b")).await.unwrap().len(), 3);
}
