//! What one process cannot show: several stores with separate pools (replicas)
//! against one database, plus migrations, the outbox, wake-ups and recovery.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{database_url, fresh_schema, open_in, SchemaGuard};
use control_plane_core::*;
use store_postgres::{PostgresConfig, PostgresStore};

fn acct() -> AccountId {
    AccountId::new("replicas").unwrap()
}

/// `n` replicas of a fresh schema, with `options`, on one manual clock.
async fn replicas(n: usize, options: StoreOptions) -> Replicas {
    let schema = fresh_schema();
    let guard = SchemaGuard(schema.clone());
    let clock = Arc::new(ManualClock::default());
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(open_in(&schema, options, clock.clone(), 4).await);
    }
    Replicas {
        guard,
        clock,
        stores,
    }
}

/// Replicas of one fresh schema on one manual clock; the schema is dropped
/// with them.
struct Replicas {
    guard: SchemaGuard,
    clock: Arc<ManualClock>,
    stores: Vec<PostgresStore>,
}

/// Runs `workers` claimers on every replica, each calling `claim(store,
/// name)` until it gets nothing; returns how often each id was claimed.
async fn claim_on_every_replica<K, F, Fut>(
    stores: &[PostgresStore],
    workers: usize,
    claim: F,
) -> HashMap<K, u32>
where
    K: std::hash::Hash + Eq + Send + 'static,
    F: Fn(PostgresStore, String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Vec<K>> + Send,
{
    let mut tasks = Vec::new();
    for (r, store) in stores.iter().enumerate() {
        for w in 0..workers {
            let (store, claim) = (store.clone(), claim.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = claim(store.clone(), format!("r{r}w{w}")).await;
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got);
                }
            }));
        }
    }
    let mut seen = HashMap::new();
    for t in tasks {
        for id in t.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    seen
}

/// The request of the replicas' endpoint, every event type.
fn endpoint_request() -> EndpointCreateRequest {
    EndpointCreateRequest::new(
        acct(),
        "https://example.com/r",
        Secret::new("whsec_cnJycnJycnJycnJycnJycnJycnJycnJy"),
    )
}

async fn add_endpoint(store: &PostgresStore) -> Endpoint {
    store
        .endpoint_create(endpoint_request().checked().unwrap())
        .await
        .unwrap()
}

fn req(n: usize) -> PublishRequest {
    PublishRequest::new(acct(), "t", serde_json::json!({ "n": n }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_claim_20000_deliveries_without_double_claims_or_losses() {
    let Replicas { stores, .. } = &replicas(4, StoreOptions::default()).await;
    for _ in 0..10 {
        add_endpoint(&stores[0]).await;
    }
    for batch in 0..20 {
        let reqs = (0..100).map(|i| req(batch * 100 + i)).collect();
        stores[batch % 4]
            .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
            .await
            .unwrap();
    }
    let started = Instant::now();
    let seen = claim_on_every_replica(stores, 4, |store, name| async move {
        let claim = ClaimRequest::new(name, 50, Duration::from_secs(300)).unwrap();
        let mut ids = Vec::new();
        for c in store.delivery_claim(claim).await.unwrap() {
            let r = store
                .delivery_record_outcome(
                    &c.lease,
                    DeliveryOutcome::Delivered(AttemptReport::default()),
                )
                .await;
            assert_eq!(r.unwrap().state, DeliveryState::Delivered);
            ids.push(c.delivery.id);
        }
        ids
    })
    .await;
    let counts = stores[0].delivery_count_by_state().await.unwrap();
    let doubles = seen.values().filter(|n| **n > 1).count();
    println!(
        "replicas: 4 stores x 4 workers, {} deliveries claimed in {:?}, double claims: {doubles}",
        seen.len(),
        started.elapsed()
    );
    assert_eq!(doubles, 0, "a delivery was held by two live leases");
    assert_eq!(seen.len(), 20_000, "every delivery was claimed");
    assert_eq!(
        counts,
        vec![(DeliveryState::Delivered, 20_000)],
        "none lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_enqueues_have_exactly_one_winner() {
    let Replicas { stores, .. } = &replicas(4, StoreOptions::default()).await;
    let mut filtered = EndpointCreateRequest::new(
        acct(),
        "https://example.com/r",
        Secret::new("whsec_cnJycnJycnJycnJycnJycnJycnJycnJy"),
    );
    filtered.event_types = vec!["never".into()];
    let e = stores[0]
        .endpoint_create(filtered.checked().unwrap())
        .await
        .unwrap();
    for round in 0..10 {
        let event = stores[0]
            .event_publish(req(round).checked().unwrap())
            .await
            .unwrap()
            .event
            .id;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let s = stores[i % 4].clone();
            tasks.push(tokio::spawn(async move {
                s.delivery_enqueue(EndpointKey::new(&acct(), e.id), event)
                    .await
                    .unwrap()
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(results.iter().filter(|r| r.won).count(), 1, "round {round}");
        assert!(results
            .iter()
            .all(|r| r.delivery_id == results[0].delivery_id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_cooldown_exactly_one_replica_gets_the_probe() {
    let options = StoreOptions {
        breaker: BreakerPolicy {
            failure_threshold: 1,
            ..BreakerPolicy::default()
        },
        ..StoreOptions::default()
    };
    let Replicas { clock, stores, .. } = &replicas(4, options).await;
    add_endpoint(&stores[0]).await;
    let retry_now = || DeliveryOutcome::Retry {
        at: clock.now(),
        report: AttemptReport::default(),
    };
    for round in 0..5 {
        stores[0]
            .event_publish_batch(
                control_plane_core::Checked::all((0..10).map(req).collect()).unwrap(),
            )
            .await
            .unwrap();
        if round == 0 {
            let c = stores[1]
                .delivery_claim(ClaimRequest::new("w", 1, Duration::from_secs(60)).unwrap())
                .await
                .unwrap();
            stores[1]
                .delivery_record_outcome(&c[0].lease, retry_now())
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(600));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = stores[i % 4].clone();
            tasks.push(tokio::spawn(async move {
                s.delivery_claim(
                    ClaimRequest::new(format!("w{i}"), 10, Duration::from_secs(60)).unwrap(),
                )
                .await
                .unwrap()
            }));
        }
        let mut got = Vec::new();
        for t in tasks {
            got.extend(t.await.unwrap());
        }
        assert_eq!(
            got.len(),
            1,
            "round {round}: exactly one probe across replicas"
        );
        assert!(got[0].probe);
        stores[2]
            .delivery_record_outcome(&got[0].lease, retry_now())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_migrating_at_once_end_with_one_schema() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = PostgresConfig::new(database_url());
            c.schema = Some(schema);
            c.pool_size = 1;
            PostgresStore::open(c, Arc::new(SystemClock)).await
        }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(
            t.await
                .unwrap()
                .expect("every concurrent migration succeeds"),
        );
    }
    // Every migration file, once: the versions run 1, 2, ... up to their count.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/migrations"))
        .unwrap()
        .count() as i64;
    assert_eq!(
        stores[3].applied_migrations().await.unwrap(),
        (1..=files).collect::<Vec<i64>>()
    );
    add_endpoint(&stores[2]).await;
    assert_eq!(stores[0].endpoint_list(&acct()).await.unwrap().len(), 1);
}

async fn raw_client(schema: &str) -> tokio_postgres::Client {
    let client = workspace_tests::pg_client().await;
    client
        .batch_execute(&format!("SET search_path = {schema}"))
        .await
        .unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_publish_commits_and_rolls_back_with_the_callers_transaction() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let store = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 2).await;
    add_endpoint(&store).await;
    let mut client = raw_client(&schema).await;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await
        .unwrap();

    // The same publish twice: the first transaction commits, the second
    // rolls back.
    let mut published = Vec::new();
    for (order, commit) in [(1, true), (2, false)] {
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "INSERT INTO orders VALUES ($1)",
            &[&i32::try_from(order).unwrap()],
        )
        .await
        .unwrap();
        let p = store
            .publish_in(
                &tx,
                control_plane_core::Checked::all(vec![req(order)]).unwrap(),
            )
            .await
            .unwrap()
            .remove(0);
        if commit {
            tx.commit().await.unwrap();
            store.notify_committed().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        published.push(p);
    }
    let (kept, dropped) = (&published[0], &published[1]);

    assert_eq!(
        store.event_get(&acct(), kept.event.id).await.unwrap(),
        kept.event
    );
    assert!(matches!(
        store.event_get(&acct(), dropped.event.id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.delivery_get(&acct(), dropped.deliveries[0]).await,
        Err(StoreError::NotFound { .. })
    ));
    let claimed = store
        .delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        kept.deliveries
    );
    let orders: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_on_one_replica_wakes_a_worker_on_another() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let a = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 2).await;
    let b = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 2).await;
    add_endpoint(&b).await;
    let mut rx = a.delivery_wakeups();
    rx.seen();
    // The listener connects in the background: publish until the first
    // notification arrives, then measure.
    let mut up = false;
    for n in 0..10 {
        b.event_publish(req(100 + n).checked().unwrap())
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_secs(1), rx.changed())
            .await
            .is_ok()
        {
            up = true;
            break;
        }
    }
    assert!(up, "no notification reached the other replica");
    tokio::time::sleep(Duration::from_millis(100)).await;
    rx.seen();
    let mut latencies = Vec::new();
    for n in 0..5 {
        let started = Instant::now();
        b.event_publish(req(n).checked().unwrap()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("woken through NOTIFY");
        latencies.push(started.elapsed());
        rx.seen();
    }
    latencies.sort();
    println!(
        "wake-up across replicas: median {:?} (publish commit included)",
        latencies[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_recovers_after_its_connections_are_killed() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let app = format!("cp_{}", &schema[8..20]);
    let url = format!(
        "{}{}application_name={app}",
        database_url().expose(),
        if database_url().expose().contains('?') {
            "&"
        } else {
            "?"
        }
    );
    let mut config = PostgresConfig::new(control_plane_store_kit::DatabaseUrl::new(url));
    config.schema = Some(schema.clone());
    config.pool_size = 2;
    let store = PostgresStore::open(config, Arc::new(SystemClock))
        .await
        .unwrap();
    add_endpoint(&store).await;
    let admin = raw_client(&schema).await;
    let killed: i64 = admin
        .query_one("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", &[&app])
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 1, "the pool's connections were found");
    let mut errors = Vec::new();
    let mut ok = false;
    for _ in 0..10 {
        match store.endpoint_list(&acct()).await {
            Ok(list) => {
                assert_eq!(list.len(), 1);
                ok = true;
                break;
            }
            Err(e) => {
                assert!(e.is_retryable(), "a lost connection is retryable: {e:?}");
                errors.push(e);
            }
        }
    }
    assert!(ok, "the pool never recovered: {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_claim_4000_tasks_without_double_claims_or_losses() {
    let Replicas { stores, .. } = &replicas(4, StoreOptions::default()).await;
    for i in 0..4000 {
        let req = TaskEnqueueRequest {
            id: TaskId::new(format!("task-{i}")).unwrap(),
            account: acct(),
            kind: if i % 2 == 0 { "a".into() } else { "b".into() },
            payload: serde_json::json!(i),
            run_at: None,
        };
        stores[i % 4]
            .workflow_enqueue(req.checked().unwrap())
            .await
            .unwrap();
    }
    let seen = claim_on_every_replica(stores, 4, |store, name| async move {
        let claim = TaskClaimRequest::new(
            name,
            vec!["a".into(), "b".into()],
            25,
            Duration::from_secs(300),
        )
        .unwrap();
        let mut ids = Vec::new();
        for c in store.workflow_claim(claim).await.unwrap() {
            store
                .workflow_complete(&c.lease, serde_json::json!("done"))
                .await
                .unwrap();
            ids.push(c.task.id);
        }
        ids
    })
    .await;
    let doubles = seen.values().filter(|n| **n > 1).count();
    println!(
        "workflow replicas: {} tasks claimed by 4 stores x 4 workers, double claims: {doubles}",
        seen.len()
    );
    assert_eq!(doubles, 0);
    assert_eq!(seen.len(), 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_has_one_holder_across_replicas() {
    let Replicas { stores, .. } = &replicas(4, StoreOptions::default()).await;
    for round in 0..10 {
        let mut tasks = Vec::new();
        for i in 0..16 {
            let s = stores[i % 4].clone();
            tasks.push(tokio::spawn(async move {
                s.tick_claim(
                    &TickClaimRequest::new("maintenance", Duration::from_secs(60), Duration::ZERO)
                        .unwrap(),
                )
                .await
                .unwrap()
            }));
        }
        let mut holders = Vec::new();
        for t in tasks {
            holders.extend(t.await.unwrap());
        }
        assert_eq!(holders.len(), 1, "round {round}");
        let state = holders[0].state.clone();
        assert_eq!(
            state,
            (round > 0).then(|| serde_json::json!({ "round": round - 1 }))
        );
        stores[round % 4]
            .tick_complete(&holders[0], serde_json::json!({ "round": round }))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_classified_by_sqlstate() {
    let client = raw_client("public").await;
    let cases = [
        ("40001", "busy"),
        ("40P01", "busy"),
        ("55P03", "busy"),
        ("23505", "conflict"),
        ("57P01", "unavailable"),
        ("08006", "unavailable"),
        ("22P02", "backend"),
    ];
    for (code, want) in cases {
        let sql = format!("DO $$ BEGIN RAISE EXCEPTION 'probe' USING ERRCODE = '{code}'; END $$");
        let e = store_postgres::classify(client.batch_execute(&sql).await.unwrap_err());
        let got = match e {
            StoreError::Busy(_) => "busy",
            StoreError::Conflict(_) => "conflict",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Backend(_) => "backend",
            _ => "other",
        };
        assert_eq!(got, want, "SQLSTATE {code}: {e:?}");
        assert_eq!(e.is_retryable(), want == "busy" || want == "unavailable");
    }
}

/// Three replicas (separate pools) claim from one endpoint limited to 20
/// requests per second for 10 s of store time: in no one-second window do
/// they lease more than the rate plus the burst (one second's worth), and
/// over the run they lease about the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_together_keep_an_endpoints_rate_limit() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let options = StoreOptions {
        endpoint_concurrency: 1000,
        ..StoreOptions::default()
    };
    let Replicas { clock, stores, .. } = &replicas(3, options).await;
    let mut create = endpoint_request();
    create.rate_limit_per_s = Some(20);
    stores[0]
        .endpoint_create(create.checked().unwrap())
        .await
        .unwrap();
    stores[0]
        .event_publish_batch(control_plane_core::Checked::all((0..600).map(req).collect()).unwrap())
        .await
        .unwrap();
    let lease = Duration::from_secs(3600);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for store in stores {
        let (store, stop) = (store.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut at = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let claimed = store
                    .delivery_claim(ClaimRequest::new("r", 10, lease).unwrap())
                    .await
                    .unwrap();
                for c in &claimed {
                    // The claim's own reading of the clock.
                    at.push(c.lease.expires_at.as_millis() - lease.as_millis() as i64);
                    store
                        .delivery_record_outcome(
                            &c.lease,
                            DeliveryOutcome::Delivered(AttemptReport {
                                status_code: Some(200),
                                error: None,
                                latency_ms: 1,
                                response_body: None,
                            }),
                        )
                        .await
                        .unwrap();
                }
                tokio::task::yield_now().await;
            }
            at
        }));
    }
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        clock.advance(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let mut at = Vec::new();
    for t in tasks {
        at.extend(t.await.unwrap());
    }
    workspace_tests::assert_rate_kept("3 replicas, leased", &at, 20, 10, 100);
}

/// The claim's generic plan is made once per connection, with the statistics
/// of that moment: on a new, empty store it must still read the deliveries
/// by index, or every claim would scan the whole table as it grows (ADR 0016).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_plan_made_on_an_empty_store_reads_by_index() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let _store = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 1).await;
    let (mut client, conn) =
        tokio_postgres::connect(database_url().expose(), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "SET LOCAL search_path TO {schema}; {}",
        store_postgres::CLAIM_SETTINGS
    ))
    .await
    .unwrap();
    tx.batch_execute(&format!(
        "PREPARE claim_plan (bigint, uuid[], bigint, text, bigint[], bigint[], bigint[]) AS {}",
        store_postgres::claim_statement()
    ))
    .await
    .unwrap();
    let plan = plan_text(
        &tx,
        "EXPLAIN EXECUTE claim_plan (0, ARRAY[gen_random_uuid()], 0, 'w', ARRAY[1::bigint], \
         ARRAY[NULL::bigint], ARRAY[1::bigint])",
        &[],
    )
    .await;
    assert!(plan.contains("$1"), "not the generic plan:\n{plan}");
    assert!(
        !plan.contains("Seq Scan"),
        "the claim scans a whole table:\n{plan}"
    );
    assert!(
        !plan.contains("Hash Join") && !plan.contains("Merge Join"),
        "the claim joins whole tables:\n{plan}"
    );
    assert!(
        plan.contains("Index Cond: ((endpoint_id = c.endpoint_id) AND (seq = c.seq))"),
        "the claim does not find each live row by its whole key:\n{plan}"
    );
}

/// Sixteen claimers on four replicas, held back by a lock on the
/// endpoint's flow row and then let go at once, all of them having seen an
/// endpoint far below its cap (450, above four claims of 100): the leases
/// reach the cap and never pass it, and no delivery is handed out twice
/// (ADR 0039 tried letting such claimers lease one endpoint side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimers_let_go_at_once_never_pass_a_large_cap() {
    let options = StoreOptions {
        endpoint_concurrency: 10_000,
        ..StoreOptions::default()
    };
    let r = replicas(4, options).await;
    let mut create = endpoint_request();
    create.max_in_flight = Some(450);
    r.stores[0]
        .endpoint_create(create.checked().unwrap())
        .await
        .unwrap();
    for chunk in 0..10 {
        let reqs = (chunk * 100..(chunk + 1) * 100).map(req).collect();
        r.stores[0]
            .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
            .await
            .unwrap();
    }
    let schema = r.guard.0.clone();
    let holder = raw_client(&schema).await;
    holder
        .batch_execute("BEGIN; SELECT 1 FROM endpoint_flow FOR UPDATE")
        .await
        .unwrap();
    let stores = r.stores.clone();
    let claims = tokio::spawn(async move {
        claim_on_every_replica(&stores, 4, |s, name| async move {
            s.delivery_claim(ClaimRequest::new(name, 100, Duration::from_secs(3600)).unwrap())
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.delivery.id)
                .collect()
        })
        .await
    });
    // Every claimer has read the flows and waits for the row.
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.batch_execute("COMMIT").await.unwrap();
    let seen = claims.await.unwrap();
    assert!(seen.values().all(|n| *n == 1), "no delivery twice");
    assert_eq!(seen.len(), 450, "the cap of 450, reached and never passed");
}

/// A small account's attempt search reads its own rows, not every
/// tenant's history (issue 72, item 9): with 200,000 attempts of another
/// account, the plan of `AttemptQuery::sql` walks the account's index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_search_reads_only_its_accounts_rows() {
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let _store = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 1).await;
    let client = raw_client(&schema).await;
    client
        .batch_execute(
            "INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, latency_ms, \
               will_retry, recorded_at) \
             SELECT gen_random_uuid(), gen_random_uuid(), CASE WHEN i % 20000 = 0 THEN 'small' \
               ELSE 'big' END, 1, 'delivered', 1, false, i FROM generate_series(1, 200000) i; \
             ANALYZE attempts",
        )
        .await
        .unwrap();
    let query = control_plane_core::AttemptQuery::new(
        control_plane_core::AccountId::new("small").unwrap(),
        control_plane_core::PageRequest::first(50),
    );
    let plan = plan_text(
        &client,
        &format!("EXPLAIN (ANALYZE, BUFFERS) {}", query.sql("id")),
        &[&"small", &51_i64],
    )
    .await;
    assert!(plan.contains("attempts_by_account"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// The text of an `EXPLAIN` statement's plan, one line a row.
async fn plan_text(
    client: &impl tokio_postgres::GenericClient,
    explain: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    let rows = client.query(explain, params).await.unwrap();
    rows.iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}
