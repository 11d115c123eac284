//! Upgrading a database written in the wide-row shape (schema version 9) to
//! the write-once shape (version 10, ADR 0020) loses nothing: every delivery
//! keeps its state, attempts, budget, due time, last error, order and attempt
//! log; a lease taken before the upgrade still fences; the pending ones are
//! claimed and delivered after it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{fresh_schema, open_in, SchemaGuard};
use control_plane_core::*;
use uuid::Uuid;

/// The migrations of schema version 9, as the previous release applied them.
const VERSION_9: &[(i64, &str)] = &[
    (1, include_str!("../src/migrations/0001_initial.sql")),
    (
        2,
        include_str!("../src/migrations/0002_workflow_and_operations.sql"),
    ),
    (3, include_str!("../src/migrations/0003_account_keys.sql")),
    (4, include_str!("../src/migrations/0004_flow_control.sql")),
    (
        5,
        include_str!("../src/migrations/0005_tasks_scoped_by_account.sql"),
    ),
    (
        6,
        include_str!("../src/migrations/0006_retention_indexes.sql"),
    ),
    (
        7,
        include_str!("../src/migrations/0007_events_by_account.sql"),
    ),
    (
        8,
        include_str!("../src/migrations/0008_one_index_of_leases.sql"),
    ),
    (
        9,
        include_str!("../src/migrations/0009_one_index_by_event.sql"),
    ),
];

const T0: i64 = 1_800_000_000_000;

/// One delivery as the version-9 code left it.
struct Old {
    id: Uuid,
    state: &'static str,
    attempts: i64,
    max_attempts: i64,
    due_at: i64,
    lease_token: Option<Uuid>,
    lease_expires_at: Option<i64>,
    last_outcome: Option<&'static str>,
    last_error: Option<&'static str>,
    updated_at: i64,
    /// (result, status) of each logged attempt, in order.
    log: Vec<(&'static str, Option<i64>)>,
}

fn old(state: &'static str, attempts: i64, log: Vec<(&'static str, Option<i64>)>) -> Old {
    Old {
        id: Uuid::new_v4(),
        state,
        attempts,
        max_attempts: 3,
        due_at: T0 - 60_000,
        lease_token: None,
        lease_expires_at: None,
        last_outcome: None,
        last_error: None,
        updated_at: T0 - 30_000,
        log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_9_database_upgrades_without_losing_a_delivery() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let c = workspace_tests::pg_client().await;
    c.batch_execute(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema}; \
         CREATE TABLE schema_migrations (version bigint PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .unwrap();
    for (version, sql) in VERSION_9 {
        c.batch_execute(sql).await.unwrap();
        c.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await
        .unwrap();
    }
    let account = AccountId::new("upgrade").unwrap();
    let endpoint = Uuid::new_v4();
    c.execute(
        "INSERT INTO endpoints (id, account, url, secret, event_types, enabled, ordered, created_at, updated_at) \
         VALUES ($1, $2, 'https://example.com/hook', 'whsec_dGVzdA==', '[]', true, false, $3, $3)",
        &[&endpoint, &account.as_str(), &(T0 - 100_000)],
    )
    .await
    .unwrap();
    c.batch_execute(&format!(
        "INSERT INTO circuits (endpoint_id, mode, failures, reopen_count) VALUES ('{endpoint}', 'closed', 0, 0); \
         INSERT INTO endpoint_flow (endpoint_id) VALUES ('{endpoint}')"
    ))
    .await
    .unwrap();

    let retry_token = Uuid::new_v4();
    let lease_token = Uuid::new_v4();
    let delivered_token = Uuid::new_v4();
    let deliveries = vec![
        old("pending", 0, vec![]),
        Old {
            due_at: T0 - 1_000,
            lease_token: Some(retry_token),
            last_outcome: Some("retry"),
            last_error: Some("HTTP 500"),
            ..old(
                "pending",
                2,
                vec![("failed", Some(500)), ("failed", Some(500))],
            )
        },
        Old {
            lease_token: Some(lease_token),
            lease_expires_at: Some(T0 + 600_000),
            ..old("leased", 1, vec![])
        },
        Old {
            last_error: Some("HTTP 410"),
            last_outcome: Some("gone"),
            ..old(
                "dead",
                3,
                vec![
                    ("failed", Some(503)),
                    ("lease_expired", None),
                    ("failed", Some(410)),
                ],
            )
        },
        Old {
            lease_token: Some(delivered_token),
            last_outcome: Some("delivered"),
            ..old("delivered", 1, vec![("delivered", Some(200))])
        },
    ];
    for (n, d) in deliveries.iter().enumerate() {
        let event = Uuid::new_v4();
        let created = T0 - 90_000 + n as i64;
        c.execute(
            "INSERT INTO events (id, account, event_type, body, created_at) VALUES ($1, $2, 'a.b', '{}', $3)",
            &[&event, &account.as_str(), &created],
        )
        .await
        .unwrap();
        c.execute(
            "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, max_attempts, due_at, \
             lease_token, lease_expires_at, leased_by, last_outcome, last_error, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, nextval('delivery_seq'), $5, $6, $7, $8, $9, $10, NULL, $11, $12, $13, $14)",
            &[
                &d.id,
                &account.as_str(),
                &endpoint,
                &event,
                &d.state,
                &d.attempts,
                &d.max_attempts,
                &d.due_at,
                &d.lease_token,
                &d.lease_expires_at,
                &d.last_outcome,
                &d.last_error,
                &created,
                &d.updated_at,
            ],
        )
        .await
        .unwrap();
        for (i, (result, status)) in d.log.iter().enumerate() {
            c.execute(
                "INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, \
                 latency_ms, will_retry, next_attempt_at, recorded_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, NULL, 7, false, NULL, $7)",
                &[
                    &d.id,
                    &endpoint,
                    &account.as_str(),
                    &(i as i64 + 1),
                    result,
                    status,
                    &(T0 - 50_000 + i as i64),
                ],
            )
            .await
            .unwrap();
        }
    }

    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let store = open_in(&schema, StoreOptions::default(), clock.clone(), 4).await;
    assert!(
        store.applied_migrations().await.unwrap().contains(&10),
        "the upgrade did not run"
    );

    // Every delivery as it was, in its order, with its attempt log.
    for d in &deliveries {
        let got = store
            .delivery_get(&account, DeliveryId(d.id))
            .await
            .unwrap();
        assert_eq!(
            (
                got.state.as_str(),
                i64::from(got.attempts),
                i64::from(got.max_attempts),
                got.due_at.as_millis(),
                got.lease_expires_at.map(Timestamp::as_millis),
                got.last_error.as_deref(),
                got.updated_at.as_millis(),
            ),
            (
                d.state,
                d.attempts,
                d.max_attempts,
                d.due_at,
                d.lease_expires_at,
                d.last_error,
                d.updated_at,
            ),
            "delivery {} ({}) changed in the upgrade",
            d.id,
            d.state
        );
        let log: Vec<(String, Option<i64>)> = store
            .attempt_list_for_delivery(&account, DeliveryId(d.id))
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.result.as_str().to_string(), a.status_code.map(i64::from)))
            .collect();
        let want: Vec<(String, Option<i64>)> =
            d.log.iter().map(|(r, s)| (r.to_string(), *s)).collect();
        assert_eq!(log, want, "the attempt log of {} changed", d.state);
    }
    let listed: Vec<Uuid> = store
        .delivery_list(DeliveryListRequest::all(
            account.clone(),
            PageRequest::first(100),
        ))
        .await
        .unwrap()
        .items
        .iter()
        .map(|d| d.id.0)
        .collect();
    let newest_first: Vec<Uuid> = deliveries.iter().rev().map(|d| d.id).collect();
    assert_eq!(listed, newest_first, "the order changed in the upgrade");

    // The lease taken before the upgrade still fences: its holder records the
    // outcome, and a repeat of the delivered one's outcome is a duplicate.
    let lease = |d: &Old, token: Uuid| Lease {
        delivery_id: DeliveryId(d.id),
        token: LeaseToken(token),
        attempt: u32::try_from(d.attempts).unwrap(),
        expires_at: Timestamp::from_millis(T0 + 600_000),
    };
    let ok = || {
        DeliveryOutcome::Delivered(AttemptReport {
            status_code: Some(200),
            error: None,
            latency_ms: 3,
            response_body: None,
        })
    };
    let recorded = store
        .delivery_record_outcome(&lease(&deliveries[2], lease_token), ok())
        .await
        .unwrap();
    assert_eq!(
        (recorded.state, recorded.duplicate),
        (DeliveryState::Delivered, false)
    );
    let repeat = store
        .delivery_record_outcome(&lease(&deliveries[4], delivered_token), ok())
        .await
        .unwrap();
    assert_eq!(
        (repeat.state, repeat.duplicate),
        (DeliveryState::Delivered, true)
    );
    let stale = store
        .delivery_record_outcome(&lease(&deliveries[1], Uuid::new_v4()), ok())
        .await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost)),
        "a made-up token recorded an outcome: {stale:?}"
    );

    // The pending ones are claimed and delivered; the dead one replays.
    store
        .delivery_replay(&account, DeliveryId(deliveries[3].id))
        .await
        .unwrap();
    let claimed = store
        .delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = claimed.iter().map(|c| c.delivery.id.0).collect();
    ids.sort();
    let mut want = vec![deliveries[0].id, deliveries[1].id, deliveries[3].id];
    want.sort();
    assert_eq!(ids, want, "the upgraded queue did not hand out its work");
    let retried = claimed
        .iter()
        .find(|c| c.delivery.id.0 == deliveries[1].id)
        .unwrap();
    assert_eq!(retried.lease.attempt, 3, "the attempt count restarted");
    for c in &claimed {
        store.delivery_record_outcome(&c.lease, ok()).await.unwrap();
    }
    let counts = store.delivery_count_by_state().await.unwrap();
    assert_eq!(counts, vec![(DeliveryState::Delivered, 5)], "{counts:?}");
}
