//! Broker destinations (issue 59) against the real brokers this machine
//! runs: RabbitMQ on 127.0.0.1:5672, NATS with JetStream on 4222, Redis on
//! 6379. A broker that cannot be reached fails these tests; they never skip.
//! Each test reads back what was published and verifies its signature as a
//! consumer would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use control_plane_core::*;
use dispatcher::signing::{generate_secret, verify};
use dispatcher::{Dispatcher, DispatcherConfig, RetryPolicy};

const ACCOUNT: &str = "acme";

struct Setup {
    store: DynControlPlaneStore,
    secret: Secret,
    _dir: tempfile::TempDir,
}

async fn setup(url: &str) -> Setup {
    setup_with(url, &[]).await
}

/// An endpoint on `url` with custom `headers`.
async fn setup_with(url: &str, headers: &[(&str, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |_| {}).await;
    let secret = generate_secret();
    let mut req = EndpointCreateRequest::new(AccountId::new(ACCOUNT).unwrap(), url, secret.clone());
    req.headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    store.endpoint_create(req.checked().unwrap()).await.unwrap();
    Setup {
        store,
        secret,
        _dir: dir,
    }
}

fn config(allowed: &[&str]) -> DispatcherConfig {
    DispatcherConfig {
        poll_interval: Duration::from_millis(50),
        request_timeout: Duration::from_secs(3),
        grace: Duration::from_millis(300),
        retry: RetryPolicy {
            schedule: vec![Duration::from_secs(600)],
            jitter: 0.0,
            max_retry_after: Duration::from_secs(600),
        },
        allowed_targets: allowed
            .iter()
            .map(|c| dispatcher::Cidr::parse(c).unwrap())
            .collect(),
        ..DispatcherConfig::default()
    }
}

fn loopback() -> DispatcherConfig {
    config(&["127.0.0.0/8"])
}

async fn publish(s: &Setup) -> DeliveryId {
    s.store
        .event_publish(
            PublishRequest::new(
                AccountId::new(ACCOUNT).unwrap(),
                "invoice.paid",
                serde_json::json!({"amount": 42}),
            )
            .checked()
            .unwrap(),
        )
        .await
        .unwrap()
        .deliveries[0]
}

async fn delivery(s: &Setup, id: DeliveryId) -> Delivery {
    s.store
        .delivery_get(&AccountId::new(ACCOUNT).unwrap(), id)
        .await
        .unwrap()
}

/// Runs a dispatcher until `id` has an attempt in the log (or 20 s
/// pass), then stops it; the delivery as it is then, and its attempts.
async fn dispatch(
    s: &Setup,
    cfg: DispatcherConfig,
    id: DeliveryId,
) -> (Delivery, Vec<AttemptRecord>) {
    let d = Dispatcher::new(s.store.clone(), cfg).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { d.run(stop).await }
    });
    let attempts_of = || async {
        s.store
            .attempt_list_for_delivery(&AccountId::new(ACCOUNT).unwrap(), id)
            .await
            .unwrap()
    };
    let start = Instant::now();
    while attempts_of().await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no attempt was recorded; is the broker running?"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.cancel();
    run.await.unwrap();
    let attempts = attempts_of().await;
    (delivery(s, id).await, attempts)
}

/// What a consumer checks: the Standard Webhooks headers are there, name
/// the delivery, and sign the body with the endpoint's secret.
fn assert_signed(s: &Setup, id: DeliveryId, headers: &HashMap<String, String>, body: &[u8]) {
    assert_eq!(headers["webhook-id"], id.to_string());
    let ts: i64 = headers["webhook-timestamp"].parse().unwrap();
    assert!(
        verify(
            &s.secret,
            &headers["webhook-signature"],
            &headers["webhook-id"],
            ts,
            body
        ),
        "the signature verifies: {headers:?}"
    );
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["type"], "invoice.paid");
    assert_eq!(body["data"], serde_json::json!({"amount": 42}));
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

// ------------------------------------------------------------------ AMQP

async fn amqp_channel() -> (lapin::Connection, lapin::Channel) {
    let conn = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("RabbitMQ on 127.0.0.1:5672");
    let channel = conn.create_channel().await.unwrap();
    (conn, channel)
}

/// A new queue (deleted with its last consumer), on a channel of its own.
async fn amqp_queue() -> (lapin::Connection, lapin::Channel, String) {
    let (conn, ch) = amqp_channel().await;
    let queue = unique("cp-test-");
    ch.queue_declare(
        queue.as_str().into(),
        lapin::options::QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        lapin::types::FieldTable::default(),
    )
    .await
    .unwrap();
    (conn, ch, queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_delivery_is_confirmed_persistent_and_verifiable() {
    let (_conn, ch, queue) = amqp_queue().await;
    let s = setup(&format!(
        "amqp://127.0.0.1:5672/%2f?exchange=&routing_key={queue}"
    ))
    .await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Delivered, "{attempts:?}");
    assert_eq!(attempts[0].result, AttemptResult::Delivered);
    let got = ch
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the message is in the queue");
    let props = &got.delivery.properties;
    assert_eq!(props.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        props.message_id().as_ref().map(|m| m.to_string()),
        Some(id.to_string())
    );
    let headers: HashMap<String, String> = props
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .iter()
        .map(|(k, v)| {
            let v = match v {
                lapin::types::AMQPValue::LongString(s) => s.to_string(),
                other => panic!("{k}: {other:?}"),
            };
            (k.to_string(), v)
        })
        .collect();
    assert_signed(&s, id, &headers, &got.delivery.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_an_unroutable_message_is_a_failed_attempt_retried_later() {
    let s = setup(&format!(
        "amqp://127.0.0.1:5672/%2f?exchange=&routing_key={}",
        unique("cp-no-queue-")
    ))
    .await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Pending, "retried on the schedule");
    assert_eq!(attempts[0].result, AttemptResult::Failed);
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("no queue is bound"), "{error}");
}

/// `Basic` credentials as an `authorization` header value.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_credentials_come_from_the_authorization_header_and_are_not_sent() {
    let (_conn, ch, queue) = amqp_queue().await;
    let url = format!("amqp://127.0.0.1:5672/%2f?exchange=&routing_key={queue}");
    let good = basic("guest", "guest");
    let s = setup_with(&url, &[("authorization", &good), ("x-tenant", "t-1")]).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Delivered, "{attempts:?}");
    let got = ch
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the message is in the queue");
    let headers = got.delivery.properties.headers().clone().unwrap();
    let names: Vec<String> = headers.inner().keys().map(|k| k.to_string()).collect();
    assert!(names.contains(&"x-tenant".to_string()), "{names:?}");
    assert!(
        !names.contains(&"authorization".to_string()),
        "the credentials stay out of the message: {names:?}"
    );

    let bad = basic("guest", "wrong");
    let s = setup_with(&url, &[("authorization", &bad)]).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(
        d.state,
        DeliveryState::Pending,
        "a refused login is retried"
    );
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("amqp: cannot connect"), "{error}");
}

// ------------------------------------------------------------------ NATS

/// A new in-memory stream taking one subject: the context, the stream, its
/// name (to delete it) and its subject.
async fn nats_stream() -> (
    async_nats::jetstream::Context,
    async_nats::jetstream::stream::Stream,
    String,
    String,
) {
    let client = async_nats::connect("nats://127.0.0.1:4222")
        .await
        .expect("NATS on 127.0.0.1:4222");
    let js = async_nats::jetstream::new(client);
    let name = unique("CPTEST");
    let subject = format!("{}.orders", name.to_lowercase());
    let stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
    (js, stream, name, subject)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_delivery_is_acknowledged_by_the_stream_with_its_id() {
    let (js, stream, name, subject) = nats_stream().await;
    let s = setup(&format!("nats://127.0.0.1:4222?subject={subject}")).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Delivered, "{attempts:?}");
    let got = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .unwrap();
    let _ = js.delete_stream(&name).await;
    let headers: HashMap<String, String> = got
        .headers
        .iter()
        .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())))
        .collect();
    assert_eq!(headers["Nats-Msg-Id"], id.to_string());
    assert_signed(&s, id, &headers, &got.payload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_subject_no_stream_covers_is_a_failed_attempt() {
    let s = setup(&format!(
        "nats://127.0.0.1:4222?subject={}.nowhere",
        unique("cpnostream")
    ))
    .await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Pending);
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("nats"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_server_listed_in_connect_urls_is_never_connected_to() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The listed server is on 127.0.0.2, which the rules of this test
    // refuse (only 127.0.0.1 is allowed); it records what reaches it.
    let listed = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let listed_addr = listed.local_addr().unwrap();
    let reached: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let r = reached.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listed.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let _ = sock
                    .write_all(b"INFO {\"server_id\":\"listed\",\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n")
                    .await;
                let mut buf = vec![0u8; 4096];
                let n = tokio::time::timeout(Duration::from_millis(500), sock.read(&mut buf))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                r.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            });
        }
    });
    // The endpoint's server, on an allowed address: it lists the other in
    // INFO connect_urls, takes one client, then goes away (the client
    // reconnects, to any server it knows).
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = server.local_addr().unwrap().port();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sv = served.clone();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = server.accept().await else {
            return;
        };
        drop(server); // later connections to it are refused
        let info = format!(
            "INFO {{\"server_id\":\"receiver\",\"proto\":1,\"headers\":true,\"max_payload\":1048576,\"connect_urls\":[\"{listed_addr}\"]}}\r\n"
        );
        sock.write_all(info.as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("PING\r\n") {
            let n = sock.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        sock.write_all(b"PONG\r\n").await.unwrap();
        sv.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
    });

    let url = format!("nats://127.0.0.1:{port}?subject=orders.paid");
    let s = setup_with(&url, &[("authorization", &basic("tenant", "s3cret"))]).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, config(&["127.0.0.1/32"]), id).await;
    assert_eq!(d.state, DeliveryState::Pending, "{attempts:?}");
    assert!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        "the endpoint's own server was reached"
    );
    // The client reconnects at once when its server goes away; give it
    // time to try every server it knows.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reached = reached.lock().unwrap().clone();
    assert!(
        reached.is_empty(),
        "a server only listed in connect_urls, on a refused address, was connected to: {reached:?}"
    );
}

// ----------------------------------------------------------------- Redis

/// A stream entry's field and value.
type Field = (String, Vec<u8>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_delivery_is_appended_to_a_bounded_stream() {
    let stream = unique("cp-test-");
    let s = setup(&format!(
        "redis://127.0.0.1:6379/0?stream={stream}&maxlen=1000"
    ))
    .await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Delivered, "{attempts:?}");
    let client = redis::Client::open("redis://127.0.0.1:6379/0").unwrap();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis on 127.0.0.1:6379");
    let entries: Vec<(String, Vec<Field>)> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    let fields: HashMap<String, Vec<u8>> = entries[0].1.iter().cloned().collect();
    let headers: HashMap<String, String> = fields
        .iter()
        .filter(|(k, _)| *k != "body")
        .map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap()))
        .collect();
    assert_signed(&s, id, &headers, &fields["body"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_password_from_the_authorization_header_is_sent() {
    // This Redis has no password: one given is refused by it, which shows
    // it was sent; a malformed header is refused before any connection.
    let url = format!("redis://127.0.0.1:6379/0?stream={}", unique("cp-test-"));
    let s = setup_with(&url, &[("authorization", "Bearer not-configured")]).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(d.state, DeliveryState::Pending);
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("redis: cannot connect"), "{error}");
    let s = setup_with(&url, &[("authorization", "Digest x")]).await;
    let id = publish(&s).await;
    let (d, attempts) = dispatch(&s, loopback(), id).await;
    assert_eq!(
        d.state,
        DeliveryState::Dead,
        "a malformed header cannot work later"
    );
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("Basic"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_costs_a_slot_only_until_the_request_timeout() {
    // Accepts connections and never says a word: each transport's
    // handshake waits for the server, so every send must end at the
    // request timeout, as a silent HTTP receiver's does.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = silent.accept().await {
            keep.lock().unwrap().push(sock);
        }
    });
    for url in [
        format!("amqp://127.0.0.1:{port}/%2f?exchange=&routing_key=x"),
        format!("nats://127.0.0.1:{port}?subject=x"),
        format!("redis://127.0.0.1:{port}?stream=x"),
    ] {
        let s = setup(&url).await;
        let id = publish(&s).await;
        let mut cfg = loopback();
        cfg.request_timeout = Duration::from_secs(1);
        let started = Instant::now();
        let (d, attempts) = dispatch(&s, cfg, id).await;
        let took = started.elapsed();
        assert_eq!(d.state, DeliveryState::Pending, "{url}: retried later");
        assert_eq!(attempts[0].result, AttemptResult::Failed, "{url}");
        assert!(
            took < Duration::from_secs(5),
            "{url}: the slot came back in {took:?}"
        );
        assert!(attempts[0].latency_ms >= 900, "{url}: {:?}", attempts[0]);
    }
    assert!(
        !held.lock().unwrap().is_empty(),
        "the broker port was reached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_does_not_hold_up_another_of_its_transport() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            held.push(sock);
        }
    });
    let (js, _stream, name, subject) = nats_stream().await;
    let s = setup(&format!("nats://127.0.0.1:{port}?subject=x")).await;
    let mut req = EndpointCreateRequest::new(
        AccountId::new(ACCOUNT).unwrap(),
        format!("nats://127.0.0.1:4222?subject={subject}"),
        s.secret.clone(),
    );
    req.event_types = vec!["invoice.paid".into()];
    let healthy = s
        .store
        .endpoint_create(req.checked().unwrap())
        .await
        .unwrap();
    let publish_type = |ty: &'static str| {
        let store = s.store.clone();
        async move {
            store
                .event_publish(
                    PublishRequest::new(
                        AccountId::new(ACCOUNT).unwrap(),
                        ty,
                        serde_json::json!({}),
                    )
                    .checked()
                    .unwrap(),
                )
                .await
                .unwrap()
                .deliveries
        }
    };
    // The silent broker's connect starts first and hangs.
    publish_type("slow.event").await;
    let mut cfg = loopback();
    cfg.request_timeout = Duration::from_secs(10);
    let d = Dispatcher::new(s.store.clone(), cfg).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { d.run(stop).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut to_healthy = None;
    for id in publish_type("invoice.paid").await {
        if delivery(&s, id).await.endpoint_id == healthy.id {
            to_healthy = Some(id);
        }
    }
    let id = to_healthy.unwrap();
    until("the healthy broker's delivery", || async {
        delivery(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let took = started.elapsed();
    stop.cancel();
    run.await.unwrap();
    let _ = js.delete_stream(&name).await;
    assert!(
        took < Duration::from_secs(5),
        "the healthy broker waited for the silent one's connect: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_one_accounts_missing_exchange_fails_no_other_accounts_delivery() {
    // Two accounts' endpoints on one server with one login (the default):
    // one publishes to an exchange that does not exist, which makes
    // RabbitMQ close the channel it used, while the other publishes to a
    // good queue at the same time.
    let (_conn, ch, queue) = amqp_queue().await;
    let missing = unique("cp-missing-exchange-");
    let dir = tempfile::tempdir().unwrap();
    // The careless endpoint's circuit stays closed, so each of its
    // deliveries is attempted beside the careful one's.
    let store = common::embedded_store(&dir, |c| {
        c.options.breaker = BreakerPolicy {
            failure_threshold: 1000,
            ..BreakerPolicy::default()
        };
    })
    .await;
    let (careless, careful) = (
        AccountId::new("careless").unwrap(),
        AccountId::new("careful").unwrap(),
    );
    for (account, url) in [
        (
            &careless,
            format!("amqp://127.0.0.1:5672/%2f?exchange={missing}&routing_key=x"),
        ),
        (
            &careful,
            format!("amqp://127.0.0.1:5672/%2f?exchange=&routing_key={queue}"),
        ),
    ] {
        let req = EndpointCreateRequest::new(account.clone(), url, generate_secret());
        store.endpoint_create(req.checked().unwrap()).await.unwrap();
    }
    let mut sent = Vec::new();
    for _ in 0..20 {
        for account in [&careless, &careful] {
            let p = PublishRequest::new(account.clone(), "invoice.paid", serde_json::json!({}));
            let id = store
                .event_publish(p.checked().unwrap())
                .await
                .unwrap()
                .deliveries[0];
            sent.push((account.clone(), id));
        }
    }
    let d = Dispatcher::new(store.clone(), loopback()).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { d.run(stop).await }
    });
    until("an attempt for every delivery", || async {
        for (account, id) in &sent {
            if store
                .attempt_list_for_delivery(account, *id)
                .await
                .unwrap()
                .is_empty()
            {
                return false;
            }
        }
        true
    })
    .await;
    stop.cancel();
    run.await.unwrap();

    let mut careless_failed = 0;
    for (account, id) in &sent {
        let attempts = store.attempt_list_for_delivery(account, *id).await.unwrap();
        for a in &attempts {
            let error = a.error.clone().unwrap_or_default();
            if *account == careful {
                assert_eq!(
                    a.result,
                    AttemptResult::Delivered,
                    "the careful account's delivery failed: {error}"
                );
                assert!(
                    !error.contains(&missing),
                    "the careful account was shown the other's exchange: {error}"
                );
            } else {
                assert_eq!(a.result, AttemptResult::Failed, "{a:?}");
                careless_failed += 1;
            }
        }
    }
    assert!(
        careless_failed >= 20,
        "the careless account's attempts failed"
    );
    let mut got = 0;
    while ch
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .is_some()
    {
        got += 1;
    }
    assert_eq!(got, 20, "every careful delivery reached its queue");
}

// ------------------------------------------------------- destination rules

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_on_a_private_address_is_refused_unless_allowed() {
    for url in [
        "amqp://127.0.0.1:5672/%2f?exchange=&routing_key=x",
        "nats://127.0.0.1:4222?subject=x",
        "redis://127.0.0.1:6379?stream=x",
    ] {
        let s = setup(url).await;
        let id = publish(&s).await;
        let (d, attempts) = dispatch(&s, config(&[]), id).await;
        assert_eq!(d.state, DeliveryState::Dead, "{url}: refused, not retried");
        let error = attempts[0].error.clone().unwrap_or_default();
        assert!(
            error.contains("CONTROLPLANE_ALLOWED_TARGETS"),
            "{url}: {error}"
        );
    }
}

// ------------------------------------------------------ a broker going away

/// Waits until `done` holds, at most 30 s.
async fn until<F, Fut>(what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP proxy to RabbitMQ that can be cut (every connection closed, new
/// ones refused) and restored, as a broker restart or a blocked port is.
struct Proxy {
    port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    links: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: &'static str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let links: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
            std::sync::Arc::default();
        let (o, l) = (open.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !o.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                l.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut broker) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                    }
                }));
            }
        });
        Proxy { port, open, links }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for l in self.links.lock().unwrap().drain(..) {
            l.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_broker_going_away_opens_the_circuit_and_its_return_closes_it() {
    let (_conn, ch, queue) = amqp_queue().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |c| {
        c.options.max_attempts = 50;
        c.options.breaker = BreakerPolicy {
            failure_threshold: 2,
            cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(1),
        };
    })
    .await;
    let secret = generate_secret();
    let url = format!(
        "amqp://127.0.0.1:{}/%2f?exchange=&routing_key={queue}",
        proxy.port
    );
    let account = AccountId::new(ACCOUNT).unwrap();
    let e = store
        .endpoint_create(
            EndpointCreateRequest::new(account.clone(), url.as_str(), secret.clone())
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    let s = Setup {
        store: store.clone(),
        secret,
        _dir: dir,
    };
    let mut cfg = loopback();
    cfg.retry.schedule = vec![Duration::from_millis(200)];
    let d = Dispatcher::new(store.clone(), cfg).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { d.run(stop).await }
    });
    let first = publish(&s).await;
    let state = |id| {
        let (store, account) = (&store, &account);
        async move { store.delivery_get(account, id).await.unwrap().state }
    };
    until("the first delivery", || async {
        state(first).await == DeliveryState::Delivered
    })
    .await;

    proxy.cut();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(publish(&s).await);
    }
    until("the circuit to open", || async {
        store.circuit_get(&account, e.id).await.unwrap().mode != CircuitMode::Closed
    })
    .await;

    proxy.restore();
    until("every held delivery after the broker is back", || async {
        for id in &held {
            if state(*id).await != DeliveryState::Delivered {
                return false;
            }
        }
        true
    })
    .await;
    let circuit = store.circuit_get(&account, e.id).await.unwrap();
    assert_eq!(circuit.mode, CircuitMode::Closed, "the probe closed it");
    stop.cancel();
    run.await.unwrap();
    let failed = store
        .attempt_list_for_delivery(&account, held[0])
        .await
        .unwrap()
        .iter()
        .filter(|a| a.result == AttemptResult::Failed)
        .count();
    assert!(
        failed >= 1,
        "the held delivery failed while the broker was away"
    );
    let mut got = 0;
    while let Some(m) = ch
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let _ = m;
        got += 1;
    }
    assert!(got >= 4, "every delivery reached the queue, got {got}");
}
