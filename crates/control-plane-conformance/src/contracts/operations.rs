//! Contracts of idempotency records, ticks, usage, alerts, dashboard
//! sessions.

use crate::contracts::fixtures::{
    acct, claim, endpoint_for, publish_ok, record, rows, tick, usage_of_a, LEASE,
};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    usage_window, Alert, AlertKind, AttemptReport, BreakerPolicy, Check, ClaimRequest, Clock,
    DeliveryListRequest, DeliveryOutcome, Endpoint, EndpointCreateRequest, IdempotencyBegin,
    IdempotencyBeginRequest, IdempotencyOwner, KeyHash, Page, PageRequest, PublishRequest,
    Recovery, Secret, SessionCreateRequest, StoreError, StoreOptions, StoredResponse,
    TickClaimRequest, Timestamp, UsageBatch, UsageEntry, UsageMetric, UsageRow,
};
use control_plane_runtime::recover;
use serde_json::json;
use std::time::Duration;

/// Begins `(scope, key)` with a request hash and a ttl on the store of `h`.
async fn begin(h: &Harness, scope: &str, key: &str, hash: &str, ttl: Duration) -> IdempotencyBegin {
    h.store
        .idempotency_begin(&IdempotencyBeginRequest::new(scope, key, hash, ttl).unwrap())
        .await
        .unwrap()
}

/// `IdempotencyStore::idempotency_begin`: started, in progress, replay, mismatch.
pub async fn idempotency_begin_reports_every_outcome(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(3600);
    let IdempotencyBegin::Started(token) = begin(&h, "a:/events", "k1", "h1", ttl).await else {
        panic!("expected Started");
    };
    assert_eq!(
        begin(&h, "a:/events", "k1", "h1", ttl).await,
        IdempotencyBegin::InProgress
    );
    assert_eq!(
        begin(&h, "a:/events", "k1", "h2", ttl).await,
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
        begin(&h, "a:/events", "k1", "h1", ttl).await,
        IdempotencyBegin::Replay(resp)
    );
    assert_eq!(
        begin(&h, "a:/events", "k1", "h2", ttl).await,
        IdempotencyBegin::Mismatch
    );
    assert!(
        matches!(
            begin(&h, "b:/events", "k1", "h2", ttl).await,
            IdempotencyBegin::Started(_)
        ),
        "scopes are separate"
    );
    // An empty key cannot be asked for: the request refuses it when built.
    assert!(matches!(
        IdempotencyBeginRequest::new("", "k", "h", ttl),
        Err(StoreError::InvalidInput(_))
    ));
}

/// `IdempotencyStore::idempotency_abandon`: frees the key.
pub async fn idempotency_abandon_frees_the_key(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(60);
    let IdempotencyBegin::Started(t) = begin(&h, "s", "k", "h", ttl).await else {
        panic!("expected Started");
    };
    h.store.idempotency_abandon(&t).await.unwrap();
    assert_eq!(
        h.store.idempotency_abandon(&t).await,
        Err(StoreError::LeaseLost)
    );
    assert!(matches!(
        begin(&h, "s", "k", "other", ttl).await,
        IdempotencyBegin::Started(_)
    ));
}

/// `IdempotencyStore::idempotency_complete`: a stale token is an error, never a silent success.
pub async fn idempotency_complete_with_a_stale_token_is_an_error(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let ttl = Duration::from_secs(60);
    let IdempotencyBegin::Started(old) = begin(&h, "s", "k", "h", ttl).await else {
        panic!("expected Started");
    };
    h.clock.advance(ttl);
    let IdempotencyBegin::Started(new) = begin(&h, "s", "k", "h", ttl).await else {
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
        begin(&h, "s", "k", "h", ttl).await,
        IdempotencyBegin::InProgress
    );
    h.store
        .idempotency_complete(&new, resp.clone())
        .await
        .unwrap();
    assert_eq!(
        begin(&h, "s", "k", "h", ttl).await,
        IdempotencyBegin::Replay(resp)
    );
}

/// `IdempotencyBeginRequest::with_lease`: an unfinished request holds its
/// key for its lease only; a completed one is kept its whole ttl from its
/// completion.
pub async fn an_unfinished_idempotency_record_is_held_only_for_its_lease(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let (ttl, lease) = (Duration::from_secs(3600), Duration::from_secs(60));
    let leased = |key: &'static str| {
        let store = h.store.clone();
        async move {
            store
                .idempotency_begin(
                    &IdempotencyBeginRequest::new("s", key, "h", ttl)
                        .unwrap()
                        .with_lease(lease),
                )
                .await
                .unwrap()
        }
    };
    let IdempotencyBegin::Started(_stuck) = leased("stuck").await else {
        panic!("expected Started");
    };
    let IdempotencyBegin::Started(done) = leased("done").await else {
        panic!("expected Started");
    };
    h.clock.advance(Duration::from_secs(30));
    let resp = StoredResponse {
        status: 201,
        body: "{}".into(),
    };
    h.store
        .idempotency_complete(&done, resp.clone())
        .await
        .unwrap();
    assert_eq!(leased("stuck").await, IdempotencyBegin::InProgress);
    h.clock.advance(Duration::from_secs(31));
    assert!(
        matches!(leased("stuck").await, IdempotencyBegin::Started(_)),
        "its lease passed: the key is free"
    );
    h.clock.advance(Duration::from_secs(3000));
    assert_eq!(
        leased("done").await,
        IdempotencyBegin::Replay(resp),
        "a completed record lives its ttl from its completion"
    );
}

/// `AccountKeyStore::account_key_revoke`: the revoked key's idempotency
/// records go with it; the account's other keys keep theirs.
pub async fn revoking_a_key_drops_its_idempotency_records(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let a = acct("a");
    let mut keys = Vec::new();
    for n in ["1", "2"] {
        let hash = KeyHash::new(n.repeat(64)).unwrap();
        keys.push(h.store.account_key_create(&a, &hash).await.unwrap().id);
    }
    let resp = StoredResponse {
        status: 201,
        body: "{}".into(),
    };
    let scopes: Vec<String> = keys
        .iter()
        .map(|k| IdempotencyOwner::Key(&a, *k).scope())
        .collect();
    for scope in &scopes {
        let IdempotencyBegin::Started(t) =
            begin(&h, scope, "k", "h", Duration::from_secs(3600)).await
        else {
            panic!("expected Started");
        };
        h.store
            .idempotency_complete(&t, resp.clone())
            .await
            .unwrap();
    }
    h.store.account_key_revoke(&a, keys[0]).await.unwrap();
    assert!(matches!(
        begin(&h, &scopes[0], "k", "h", Duration::from_secs(3600)).await,
        IdempotencyBegin::Started(_)
    ));
    assert_eq!(
        begin(&h, &scopes[1], "k", "h", Duration::from_secs(3600)).await,
        IdempotencyBegin::Replay(resp)
    );
}

/// `MaintenanceStore::maintenance_purge`: expired idempotency records are swept.
pub async fn idempotency_records_expire_and_are_swept(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for k in ["a", "b", "c"] {
        begin(&h, "s", k, "h", Duration::from_secs(10)).await;
    }
    begin(&h, "s", "keep", "h", Duration::from_secs(100)).await;
    h.clock.advance(Duration::from_secs(10));
    let r = h
        .store
        .maintenance_purge(Duration::from_secs(86_400), rows(2))
        .await
        .unwrap();
    assert_eq!(r.idempotency_records, 2, "batches are bounded");
    let r = h
        .store
        .maintenance_purge(Duration::from_secs(86_400), rows(2))
        .await
        .unwrap();
    assert_eq!(r.idempotency_records, 1);
    assert_eq!(
        h.store
            .maintenance_purge(Duration::from_secs(86_400), rows(2))
            .await
            .unwrap()
            .idempotency_records,
        0
    );
    assert_eq!(
        begin(&h, "s", "keep", "h", Duration::from_secs(100)).await,
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
                s.tick_claim(
                    &TickClaimRequest::new("sweep", Duration::from_secs(30), Duration::ZERO)
                        .unwrap(),
                )
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
    assert!(tick(&h, "sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .is_none());
    assert!(tick(&h, "other", Duration::from_secs(30), Duration::ZERO)
        .await
        .is_some());
    h.clock.advance(Duration::from_secs(1));
    let next = tick(&h, "sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .expect("expired lease");
    assert_eq!(
        h.store.tick_complete(&held[0], json!(1)).await,
        Err(StoreError::LeaseLost)
    );
    h.store.tick_complete(&next, json!(2)).await.unwrap();
    assert!(tick(&h, "sweep", Duration::from_secs(30), Duration::ZERO)
        .await
        .is_some());
    // An empty name cannot be asked for: the request refuses it when built.
    assert!(matches!(
        TickClaimRequest::new("", LEASE, Duration::ZERO),
        Err(StoreError::InvalidInput(_))
    ));
}

/// `TickStore::tick_claim`: the stored state comes back and the interval holds.
pub async fn tick_state_is_kept_and_interval_respected(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let every = Duration::from_secs(60);
    let t = tick(&h, "t", LEASE, every).await.unwrap();
    assert_eq!(t.state, None);
    h.store
        .tick_complete(&t, json!({"cursor": 42}))
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(59));
    assert!(tick(&h, "t", LEASE, every).await.is_none(), "not due yet");
    h.clock.advance(Duration::from_secs(1));
    let t = tick(&h, "t", LEASE, every).await.unwrap();
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
    let batch = batch.checked().unwrap();
    assert!(h.store.usage_record(batch.clone()).await.unwrap());
    assert!(
        !h.store.usage_record(batch).await.unwrap(),
        "a repeated batch is not counted twice"
    );
    let more = UsageBatch {
        batch_id: "b2".into(),
        entries: vec![entry("a", UsageMetric::EventsPublished, t0, 1)],
    };
    assert!(h.store.usage_record(more.checked().unwrap()).await.unwrap());
    let rows = usage_of_a(&h, t0, t0.plus(hour * 2)).await;
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
        usage_of_a(&h, t0.plus(hour), t0.plus(hour * 2)).await.len(),
        1
    );
    for id in [String::new(), "b".repeat(256), "b\n1".to_string()] {
        let bad = UsageBatch {
            batch_id: id,
            entries: vec![],
        };
        assert!(
            matches!(bad.checked(), Err(StoreError::InvalidInput(_))),
            "a bad batch id is refused before any store sees it"
        );
    }
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
    let e = endpoint_for(&h, "a", &[]).await;
    let publish = || {
        h.store.event_publish(
            PublishRequest::new(acct("a"), "t", json!(1))
                .checked()
                .unwrap(),
        )
    };
    publish().await.unwrap();
    let claim = || {
        h.store
            .delivery_claim(ClaimRequest::new("w", 1, LEASE).unwrap())
    };
    let c = claim().await.unwrap().remove(0);
    let fail = DeliveryOutcome::Retry {
        at: h.clock.now(),
        report: AttemptReport {
            status_code: Some(500),
            error: None,
            latency_ms: 1,
            response_body: None,
        },
    };
    record(&h, &c, fail).await;
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
        response_body: None,
    });
    record(&h, &probe, gone).await;
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
            Secret::new("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4"),
        );
        req.event_types = types.into_iter().map(String::from).collect();
        h.store.endpoint_create(req.checked().unwrap())
    };
    let failing = create("a", vec!["order.paid", "delivery.dead"])
        .await
        .unwrap();
    let watcher = create("a", vec!["delivery.dead"]).await.unwrap();
    let catch_all = create("a", vec![]).await.unwrap();
    let other_account = create("b", vec!["delivery.dead"]).await.unwrap();
    let p = publish_ok(&h, PublishRequest::new(acct("a"), "order.paid", json!(1))).await;
    assert_eq!(p.deliveries.len(), 2, "failing + catch-all");
    let mut claimed = claim(&h, 10).await;
    let c = claimed
        .iter()
        .position(|c| c.delivery.endpoint_id == failing.id)
        .map(|i| claimed.remove(i))
        .unwrap();
    record(
        &h,
        &c,
        DeliveryOutcome::GiveUp(AttemptReport {
            status_code: Some(400),
            error: None,
            latency_ms: 1,
            response_body: None,
        }),
    )
    .await;
    let to = |e: &Endpoint| {
        let id = e.id;
        let account = e.account.clone();
        let store = h.store.clone();
        async move {
            store
                .delivery_list(DeliveryListRequest {
                    endpoint_id: Some(id),
                    ..DeliveryListRequest::all(account, PageRequest::first(10))
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
    // A recovery keeps the rule: still not told about itself.
    let window = Recovery::new(
        failing.id,
        Timestamp::from_millis(0),
        h.clock.now().plus(Duration::from_secs(1)),
    )
    .unwrap();
    let r = recover(h.store.as_ref(), &acct("a"), &window, None, |_| {})
        .await
        .unwrap();
    assert_eq!(r.matched, 1, "order.paid only: {r:?}");
    assert_eq!(
        to(&failing).await.len(),
        1,
        "recovered, still not told about itself"
    );
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
        .maintenance_purge(Duration::from_secs(30 * 86_400), rows(100))
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
