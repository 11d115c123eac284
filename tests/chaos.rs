//! Faults, end to end: worker processes SIGKILLed and restarted while they
//! deliver, the database cut off mid-run, and PostgreSQL itself crashed
//! mid-run (`pg_ctl stop -m immediate`, on a throwaway cluster the test
//! starts with the installed server binaries: `support::Cluster`; missing
//! binaries fail it) while workers are killed around the crash. Sizes come
//! from the environment so `cargo xtask chaos` runs the long version and CI
//! a short one: `CHAOS_EVENTS` (default 2,000 on postgres, a tenth on
//! embedded), `CHAOS_KILLS` (default 5; 2 in the crash test, half of them
//! before the crash and half after), `CHAOS_SEED`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use control_plane_core::*;
use control_plane_store_kit::DatabaseUrl;
use workspace_tests::{
    api_call, database_url, events, pg_client, postgres_env, secret_keys, text_of, wait_until,
    Answer, Cluster, Process, Received, Receiver, Schema,
};

const ADMIN: &str = "cpa_chaos_admin_token_0123456789";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator: kills are reproducible from the seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Answers 200 after 100 to 400 ms (by webhook-id), so that a run lasts
/// longer than the first kills and they land while sends are in flight
/// (`verify` asserts that some did).
fn answer_after_a_while() -> Answer {
    Arc::new(|r: Received, _| {
        let wait = r
            .webhook_id()
            .bytes()
            .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b)))
            % 300
            + 100;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            "ok".into_response()
        })
    })
}

/// The chaos account's endpoint, receiving at `url`.
fn hook(account: &AccountId, url: &str) -> Checked<EndpointCreateRequest> {
    EndpointCreateRequest::new(
        account.clone(),
        url,
        Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    )
    .checked()
    .unwrap()
}

/// A `control-plane` process with the chaos settings (3 s leases, 1 s
/// retries, seven of them).
fn spawn(role: &str, env: &[(&str, String)]) -> Process {
    let mut all = vec![
        ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
        (
            "CONTROLPLANE_RETRY_SCHEDULE",
            "1s,1s,1s,1s,1s,1s,1s".to_string(),
        ),
        ("CONTROLPLANE_LEASE", "3s".to_string()),
    ];
    all.extend(env.iter().cloned());
    Process::start(env!("CARGO_BIN_EXE_control-plane"), role, &all)
}

/// What the attempt log says of each delivery: (attempts, lease_expired).
type Log = HashMap<String, (u32, u32)>;

/// When each POST arrived at the receiver, per delivery (`webhook-id`), in
/// arrival order.
type Receipts = HashMap<String, Vec<Instant>>;

fn receipts(rx: &Receiver) -> Receipts {
    let mut out = Receipts::new();
    for (id, at) in rx.arrivals() {
        out.entry(id).or_default().push(at);
    }
    out
}

/// How long before a crash of PostgreSQL a POST may have arrived whose
/// record the crash then lost. A claim commits without waiting for its WAL
/// (ADR 0016), and so does an outcome by default (ADR 0034): the server's
/// WAL writer writes such commits out within a fraction of a second (any
/// commit that waits writes them too), so the crash loses the claims and
/// outcomes of its last moments only; between a POST's arrival and its outcome's
/// commit lie the receiver's answer (at most 400 ms here) and the worker's
/// batched recording. Five seconds is a wide margin over that on a loaded
/// debug build.
const CRASH_REACH: Duration = Duration::from_secs(5);

/// The receipts a crash of PostgreSQL may have lost the record of: those
/// that arrived from [`CRASH_REACH`] before the crash until the server
/// accepted connections again. While it is down no claim can be made, so
/// every POST arriving then was claimed before the crash; once it is back,
/// what workers write is exposed to no crash.
#[derive(Clone, Copy, Debug)]
struct CrashWindow {
    from: Instant,
    to: Instant,
}

impl CrashWindow {
    fn holds(&self, at: Instant) -> bool {
        self.from <= at && at <= self.to
    }
}

/// Waits (up to 300 s) until the postgres schema `client` reads has no
/// live delivery left.
async fn wait_drained(client: &tokio_postgres::Client) {
    wait_until(
        "deliveries still open",
        Duration::from_secs(300),
        Duration::from_millis(250),
        || async {
            let open: i64 = client
                .query_one("SELECT count(*) FROM delivery_queue", &[])
                .await
                .unwrap()
                .get(0);
            open == 0
        },
    )
    .await;
}

/// Each delivery's state and what the attempt log says of it, read from
/// the postgres schema `client` reads.
async fn end_state(client: &tokio_postgres::Client) -> (HashMap<String, String>, Log) {
    let states: HashMap<String, String> = client
        .query(
            "SELECT d.id::text, coalesce(l.state, x.state, 'missing') FROM deliveries d \
         LEFT JOIN delivery_queue l ON l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
         LEFT JOIN delivery_done x ON x.delivery_id = d.id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let log: Log = client
    .query(
        "SELECT delivery_id::text, count(*), count(*) FILTER (WHERE result = 'lease_expired') FROM attempts GROUP BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get::<_, String>(0), (r.get::<_, i64>(1) as u32, r.get::<_, i64>(2) as u32)))
    .collect();
    (states, log)
}

/// Checks the end state: every delivery final, every delivered one received,
/// every POST in the attempt log, and every duplicate POST explained by a
/// lease that expired (a worker killed between sending and recording). With
/// `require_expiry`, at least one lease expired: a kill hit a send in flight.
///
/// With `crash` (PostgreSQL crashed during the run) two more explanations
/// hold, each for at most one POST of a delivery and only for a delivery
/// with a POST in the window: a POST whose claim the crash lost is sent
/// again with no lease left to expire (a duplicate the lease does not
/// explain, whose caught POST is not the delivery's last), and its attempt
/// is missing from the log (fewer attempts than POSTs).
fn verify(
    total: usize,
    states: &HashMap<String, String>,
    log: &Log,
    receipts: &Receipts,
    kills: usize,
    crash: Option<CrashWindow>,
    require_expiry: bool,
) {
    assert_eq!(states.len(), total, "every event has its delivery");
    let not_final: Vec<_> = states
        .iter()
        .filter(|(_, s)| *s != "delivered" && *s != "dead")
        .collect();
    assert!(
        not_final.is_empty(),
        "not final: {:?}",
        &not_final[..not_final.len().min(5)]
    );
    let lost: Vec<_> = states
        .iter()
        .filter(|(id, s)| *s == "delivered" && !receipts.contains_key(*id))
        .collect();
    let caught = |at: &[Instant]| crash.is_some_and(|w| at.iter().any(|t| w.holds(*t)));
    let (mut duplicates, mut by_lease, mut by_crash) = (0, 0, 0);
    let mut unexplained = Vec::new();
    for (id, at) in receipts {
        let again = at.len() as u32 - 1;
        if again == 0 {
            continue;
        }
        duplicates += again;
        let expired = log.get(id).map_or(0, |l| l.1);
        by_lease += again.min(expired);
        let mut left = again.saturating_sub(expired);
        if left > 0 && caught(&at[..at.len() - 1]) {
            by_crash += 1;
            left -= 1;
        }
        if left > 0 {
            unexplained.push((id.clone(), at.len(), expired));
        }
    }
    // Every claim ends in one attempt (an outcome, or its lease expiring),
    // so a delivery has at least as many attempts as POSTs, and one.
    let (mut unlogged, mut unlogged_by_crash) = (Vec::new(), 0);
    for id in states.keys() {
        let attempts = log.get(id).map_or(0, |l| l.0) as usize;
        let at = receipts.get(id).map_or(&[][..], Vec::as_slice);
        let missing = at.len().max(1).saturating_sub(attempts);
        if missing == 0 {
            continue;
        }
        if missing == 1 && caught(at) {
            unlogged_by_crash += 1;
        } else {
            unlogged.push((id.clone(), at.len(), attempts));
        }
    }
    let dead = states.values().filter(|s| *s == "dead").count();
    eprintln!(
        "chaos: kills {kills}, database crashes {}, deliveries {total}, delivered {}, dead {dead}, lost {}, \
         duplicate POSTs {duplicates} (explained by an expired lease {by_lease}, by the crash {by_crash}, \
         unexplained {}), POSTs missing from the attempt log {} (in the crash window {unlogged_by_crash})",
        u8::from(crash.is_some()),
        total - dead,
        lost.len(),
        unexplained.len(),
        unlogged_by_crash + unlogged.len(),
    );
    assert!(lost.is_empty(), "delivered but never received: {lost:?}");
    let expired: u32 = log.values().map(|(_, expired)| expired).sum();
    assert!(
        expired > 0 || !require_expiry,
        "no kill hit a send in flight (no lease expired): the run proved nothing"
    );
    assert!(
        unlogged.is_empty(),
        "deliveries with fewer attempts logged than POSTs received, outside a crash window \
         (id, POSTs, attempts): {:?}",
        &unlogged[..unlogged.len().min(5)]
    );
    assert!(
        unexplained.is_empty(),
        "duplicates explained by neither an expired lease nor the crash (id, POSTs, expired leases): {:?}",
        &unexplained[..unexplained.len().min(5)]
    );
    // The receiver never fails: a delivery can only die by losing every one
    // of its attempts to a kill, which the few kills of a run cannot do.
    let dead_unexplained: Vec<_> = states
        .iter()
        .filter(|(_, s)| *s == "dead")
        .filter(|(id, _)| log.get(*id).is_none_or(|(n, expired)| n != expired))
        .collect();
    assert!(
        dead_unexplained.is_empty(),
        "dead without every attempt lost to a kill: {:?}",
        &dead_unexplained[..dead_unexplained.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_workers_killed_and_restarted_lose_nothing() {
    let total = env_usize("CHAOS_EVENTS", 2_000);
    let kills = env_usize("CHAOS_KILLS", 5);
    let mut rng = Lcg(env_usize("CHAOS_SEED", 7) as u64);
    let schema = Schema::new("cp_chaos");
    let env = schema.env(8);
    let (rx, base) = Receiver::start(answer_after_a_while()).await;
    let hook_url = format!("{base}/hook");
    let mut cfg = store_postgres::PostgresConfig::new(DatabaseUrl::new(database_url()));
    cfg.schema = Some(schema.0.clone());
    cfg.pool_size = 4;
    cfg.keys = secret_keys();
    let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .unwrap();
    let account = AccountId::new("chaos").unwrap();
    store
        .endpoint_create(hook(&account, &hook_url))
        .await
        .unwrap();
    let mut workers: Vec<Process> = (0..3).map(|_| spawn("worker", &env)).collect();
    // Publish while the workers run, in batches.
    let publisher = {
        let (store, account) = (store.clone(), account.clone());
        tokio::spawn(async move {
            let mut left = total;
            while left > 0 {
                let n = left.min(200);
                store
                    .event_publish_batch(
                        control_plane_core::Checked::all(events(&account, "chaos", n)).unwrap(),
                    )
                    .await
                    .unwrap();
                left -= n;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let i = rng.next(3) as usize;
        workers[i].kill();
        workers[i] = spawn("worker", &env);
    }
    publisher.await.unwrap();
    let client = pg_client().await;
    client
        .batch_execute(&format!("SET search_path TO {}", schema.0))
        .await
        .unwrap();
    wait_drained(&client).await;
    for w in &mut workers {
        w.kill();
    }
    let (states, log) = end_state(&client).await;
    verify(total, &states, &log, &receipts(&rx), kills, None, true);
    drop(store);
}

/// Issue 59's kill test: workers SIGKILLed and restarted while they publish
/// to RabbitMQ (an AMQP destination). Nothing is lost: every delivery ends
/// final, every delivered one is in the queue, and every message the queue
/// got twice is explained by a lease that expired (a worker killed between
/// the broker's confirm and the recording of the outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_while_publishing_to_rabbitmq_lose_nothing() {
    let total = env_usize("CHAOS_EVENTS", 2_000);
    let kills = env_usize("CHAOS_KILLS", 5);
    let mut rng = Lcg(env_usize("CHAOS_SEED", 11) as u64);
    let schema = Schema::new("cp_chaos_amqp");
    let env = schema.env(8);
    let conn = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("RabbitMQ on 127.0.0.1:5672");
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("cp-chaos-{}", uuid::Uuid::new_v4().simple());
    ch.queue_declare(
        queue.as_str().into(),
        lapin::options::QueueDeclareOptions::default(),
        lapin::types::FieldTable::default(),
    )
    .await
    .unwrap();
    let mut cfg = store_postgres::PostgresConfig::new(DatabaseUrl::new(database_url()));
    cfg.schema = Some(schema.0.clone());
    cfg.pool_size = 4;
    cfg.keys = secret_keys();
    let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .unwrap();
    let account = AccountId::new("chaos").unwrap();
    let url = format!("amqp://127.0.0.1:5672/%2f?exchange=&routing_key={queue}");
    store.endpoint_create(hook(&account, &url)).await.unwrap();
    let mut workers: Vec<Process> = (0..3).map(|_| spawn("worker", &env)).collect();
    // Publish slowly enough that sends are in flight at every kill.
    let publisher = {
        let (store, account) = (store.clone(), account.clone());
        tokio::spawn(async move {
            let mut left = total;
            while left > 0 {
                let n = left.min(40);
                store
                    .event_publish_batch(
                        control_plane_core::Checked::all(events(&account, "chaos", n)).unwrap(),
                    )
                    .await
                    .unwrap();
                left -= n;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let i = rng.next(3) as usize;
        workers[i].kill();
        workers[i] = spawn("worker", &env);
    }
    publisher.await.unwrap();
    let client = pg_client().await;
    client
        .batch_execute(&format!("SET search_path TO {}", schema.0))
        .await
        .unwrap();
    wait_drained(&client).await;
    for w in &mut workers {
        w.kill();
    }
    let (states, log) = end_state(&client).await;
    let mut got = Receipts::new();
    while let Some(m) = ch
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let id = m
            .delivery
            .properties
            .message_id()
            .clone()
            .unwrap()
            .to_string();
        got.entry(id).or_default().push(Instant::now());
    }
    let _ = ch
        .queue_delete(
            queue.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await;
    // RabbitMQ confirms in about a millisecond, so a kill does not always
    // catch a send in flight: an expired lease is not required here (the
    // runs on this machine caught 9 and 3).
    verify(total, &states, &log, &got, kills, None, false);
    drop(store);
}

/// PostgreSQL itself crashes mid-run (`pg_ctl stop -m immediate`: no
/// checkpoint, what only its memory held is gone, recovery from the WAL at
/// the next start) while workers are SIGKILLed and restarted around it, on a
/// cluster of the test's own. Every publish that was answered Ok keeps its
/// event and its delivery, every delivery ends final, every delivered one
/// was received, and every duplicate POST is explained by an expired lease
/// or by the crash (see [`CrashWindow`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crashing_mid_run_loses_no_publish() {
    let total = env_usize("CHAOS_EVENTS", 2_000);
    let kills = env_usize("CHAOS_KILLS", 2).max(2);
    let mut rng = Lcg(env_usize("CHAOS_SEED", 7) as u64);
    let cluster = Cluster::start(&[]);
    let schema = "cp_crash";
    let env = postgres_env(&cluster.url(), schema, 8);
    let (rx, base) = Receiver::start(answer_after_a_while()).await;
    let hook_url = format!("{base}/hook");
    let mut cfg = store_postgres::PostgresConfig::new(DatabaseUrl::new(cluster.url()));
    cfg.schema = Some(schema.to_string());
    cfg.pool_size = 4;
    cfg.keys = secret_keys();
    // This store only publishes: it has no wake-ups to listen for.
    cfg.listen = false;
    let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .unwrap();
    let account = AccountId::new("chaos").unwrap();
    store
        .endpoint_create(hook(&account, &hook_url))
        .await
        .unwrap();
    let mut workers: Vec<Process> = (0..3).map(|_| spawn("worker", &env)).collect();
    // Publishes in batches, half of them before the crash, the rest from
    // the moment the server is gone: those meet the outage. An error counts nothing
    // as accepted; the batch is sent again with the same idempotency keys,
    // so a batch whose commit the server made before the client heard of it
    // is not published twice.
    let (crashing, mut crash_started) = tokio::sync::watch::channel(false);
    let publisher = {
        let (store, account) = (store.clone(), account.clone());
        tokio::spawn(async move {
            let requests: Vec<PublishRequest> = events(&account, "chaos", total)
                .into_iter()
                .enumerate()
                .map(|(i, mut r)| {
                    r.idempotency_key = Some(format!("chaos-{i}"));
                    r
                })
                .collect();
            let (mut accepted, mut errors) = (Vec::new(), 0usize);
            let started = Instant::now();
            for (n, batch) in requests.chunks(50).enumerate() {
                if n * 50 >= total / 2 {
                    crash_started.wait_for(|c| *c).await.unwrap();
                }
                loop {
                    let publish = store.event_publish_batch(Checked::all(batch.to_vec()).unwrap());
                    match tokio::time::timeout(Duration::from_secs(15), publish).await {
                        Ok(Ok(published)) => {
                            accepted.extend(published);
                            break;
                        }
                        Ok(Err(_)) | Err(_) => errors += 1,
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(180),
                        "publishing did not recover after the crash"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (accepted, errors)
        })
    };
    let mut kill_one = |workers: &mut Vec<Process>| {
        let i = rng.next(3) as usize;
        workers[i].kill();
        workers[i] = spawn("worker", &env);
    };
    let before = kills / 2;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for k in 0..before {
        if k > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        kill_one(&mut workers);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crashed_at = Instant::now();
    let in_flight = rx
        .arrivals()
        .iter()
        .filter(|(_, at)| crashed_at.duration_since(*at) < Duration::from_secs(1))
        .count();
    tokio::task::block_in_place(|| cluster.crash());
    // Released once the server is gone, not before: a publish commits
    // waiting for its WAL, which writes out every claim and outcome before
    // it, and would leave the crash nothing to lose.
    crashing.send_replace(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| cluster.restart());
    let back_at = Instant::now();
    let window = CrashWindow {
        from: crashed_at - CRASH_REACH,
        to: back_at,
    };
    for _ in before..kills {
        tokio::time::sleep(Duration::from_secs(2)).await;
        kill_one(&mut workers);
    }
    let (accepted, publish_errors) = publisher.await.unwrap();
    let (client, conn) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("SET search_path TO {schema}"))
        .await
        .unwrap();
    wait_drained(&client).await;
    for w in &mut workers {
        assert!(
            w.is_running(),
            "a worker did not survive the crash:\n{}",
            w.log()
        );
        w.kill();
    }
    let (states, log) = end_state(&client).await;
    let stored_events: std::collections::HashSet<String> = client
        .query("SELECT id::text FROM events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let published_lost: Vec<_> = accepted
        .iter()
        .filter(|p| {
            !stored_events.contains(&p.event.id.to_string())
                || p.deliveries
                    .iter()
                    .any(|d| !states.contains_key(&d.to_string()))
        })
        .map(|p| p.event.id)
        .collect();
    eprintln!(
        "chaos: database crash: down for {} ms (crash to accepting connections again), POSTs in the second before it {in_flight}, \
         publishes accepted {}, refused during the outage {publish_errors}, lost {}",
        (back_at - crashed_at).as_millis(),
        accepted.len(),
        published_lost.len()
    );
    assert!(
        published_lost.is_empty(),
        "publishes answered Ok, then lost in the crash: {:?}",
        &published_lost[..published_lost.len().min(5)]
    );
    assert_eq!(
        accepted.len(),
        total,
        "every publish was accepted in the end"
    );
    assert_eq!(
        stored_events.len(),
        total,
        "a publish sent again after an error made a second event"
    );
    assert!(
        in_flight > 0,
        "no POST arrived in the second before the crash: it hit no send in flight"
    );
    assert!(
        publish_errors > 0,
        "no publish met the outage: the publisher's path through it was not run"
    );
    verify(
        total,
        &states,
        &log,
        &receipts(&rx),
        kills,
        Some(window),
        true,
    );
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_process_killed_and_restarted_loses_nothing() {
    let total = env_usize("CHAOS_EVENTS", 2_000) / 10;
    let kills = env_usize("CHAOS_KILLS", 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chaos.duckdb");
    let (rx, base) = Receiver::start(answer_after_a_while()).await;
    let hook_url = format!("{base}/hook");
    let account = AccountId::new("chaos").unwrap();
    let open = || async {
        store_embedded::EmbeddedStore::open(
            store_embedded::EmbeddedConfig::new(&path),
            Arc::new(SystemClock),
        )
        .await
        .unwrap()
    };
    {
        let store = open().await;
        store
            .endpoint_create(hook(&account, &hook_url))
            .await
            .unwrap();
        store
            .event_publish_batch(
                control_plane_core::Checked::all(events(&account, "chaos", total)).unwrap(),
            )
            .await
            .unwrap();
    }
    let env = vec![(
        "CONTROLPLANE_EMBEDDED_PATH",
        path.to_string_lossy().into_owned(),
    )];
    let mut serve = spawn("serve", &env);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_secs(2)).await;
        serve.kill();
        serve = spawn("serve", &env);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let base = {
        // The last process serves the API: wait until nothing is open.
        serve.kill();
        serve = spawn("serve", &env);
        serve.api()
    };
    wait_until(
        "deliveries still open",
        Duration::from_secs(300),
        Duration::from_millis(250),
        || async {
            let mut open = 0;
            for state in ["pending", "leased"] {
                let path = format!("/v1/accounts/chaos/deliveries?state={state}&limit=1");
                let (_, v) = api_call(&http, &base, ADMIN, "GET", &path, None).await;
                open += v["items"].as_array().unwrap().len();
            }
            open == 0
        },
    )
    .await;
    serve.terminate();
    let store = open().await;
    let mut states = HashMap::new();
    let mut log: Log = HashMap::new();
    let mut page = PageRequest::first(1000);
    loop {
        let p = store
            .delivery_list(DeliveryListRequest::all(account.clone(), page))
            .await
            .unwrap();
        for d in &p.items {
            states.insert(d.id.to_string(), d.state.as_str().to_string());
            let attempts = store
                .attempt_list_for_delivery(&account, d.id)
                .await
                .unwrap();
            let expired = attempts
                .iter()
                .filter(|a| a.result == AttemptResult::LeaseExpired)
                .count() as u32;
            log.insert(d.id.to_string(), (attempts.len() as u32, expired));
        }
        match p.next {
            Some(n) => page = PageRequest::new(page.limit(), Some(n)).unwrap(),
            None => break,
        }
    }
    verify(total, &states, &log, &receipts(&rx), kills, None, true);
}

/// A TCP proxy in front of PostgreSQL that the test can cut: every
/// connection through it is dropped and new ones are refused while it is down.
struct Proxy {
    addr: String,
    down: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

async fn proxy(upstream: String) -> Proxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let down = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let generation = Arc::new(tx);
    let d = down.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            if d.load(Ordering::SeqCst) {
                drop(inbound);
                continue;
            }
            let upstream = upstream.clone();
            let mut cut = rx.clone();
            cut.borrow_and_update();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut.changed() => {}
                }
            });
        }
    });
    Proxy {
        addr,
        down,
        generation,
    }
}

impl Proxy {
    fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
    fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

async fn readyz(http: &reqwest::Client, base: &str) -> u16 {
    match http.get(format!("{base}/readyz")).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// The database goes away for a few seconds mid-run (all connections cut,
/// new ones refused) and comes back: the service keeps running, `/readyz`
/// turns 503 and back to 200, and every delivery ends up delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_survives_a_database_outage() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let parsed = reqwest::Url::parse(&database_url()).unwrap();
    let upstream = format!(
        "{}:{}",
        parsed.host_str().unwrap(),
        parsed.port().unwrap_or(5432)
    );
    let px = proxy(upstream).await;
    let mut via_proxy = parsed.clone();
    let (host, port) = px.addr.split_once(':').unwrap();
    via_proxy.set_host(Some(host)).unwrap();
    via_proxy.set_port(Some(port.parse().unwrap())).unwrap();
    let schema = Schema::new("cp_outage");
    let (rx, base) = Receiver::start(answer_after_a_while()).await;
    let hook_url = format!("{base}/hook");
    let mut env = schema.env(4);
    env.retain(|(k, _)| *k != "CONTROLPLANE_DATABASE_URL");
    env.push(("CONTROLPLANE_DATABASE_URL", via_proxy.to_string()));
    let mut child = spawn("serve", &env);
    let base = child.api();
    let http = reqwest::Client::new();
    let api = |method: &str, path: &str, body: serde_json::Value| {
        http.request(method.parse().unwrap(), format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = api(
        "POST",
        "/v1/accounts/acme/endpoints",
        serde_json::json!({"url": hook_url}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let mut published = Vec::new();
    let publish = |n: usize| {
        let api = &api;
        async move {
            let mut ids = Vec::new();
            for i in 0..n {
                let r = api(
                    "POST",
                    "/v1/accounts/acme/events",
                    serde_json::json!({"type": "t", "payload": i}),
                )
                .await
                .unwrap();
                assert_eq!(r.status().as_u16(), 202);
                let v: serde_json::Value =
                    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
                ids.push(v["deliveries"][0].as_str().unwrap().to_string());
            }
            ids
        }
    };
    published.extend(publish(20).await);
    assert_eq!(readyz(&http, &base).await, 200);
    px.cut();
    wait_until(
        "/readyz stayed ready with the database gone",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { readyz(&http, &base).await == 503 },
    )
    .await;
    // The unauthenticated answer says the store is down, not why: the
    // driver's error (hosts, users) goes to the service's log only.
    let body = text_of(http.get(format!("{base}/readyz"))).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        [
            "the store is not reachable; the service's log says why",
            "the store did not answer within 2 s"
        ]
        .contains(&v["error"]["message"].as_str().unwrap_or_default()),
        "{body}"
    );
    let r = api(
        "POST",
        "/v1/accounts/acme/events",
        serde_json::json!({"type": "t", "payload": 0}),
    )
    .await
    .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(
        status,
        503,
        "a publish during the outage is refused, not lost silently: {body}\n{}",
        child.log()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    px.restore();
    wait_until(
        "/readyz did not come back",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { readyz(&http, &base).await == 200 },
    )
    .await;
    published.extend(publish(20).await);
    wait_until(
        "not every delivery arrived after the outage",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let heard = rx.hits_by_id();
            published.iter().all(|id| heard.contains_key(id))
        },
    )
    .await;
    assert!(child.is_running(), "the service kept running");
    let status = child.terminate();
    assert!(status.success(), "{}", child.log());
}

/// Receiver faults: an endpoint that answers slowly with 5xx opens its
/// circuit, healthy endpoints keep being served (their enqueue-to-arrival
/// latency is printed with and without the failing neighbour), and once the
/// endpoint recovers the probe after the 30 s cooldown closes the circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_neighbour_opens_its_circuit_and_healthy_endpoints_keep_flowing() {
    use axum::http::StatusCode;
    let _ = rustls::crypto::ring::default_provider().install_default();
    #[derive(Default)]
    struct Faulty {
        arrivals: Mutex<HashMap<String, Instant>>,
        failing: AtomicBool,
    }
    let state = Arc::new(Faulty::default());
    state.failing.store(true, Ordering::SeqCst);
    let app = axum::Router::new()
        .route(
            "/healthy",
            axum::routing::post(|State(s): State<Arc<Faulty>>, h: HeaderMap| async move {
                let id = h
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                s.arrivals.lock().unwrap().insert(id, Instant::now());
                StatusCode::OK
            }),
        )
        .route(
            "/failing",
            axum::routing::post(|State(s): State<Arc<Faulty>>| async move {
                if s.failing.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hooks = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let schema = Schema::new("cp_faults");
    let mut env = schema.env(8);
    env.push(("CONTROLPLANE_CONCURRENCY", "16".to_string()));
    let mut child = spawn("serve", &env);
    let base = child.api();
    let http = reqwest::Client::new();
    let call = |method: &str, path: String, body: Option<serde_json::Value>| {
        let mut r = http
            .request(method.parse().unwrap(), format!("{base}{path}"))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        async move {
            let resp = r.send().await.unwrap();
            let status = resp.status().as_u16();
            let v: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or_default();
            (status, v)
        }
    };
    let create = |path: &str, types: &str| {
        call(
            "POST",
            "/v1/accounts/acme/endpoints".into(),
            Some(serde_json::json!({"url": format!("{hooks}/{path}"), "event_types": [types]})),
        )
    };
    let (s, _) = create("healthy", "healthy.event").await;
    assert_eq!(s, 201);
    // Healthy latency: publish one event at a time, time until it arrives.
    let measure = |n: usize| {
        let (call, state) = (&call, state.clone());
        async move {
            let mut ms = Vec::new();
            for _ in 0..n {
                let t0 = Instant::now();
                let (s, v) = call(
                    "POST",
                    "/v1/accounts/acme/events".into(),
                    Some(serde_json::json!({"type": "healthy.event", "payload": {}})),
                )
                .await;
                assert_eq!(s, 202);
                let id = v["deliveries"][0].as_str().unwrap().to_string();
                loop {
                    if let Some(at) = state.arrivals.lock().unwrap().get(&id) {
                        ms.push((*at - t0).as_secs_f64() * 1000.0);
                        break;
                    }
                    assert!(
                        t0.elapsed() < Duration::from_secs(30),
                        "a healthy delivery is stuck"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ms.sort_by(|a, b| a.total_cmp(b));
            (ms[ms.len() / 2], ms[ms.len() * 99 / 100])
        }
    };
    let alone = measure(40).await;
    let (s, failing) = create("failing", "failing.event").await;
    assert_eq!(s, 201);
    let failing_id = failing["id"].as_str().unwrap().to_string();
    for _ in 0..60 {
        let (s, _) = call(
            "POST",
            "/v1/accounts/acme/events".into(),
            Some(serde_json::json!({"type": "failing.event", "payload": {}})),
        )
        .await;
        assert_eq!(s, 202);
    }
    let beside = measure(40).await;
    eprintln!(
        "chaos: healthy endpoint enqueue-to-arrival p50/p99: alone {:.1}/{:.1} ms, beside a failing neighbour {:.1}/{:.1} ms",
        alone.0, alone.1, beside.0, beside.1
    );
    // The neighbour holds each of its sends for 1.2 s: a healthy delivery
    // that waited for one of them to end would take at least that long.
    assert!(
        beside.0 < 1_000.0,
        "the healthy endpoint waited behind its failing neighbour: p50 {:.1} ms (alone {:.1} ms)",
        beside.0,
        alone.0
    );
    wait_until(
        "the circuit did not open",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let (mode, _) = call_circuit(&http, &base, &failing_id).await;
            mode == "open" || mode == "half_open"
        },
    )
    .await;
    state.failing.store(false, Ordering::SeqCst);
    wait_until(
        "the circuit did not close after recovery",
        Duration::from_secs(90),
        Duration::from_millis(250),
        || async { call_circuit(&http, &base, &failing_id).await == ("closed".into(), 0) },
    )
    .await;
    child.kill();
}

async fn call_circuit(http: &reqwest::Client, base: &str, endpoint: &str) -> (String, u64) {
    let path = format!("/v1/accounts/acme/endpoints/{endpoint}");
    let (_, v) = api_call(http, base, ADMIN, "GET", &path, None).await;
    (
        v["circuit"]["mode"].as_str().unwrap_or("").to_string(),
        v["circuit"]["consecutive_failures"].as_u64().unwrap_or(0),
    )
}
