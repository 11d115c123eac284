//! The dispatcher against a real local HTTP receiver and the embedded store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::*;
use dispatcher::signing::{generate_secret, verify};
use dispatcher::{Dispatcher, DispatcherConfig, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
struct Seen {
    headers: HashMap<String, String>,
    body: String,
}

/// A minimal HTTP/1.1 receiver answering from a script (status, extra header, delay).
struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn receiver(script: Vec<(u16, Option<&'static str>, Duration)>) -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (log, script) = (log.clone(), script.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let header_end = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
                let headers: HashMap<String, String> = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                while buf.len() < header_end + len {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&buf[header_end..]).to_string();
                log.lock().unwrap().push(Seen { headers, body });
                let (status, extra, delay) =
                    script
                        .lock()
                        .unwrap()
                        .pop_front()
                        .unwrap_or((200, None, Duration::ZERO));
                tokio::time::sleep(delay).await;
                // `extra` is a header line, or `body:` and the answer's body.
                let (extra, answer) = match extra.and_then(|e| e.strip_prefix("body:")) {
                    Some(b) => (None, b),
                    None => (extra, ""),
                };
                let extra = extra.map(|h| format!("{h}\r\n")).unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{answer}",
                    answer.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    Receiver { url, seen }
}

struct Setup {
    store: DynControlPlaneStore,
    endpoint: Endpoint,
    _dir: tempfile::TempDir,
}

async fn setup(url: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |_| {}).await;
    let endpoint = store
        .endpoint_create(
            EndpointCreateRequest::new(AccountId::new("acme").unwrap(), url, generate_secret())
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    Setup {
        store,
        endpoint,
        _dir: dir,
    }
}

fn config(schedule_s: u64) -> DispatcherConfig {
    DispatcherConfig {
        poll_interval: Duration::from_millis(50),
        request_timeout: Duration::from_secs(2),
        grace: Duration::from_millis(300),
        retry: RetryPolicy {
            schedule: vec![Duration::from_secs(schedule_s)],
            jitter: 0.0,
            max_retry_after: Duration::from_secs(600),
        },
        allowed_targets: vec![dispatcher::Cidr::parse("127.0.0.0/8").unwrap()],
        ..DispatcherConfig::default()
    }
}

async fn publish(s: &Setup) -> DeliveryId {
    let p = s
        .store
        .event_publish(
            PublishRequest::new(
                AccountId::new("acme").unwrap(),
                "invoice.paid",
                serde_json::json!({"amount": 42}),
            )
            .checked()
            .unwrap(),
        )
        .await
        .unwrap();
    p.deliveries[0]
}

/// Runs a dispatcher until `done` holds (or 20 s pass), then stops it.
async fn run_until<F, Fut>(s: &Setup, cfg: DispatcherConfig, done: F) -> dispatcher::DispatchReport
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    run_dispatcher_until(Dispatcher::new(s.store.clone(), cfg).unwrap(), done).await
}

async fn run_dispatcher_until<F, Fut>(d: Dispatcher, done: F) -> dispatcher::DispatchReport
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let tx = tokio_util::sync::CancellationToken::new();
    let rx = tx.clone();
    let run = tokio::spawn(async move { d.run(rx).await });
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for the dispatcher"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tx.cancel();
    run.await.unwrap()
}

async fn state(s: &Setup, id: DeliveryId) -> Delivery {
    s.store
        .delivery_get(&AccountId::new("acme").unwrap(), id)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_signed_sent_and_recorded() {
    let r = receiver(vec![(200, None, Duration::ZERO)]).await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    let report = run_until(&s, config(5), || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    assert_eq!(report.delivered, 1);
    let seen = r.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h["webhook-id"], id.to_string());
    assert_eq!(h["content-type"], "application/json");
    let ts: i64 = h["webhook-timestamp"].parse().unwrap();
    assert!(verify(
        &s.endpoint.secrets.current,
        &h["webhook-signature"],
        &h["webhook-id"],
        ts,
        seen[0].body.as_bytes()
    ));
    let body: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["data"]["amount"].as_i64()),
        (Some("invoice.paid"), Some(42))
    );
    println!("headers of one real delivery: {h:?}");
}

/// An endpoint's custom headers go with every request (an `authorization`
/// among them: a URL may not carry credentials); the dispatcher's own
/// headers stay as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_are_sent_and_authorization_replaces_the_urls() {
    let r = receiver(vec![(200, None, Duration::ZERO)]).await;
    let s = setup(&r.url).await;
    let headers = [("X-Api-Key", "k-1"), ("Authorization", "Bearer tok")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    s.store
        .endpoint_update(
            EndpointKey::new(&AccountId::new("acme").unwrap(), s.endpoint.id),
            EndpointUpdateRequest {
                headers: Some(headers),
                ..EndpointUpdateRequest::default()
            },
        )
        .await
        .unwrap();
    let id = publish(&s).await;
    run_until(&s, config(5), || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let seen = r.seen.lock().unwrap().clone();
    let h = &seen[0].headers;
    assert_eq!(h["x-api-key"], "k-1");
    assert_eq!(h["authorization"], "Bearer tok");
    assert_eq!(h["webhook-id"], id.to_string());
    assert_eq!(h["content-type"], "application/json");
}

/// The start of each answer's body is kept on its attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_body_is_kept_on_the_attempt() {
    let r = receiver(vec![
        (
            500,
            Some("body:overloaded, come back later"),
            Duration::ZERO,
        ),
        (200, Some("body:{\"received\":true}"), Duration::ZERO),
    ])
    .await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    let mut cfg = config(0);
    cfg.response_body_bytes = 10;
    run_until(&s, cfg, || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let log = s
        .store
        .attempt_list_for_delivery(&AccountId::new("acme").unwrap(), id)
        .await
        .unwrap();
    let bodies: Vec<Option<String>> = log.into_iter().map(|a| a.response_body).collect();
    assert_eq!(
        bodies,
        [
            Some("overloaded".to_string()),
            Some("{\"received".to_string())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_is_retried_with_the_same_webhook_id_then_delivered() {
    let r = receiver(vec![
        (500, None, Duration::ZERO),
        (200, None, Duration::ZERO),
    ])
    .await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    run_until(&s, config(0), || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let seen = r.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers["webhook-id"], seen[1].headers["webhook-id"]);
    assert_eq!(
        seen[0].body, seen[1].body,
        "the stored body is sent unchanged"
    );
    let log = s
        .store
        .attempt_list_for_delivery(&AccountId::new("acme").unwrap(), id)
        .await
        .unwrap();
    assert_eq!(
        log.iter().map(|a| a.status_code).collect::<Vec<_>>(),
        vec![Some(500), Some(200)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_disables_the_endpoint() {
    let r = receiver(vec![(410, None, Duration::ZERO)]).await;
    let s = setup(&r.url).await;
    publish(&s).await;
    let acct = AccountId::new("acme").unwrap();
    run_until(&s, config(0), || async {
        !s.store
            .endpoint_get(&acct, s.endpoint.id)
            .await
            .unwrap()
            .enabled
    })
    .await;
    assert_eq!(
        r.seen.lock().unwrap().len(),
        1,
        "nothing more is sent to a disabled endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_retry_after_is_honoured() {
    let r = receiver(vec![(429, Some("retry-after: 120"), Duration::ZERO)]).await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    let before = SystemClock.now();
    run_until(&s, config(1), || async {
        state(&s, id).await.attempts == 1 && state(&s, id).await.state == DeliveryState::Pending
    })
    .await;
    let d = state(&s, id).await;
    assert!(
        d.due_at >= before.plus(Duration::from_secs(119)),
        "due {:?}, sent at {before:?}",
        d.due_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_later() {
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = setup(&format!("http://127.0.0.1:{port}/closed")).await;
    let id = publish(&s).await;
    run_until(&s, config(60), || async {
        state(&s, id).await.last_error.is_some()
    })
    .await;
    let d = state(&s, id).await;
    assert_eq!(d.state, DeliveryState::Pending);
    assert!(d.due_at > SystemClock.now().plus(Duration::from_secs(50)));
    assert_eq!(d.last_error.as_deref(), Some("connection failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_slow_send_releases_the_lease() {
    let r = receiver(vec![(200, None, Duration::from_secs(5))]).await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    let report = run_until(&s, config(5), || async {
        !r.seen.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(report.released, 1);
    let d = state(&s, id).await;
    assert_eq!(
        (d.state, d.attempts),
        (DeliveryState::Pending, 0),
        "released, attempt returned, nothing lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_destination_is_refused_without_an_allowlist() {
    let r = receiver(vec![(200, None, Duration::ZERO)]).await;
    let s = setup(&r.url).await;
    let id = publish(&s).await;
    let cfg = DispatcherConfig {
        allowed_targets: Vec::new(),
        ..config(5)
    };
    let metrics = Arc::new(dispatcher::DeliveryMetrics::default());
    let d = Dispatcher::new(s.store.clone(), cfg)
        .unwrap()
        .with_meters(metrics.clone(), Arc::default());
    run_dispatcher_until(d, || async {
        state(&s, id).await.state == DeliveryState::Dead
    })
    .await;
    assert!(r.seen.lock().unwrap().is_empty(), "nothing was sent");
    assert_eq!(metrics.attempts("give_up"), 1, "the refusal is counted");
    assert!(state(&s, id)
        .await
        .last_error
        .unwrap_or_default()
        .contains("CONTROLPLANE_ALLOWED_TARGETS"));
}

/// An OAuth2 endpoint whose token request fails: the attempt fails (retried
/// on the schedule) with the token endpoint's status and error code, nothing
/// reaches the endpoint, and nothing is counted as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_token_request_fails_the_attempt_without_sending() {
    let token = receiver(vec![(
        400,
        Some(r#"body:{"error":"invalid_client"}"#),
        Duration::ZERO,
    )])
    .await;
    let r = receiver(Vec::new()).await;
    let s = setup(&r.url).await;
    s.store
        .endpoint_update(
            EndpointKey::new(&s.endpoint.account, s.endpoint.id),
            EndpointUpdateRequest {
                oauth2: Some(Some(ClientCredentials {
                    token_url: token.url.clone(),
                    client_id: "hooks".into(),
                    client_secret: "client-secret-xyz".into(),
                    scope: None,
                    audience: None,
                })),
                ..EndpointUpdateRequest::default()
            },
        )
        .await
        .unwrap();
    let id = publish(&s).await;
    let metrics = Arc::new(dispatcher::DeliveryMetrics::default());
    let usage = Arc::new(UsageMeter::default());
    let d = Dispatcher::new(s.store.clone(), config(60))
        .unwrap()
        .with_meters(metrics.clone(), usage.clone());
    run_dispatcher_until(d, || async {
        state(&s, id).await.attempts == 1 && state(&s, id).await.state == DeliveryState::Pending
    })
    .await;
    let d = state(&s, id).await;
    let error = d.last_error.unwrap_or_default();
    assert!(
        error.contains("answered 400") && error.contains("invalid_client"),
        "{error}"
    );
    assert!(!error.contains("client-secret-xyz"), "{error}");
    assert!(
        r.seen.lock().unwrap().is_empty(),
        "nothing reached the endpoint"
    );
    assert_eq!(token.seen.lock().unwrap().len(), 1);
    assert_eq!(metrics.attempts("retry"), 1, "a failed attempt");
    let counted = usage
        .flush(s.store.as_ref(), SystemClock.now())
        .await
        .unwrap();
    assert_eq!(
        counted, 0,
        "neither an attempt nor bytes are counted as sent"
    );
}
