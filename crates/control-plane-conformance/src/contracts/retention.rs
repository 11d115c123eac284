//! Contracts of maintenance and retention.

use crate::contracts::fixtures::{
    acct, claim, claim_kinds, endpoint, endpoint_for, enqueue, event, key_hash, ok, open, publish,
    publish_ok, purge_all, put_type, record, rows, task, tid, usage_of_a, with_workflow,
};
use crate::{Harness, StoreFactory};
use control_plane_core::run_maintenance;
use control_plane_core::{
    usage_window, AttemptQuery, AttemptReport, Check, Clock, DeliveryListRequest, DeliveryOutcome,
    DeliveryState, EndpointId, EventListRequest, EventTypePut, IdempotencyBegin,
    IdempotencyBeginRequest, PageRequest, PortalLinkCreateRequest, PortalRole, PublishRequest,
    PurgeBatch, PurgeReport, SessionCreateRequest, StoreError, StoreOptions, StoreResult,
    StoredResponse, Task, TaskClaimRequest, TaskFailed, TaskState, TimeRange, Timestamp,
    UsageBatch, UsageEntry, UsageMetric, ERASE_TASK,
};
use serde_json::json;
use std::time::Duration;

/// `MaintenanceStore::maintenance_purge`: old delivered history goes in batches; live work stays.
pub async fn maintenance_purges_old_history_in_batches(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    endpoint_for(&h, "a", &[]).await;
    let reqs = (0..5)
        .map(|i| PublishRequest::new(acct("a"), "t", json!(i)))
        .collect();
    h.store
        .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
        .await
        .unwrap();
    let claimed = claim(&h, 4).await;
    for c in &claimed[..3] {
        let ok = DeliveryOutcome::Delivered(AttemptReport::default());
        record(&h, c, ok).await;
    }
    let fail = DeliveryOutcome::Retry {
        at: h.clock.now().plus(Duration::from_secs(7200)),
        report: AttemptReport::default(),
    };
    record(&h, &claimed[3], fail).await;
    let retention = Duration::from_secs(3600);
    assert_eq!(
        h.store.maintenance_purge(retention, rows(2)).await.unwrap(),
        PurgeReport::default(),
        "nothing is old yet"
    );
    h.clock.advance(retention);
    let r = h.store.maintenance_purge(retention, rows(2)).await.unwrap();
    assert_eq!((r.deliveries, r.attempts), (2, 2));
    let r = h.store.maintenance_purge(retention, rows(2)).await.unwrap();
    assert_eq!((r.deliveries, r.attempts), (1, 2));
    assert_eq!(
        h.store.maintenance_purge(retention, rows(2)).await.unwrap(),
        PurgeReport::default()
    );
    let mut counts = h.store.delivery_count_by_state().await.unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        counts,
        vec![(DeliveryState::Pending, 2)],
        "live deliveries stay"
    );
    for refused in [0, 10_001] {
        assert!(
            matches!(PurgeBatch::new(refused), Err(StoreError::InvalidInput(_))),
            "a purge batch of {refused} rows is refused before any store sees it"
        );
    }
}

/// `maintenance::run_maintenance`: one replica runs it per interval, on a tick.
pub async fn maintenance_runs_on_a_single_flight_tick(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    for k in 0..5 {
        h.store
            .idempotency_begin(
                &IdempotencyBeginRequest::new("s", format!("k{k}"), "h", Duration::from_secs(1))
                    .unwrap(),
            )
            .await
            .unwrap();
    }
    h.clock.advance(Duration::from_secs(1));
    let every = Duration::from_secs(600);
    let day = Duration::from_secs(86_400);
    let report = run_maintenance(h.store.as_ref(), day, rows(2), every)
        .await
        .unwrap()
        .expect("first run");
    assert_eq!(
        report.idempotency_records, 5,
        "batches continue until nothing is left"
    );
    assert!(
        run_maintenance(h.store.as_ref(), day, rows(2), every)
            .await
            .unwrap()
            .is_none(),
        "not due again yet"
    );
    h.clock.advance(every);
    assert_eq!(
        run_maintenance(h.store.as_ref(), day, rows(2), every)
            .await
            .unwrap(),
        Some(PurgeReport::default())
    );
}

/// `MaintenanceStore::maintenance_purge`: an old event goes once no delivery
/// refers to it (delivered and purged, or never fanned out); an event with a
/// pending or dead delivery stays, and so does a recent one.
pub async fn retention_purges_events_left_without_deliveries(f: &dyn StoreFactory) {
    let h = &f.open(StoreOptions::default()).await;
    let retention = Duration::from_secs(3600);
    let orphan = publish_ok(h, event("a", 0)).await;
    assert!(orphan.deliveries.is_empty(), "no endpoint yet");
    endpoint_for(h, "a", &[]).await;
    let delivered = publish_ok(h, event("a", 1)).await;
    let waiting = publish_ok(h, event("a", 2)).await;
    let c = claim(h, 1).await.remove(0);
    assert_eq!(c.delivery.event_id, delivered.event.id);
    record(h, &c, DeliveryOutcome::Delivered(AttemptReport::default())).await;
    h.clock.advance(retention);
    let recent = publish_ok(h, event("a", 3)).await;
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
    let kept = endpoint_for(h, "a", &[]).await;
    let deleted = endpoint_for(h, "a", &[]).await;
    let published = publish_ok(h, event("a", 1)).await;
    assert_eq!(published.deliveries.len(), 2);
    for c in claim(h, 2).await {
        let give_up = DeliveryOutcome::GiveUp(AttemptReport::default());
        record(h, &c, give_up).await;
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
        enqueue(h, id, "a", "k").await;
    }
    let claimed = claim_kinds(h, &["k"], 3).await;
    let by_id = |id: &str| claimed.iter().find(|c| c.task.id.as_str() == id).unwrap();
    h.store
        .workflow_complete(&by_id("done").lease, json!(1))
        .await
        .unwrap();
    h.store
        .workflow_fail(&by_id("dead").lease, TaskFailed::permanent("no"))
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
    endpoint_for(h, "a", &[]).await;
    let dead_letter = |n| async move {
        publish_ok(h, event("a", n)).await;
        let c = claim(h, 1).await.remove(0);
        let fail = DeliveryOutcome::GiveUp(AttemptReport::default());
        record(h, &c, fail).await;
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
        h.store
            .usage_record(batch.checked().unwrap())
            .await
            .unwrap()
    };
    let t0 = usage_window(h.clock.now());
    assert!(record("old").await);
    h.clock.advance(retention + hour);
    assert!(record("new").await);
    let r = purge_all(h, retention).await;
    assert_eq!(r.usage, 2, "one window and one batch id: {r:?}");
    let rows = usage_of_a(h, t0, h.clock.now().plus(hour)).await;
    assert_eq!(rows.len(), 1, "only the current window: {rows:?}");
    assert!(
        record("old").await,
        "the purged batch id is forgotten, so it counts again"
    );
}

/// What a reader of the port sees of one account: its rows, counted.
#[derive(Debug, PartialEq, Eq)]
struct Census {
    endpoints: usize,
    deliveries: usize,
    events: usize,
    attempts: usize,
    alerts: usize,
    usage: usize,
    event_types: usize,
    tasks: (bool, bool),
    key: bool,
    session: bool,
    link: bool,
}

/// Gives `account` rows of every kind: two endpoints (one deleted later),
/// an event type, a key and a session signed in with it, three events
/// (one delivered, one dead, the rest pending), an alert, a usage
/// window, a task and an erasure task.
async fn fill(h: &Harness, account: &str) {
    endpoint(h, account, false).await;
    let gone = endpoint(h, account, false).await;
    put_type(h, EventTypePut::new(acct(account), "invoice.paid", "paid")).await;
    let hash = format!("{:0>64}", account.as_bytes()[0]);
    h.store
        .account_key_create(&acct(account), &key_hash(&hash))
        .await
        .unwrap();
    let id = format!("{:f>64}", account.as_bytes()[0]);
    let req = SessionCreateRequest::new(id, hash, "c".repeat(64), Duration::from_secs(60));
    h.store.session_create(req.unwrap()).await.unwrap();
    // A portal link, and the session it opened (ADR 0049).
    let link = format!("{:e>64}", account.as_bytes()[0]);
    let req = PortalLinkCreateRequest::new(
        acct(account),
        link.clone(),
        PortalRole::Viewer,
        vec![],
        Duration::from_secs(3600),
    );
    h.store.portal_link_create(req.unwrap()).await.unwrap();
    let id = format!("{:d>64}", account.as_bytes()[0]);
    let req = SessionCreateRequest::new(id, link, "c".repeat(64), Duration::from_secs(60));
    h.store.session_create(req.unwrap()).await.unwrap();
    for _ in 0..3 {
        publish(h, account).await;
    }
    let claimed = claim(h, 2).await;
    record(h, &claimed[0], ok()).await;
    let give_up = DeliveryOutcome::GiveUp(AttemptReport {
        status_code: Some(400),
        error: None,
        latency_ms: 1,
        response_body: None,
    });
    record(h, &claimed[1], give_up).await;
    let usage = UsageBatch {
        batch_id: format!("usage-{account}"),
        entries: vec![UsageEntry {
            account: acct(account),
            metric: UsageMetric::EventsPublished,
            at: h.clock.now(),
            amount: 3,
        }],
    };
    h.store
        .usage_record(usage.checked().unwrap())
        .await
        .unwrap();
    enqueue(h, "job", account, "some.kind").await;
    enqueue(h, "erase", account, ERASE_TASK).await;
    h.store
        .endpoint_delete(&acct(account), gone.id)
        .await
        .unwrap();
}

async fn census(h: &Harness, account: &str) -> Census {
    let a = acct(account);
    let all = PageRequest::first(1000);
    let events = EventListRequest {
        account: a.clone(),
        event_type: None,
        since: None,
        until: None,
        page: all,
    };
    let exists = |r: StoreResult<Task>| r.is_ok();
    Census {
        endpoints: h.store.endpoint_list(&a).await.unwrap().len(),
        deliveries: h
            .store
            .delivery_list(DeliveryListRequest::all(a.clone(), all))
            .await
            .unwrap()
            .items
            .len(),
        events: h.store.event_list(events).await.unwrap().items.len(),
        attempts: h
            .store
            .attempt_search(AttemptQuery::new(a.clone(), all))
            .await
            .unwrap()
            .items
            .len(),
        alerts: h.store.alert_list(&a, all).await.unwrap().items.len(),
        usage: h
            .store
            .usage_query(
                &a,
                TimeRange {
                    from: Timestamp::from_millis(0),
                    to: h.clock.now().plus(Duration::from_secs(7200)),
                },
            )
            .await
            .unwrap()
            .len(),
        event_types: h.store.event_type_list(&a).await.unwrap().len(),
        tasks: (
            exists(h.store.workflow_get(&a, &tid("job")).await),
            exists(h.store.workflow_get(&a, &tid("erase")).await),
        ),
        key: h
            .store
            .account_key_find(&format!("{:0>64}", account.as_bytes()[0]))
            .await
            .unwrap()
            .is_some(),
        session: h
            .store
            .session_get(&format!("{:f>64}", account.as_bytes()[0]))
            .await
            .unwrap()
            .is_some()
            || h.store
                .session_get(&format!("{:d>64}", account.as_bytes()[0]))
                .await
                .unwrap()
                .is_some(),
        link: !h.store.portal_link_list(&a).await.unwrap().is_empty(),
    }
}

/// `ErasureStore::account_erase_begin` and `account_erase_batch`: the
/// start revokes the account's key, ends its session and stops its
/// endpoints being claimed; small batches then remove every row of the
/// account but its erasure task, and another account keeps every row.
pub async fn erasing_an_account_removes_its_rows_and_no_others(f: &dyn StoreFactory) {
    let h = open(f).await;
    fill(&h, "a").await;
    fill(&h, "b").await;
    let before_a = census(&h, "a").await;
    assert!(
        before_a.deliveries >= 4 && before_a.attempts >= 2,
        "{before_a:?}"
    );
    assert!(
        before_a.key && before_a.session && before_a.link,
        "{before_a:?}"
    );
    assert!(
        before_a.usage > 0 && before_a.alerts > 0 && before_a.event_types > 0,
        "{before_a:?}"
    );
    // An erasure task planted to run later (as an account key could once
    // through the task API) is not the erasure's own: it goes.
    let mut planted = task("planted", "a", ERASE_TASK);
    planted.run_at = Some(h.clock.now().plus(Duration::from_secs(25)));
    h.store
        .workflow_enqueue(planted.checked().unwrap())
        .await
        .unwrap();
    // Idempotency records of the account (its key's and the admin's on its
    // routes) go with it; another account's stay.
    let stored = StoredResponse {
        status: 201,
        body: "{}".into(),
    };
    for scope in ["account:a:admin", "account:b:admin"] {
        let IdempotencyBegin::Started(t) = h
            .store
            .idempotency_begin(
                &IdempotencyBeginRequest::new(scope, "k", "h", Duration::from_secs(3600)).unwrap(),
            )
            .await
            .unwrap()
        else {
            panic!("a new key starts");
        };
        h.store
            .idempotency_complete(&t, stored.clone())
            .await
            .unwrap();
    }
    let before_b = census(&h, "b").await;
    let begun = h.store.account_erase_begin(&acct("a")).await.unwrap();
    // The erasure's own task runs (is leased) while its batches run.
    let running = h
        .store
        .workflow_claim(
            TaskClaimRequest::new(
                "w",
                vec![ERASE_TASK.to_string()],
                10,
                Duration::from_secs(60),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(running.iter().any(|c| c.task.id == tid("erase")));
    assert_eq!(
        (
            begun.keys_revoked,
            begun.sessions_ended,
            begun.endpoints_disabled
        ),
        (1, 2, 1),
        "the key's session and the portal link's"
    );
    let a = census(&h, "a").await;
    assert!(!a.key && !a.session && !a.link, "shut at once: {a:?}");
    let claimed = claim(&h, 100).await;
    assert!(!claimed.is_empty());
    assert!(
        claimed.iter().all(|c| c.delivery.account == acct("b")),
        "nothing more is sent to the erased account's endpoints"
    );
    let batch = PurgeBatch::new(2).unwrap();
    let mut rounds = 0;
    while h
        .store
        .account_erase_batch(&acct("a"), batch)
        .await
        .unwrap()
        > 0
    {
        rounds += 1;
        assert!(rounds < 100, "an erasure ends");
    }
    assert!(rounds > 1, "batches are bounded: {rounds}");
    assert!(
        h.store
            .workflow_get(&acct("a"), &tid("planted"))
            .await
            .is_err(),
        "only the erasure's own task is kept"
    );
    let again = |scope: &'static str| {
        let store = h.store.clone();
        async move {
            store
                .idempotency_begin(
                    &IdempotencyBeginRequest::new(scope, "k", "h", Duration::from_secs(3600))
                        .unwrap(),
                )
                .await
                .unwrap()
        }
    };
    assert!(
        matches!(again("account:a:admin").await, IdempotencyBegin::Started(_)),
        "the erased account's records are gone"
    );
    assert_eq!(
        again("account:b:admin").await,
        IdempotencyBegin::Replay(stored)
    );
    assert_eq!(
        census(&h, "a").await,
        Census {
            endpoints: 0,
            deliveries: 0,
            events: 0,
            attempts: 0,
            alerts: 0,
            usage: 0,
            event_types: 0,
            tasks: (false, true),
            key: false,
            session: false,
            link: false,
        }
    );
    assert_eq!(
        census(&h, "b").await,
        before_b,
        "another account is untouched"
    );
    // The account may be used again, from nothing.
    endpoint(&h, "a", false).await;
    assert_eq!(publish(&h, "a").await.deliveries.len(), 1);
}
