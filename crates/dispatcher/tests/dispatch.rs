//! The dispatcher against a real local HTTP receiver and the embedded store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::*;
use control_plane_runtime::UsageMeter;
use dispatcher::signing::{generate_secret, verify};
use dispatcher::{Dispatcher, DispatcherConfig, RetryPolicy};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
struct Seen {
    headers: HashMap<String, String>,
    body: String,
}

/// One request off `sock`: its head, then `content-length` bytes of body;
/// `None` when the connection closes first.
async fn read_request(sock: &mut (impl AsyncRead + Unpin)) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        let n = sock.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
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
    Some(Seen { headers, body })
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
                let Some(seen) = read_request(&mut sock).await else {
                    return;
                };
                log.lock().unwrap().push(seen);
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

/// An Ed25519 endpoint's requests carry a Standard Webhooks `v1a`
/// signature that its public key verifies, here and in OpenSSL (an
/// implementation of Ed25519 that is not ours): the official Standard
/// Webhooks libraries (Python and JavaScript, 1.3.0) verify only `v1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ed25519_endpoint_is_signed_v1a_and_openssl_verifies_it() {
    use control_plane_core::{generate_ed25519_secret, Ed25519Key};
    let r = receiver(Vec::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |_| {}).await;
    let key = generate_ed25519_secret().unwrap();
    let req = EndpointCreateRequest::new(
        AccountId::new("acme").unwrap(),
        &r.url,
        Secret::new(key.clone()),
    );
    let endpoint = store.endpoint_create(req.checked().unwrap()).await.unwrap();
    let s = Setup {
        store,
        endpoint,
        _dir: dir,
    };
    let id = publish(&s).await;
    run_until(&s, config(1), || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let seen = r.seen.lock().unwrap()[0].clone();
    let (msg_id, ts) = (
        &seen.headers["webhook-id"],
        &seen.headers["webhook-timestamp"],
    );
    let header = &seen.headers["webhook-signature"];
    assert!(header.starts_with("v1a,"), "{header}");
    let public = Ed25519Key::from_secret(&key).unwrap().public_key();
    let ts_n: i64 = ts.parse().unwrap();
    assert!(dispatcher::signing::verify_v1a(
        &public,
        header,
        msg_id,
        ts_n,
        seen.body.as_bytes()
    ));
    // OpenSSL, given the key as SubjectPublicKeyInfo (RFC 8410's prefix).
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let raw = b64.decode(public.strip_prefix("whpk_").unwrap()).unwrap();
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(&raw);
    let work = tempfile::tempdir().unwrap();
    let pem = work.path().join("key.pem");
    std::fs::write(
        &pem,
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            b64.encode(&der)
        ),
    )
    .unwrap();
    let sig = work.path().join("sig");
    std::fs::write(
        &sig,
        b64.decode(header.strip_prefix("v1a,").unwrap()).unwrap(),
    )
    .unwrap();
    let openssl_verifies = |content: String| {
        let msg = work.path().join("msg");
        std::fs::write(&msg, content).unwrap();
        std::process::Command::new("openssl")
            .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
            .arg(&pem)
            .arg("-in")
            .arg(&msg)
            .arg("-sigfile")
            .arg(&sig)
            .output()
            .expect("openssl runs")
            .status
            .success()
    };
    assert!(openssl_verifies(format!("{msg_id}.{ts}.{}", seen.body)));
    assert!(
        !openssl_verifies(format!("{msg_id}.{ts}.{} ", seen.body)),
        "a changed body fails"
    );
}

/// An endpoint's own schedule (1 s) and limit (2 attempts) win over the
/// service's (600 s): the delivery is dead after two sends, a second apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_own_retry_schedule_and_limit_are_used() {
    let r = receiver(vec![(500, None, Duration::ZERO); 3]).await;
    let s = setup(&r.url).await;
    let retry = EndpointRetry::new(vec![Duration::from_secs(1)], Some(2)).unwrap();
    let update = EndpointUpdateRequest {
        retry: Some(Some(retry)),
        ..Default::default()
    };
    let key = EndpointKey::new(&s.endpoint.account, s.endpoint.id);
    s.store.endpoint_update(key, update).await.unwrap();
    let id = publish(&s).await;
    run_until(&s, config(600), || async {
        state(&s, id).await.state == DeliveryState::Dead
    })
    .await;
    assert_eq!(state(&s, id).await.attempts, 2);
    assert_eq!(r.seen.lock().unwrap().len(), 2, "no third send");
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

/// A receiver that answers the requests on each connection, keeping it
/// open, with the next of `answers` as they are (the last one again after
/// them).
async fn raw_receiver(answers: Vec<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let answers = answers.clone();
            tokio::spawn(async move {
                while read_request(&mut sock).await.is_some() {
                    let answer = {
                        let mut a = answers.lock().unwrap();
                        if a.len() > 1 {
                            a.pop_front()
                        } else {
                            a.front().cloned()
                        }
                    };
                    // The dispatcher may close once it kept what it wants.
                    let answer = answer.unwrap_or_default();
                    if sock.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// `text` as a chunked answer with `status`, in chunks of `size` bytes.
fn chunked_answer(status: u16, text: &str, size: usize) -> String {
    let mut answer = format!("HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n");
    for piece in text.as_bytes().chunks(size) {
        answer.push_str(&format!("{:x}\r\n", piece.len()));
        answer.push_str(std::str::from_utf8(piece).unwrap());
        answer.push_str("\r\n");
    }
    answer + "0\r\n\r\n"
}

/// A body longer than the dispatcher reads to keep a connection still
/// leaves its first `response_body_bytes` (here the most, 64 KiB) on the
/// attempt: a 100 KB error page by its length, 256 KiB in 8 KiB chunks
/// (past the 80 KiB chunk buffer), and 256 KiB in chunks larger than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_of_a_long_answer_body_is_kept_on_the_attempt() {
    // Printable ASCII in a period of 89 (a prime): a kept body that starts
    // or ends at the wrong byte does not compare equal.
    let text: String = (0..256 * 1024)
        .map(|i| char::from(b'!' + u8::try_from(i % 89).unwrap()))
        .collect();
    let url = raw_receiver(vec![
        format!(
            "HTTP/1.1 500 X\r\ncontent-type: text/html\r\ncontent-length: 100000\r\n\r\n{}",
            &text[..100_000]
        ),
        chunked_answer(502, &text, 8 * 1024),
        chunked_answer(503, &text, 100_000),
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string(),
    ])
    .await;
    let s = setup(&url).await;
    let id = publish(&s).await;
    let mut cfg = config(0);
    cfg.response_body_bytes = 64 * 1024;
    run_until(&s, cfg, || async {
        state(&s, id).await.state == DeliveryState::Delivered
    })
    .await;
    let log = s
        .store
        .attempt_list_for_delivery(&AccountId::new("acme").unwrap(), id)
        .await
        .unwrap();
    let statuses: Vec<Option<u16>> = log.iter().map(|a| a.status_code).collect();
    assert_eq!(statuses, [Some(500), Some(502), Some(503), Some(200)]);
    let start = &text[..64 * 1024];
    for a in &log[..3] {
        let kept = a.response_body.as_deref().unwrap_or_default();
        assert!(
            kept == start,
            "the {:?} answer kept {} bytes, not the first 65536",
            a.status_code,
            kept.len()
        );
    }
    assert_eq!(log[3].response_body, None, "an empty body keeps nothing");
}

/// A certificate for `127.0.0.1`, valid from 2020 to 2120, signed by its
/// own key (below) and by no authority, so that no client should trust it:
/// made once for these tests with openssl. Its name is its own: a trust
/// store may hold a self-signed `localhost` (Debian's snakeoil does).
const SELF_SIGNED_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBuTCCAV6gAwIBAgIBATAKBggqhkjOPQQDAjAxMS8wLQYDVQQDDCZjb250cm9s
LXBsYW5lIGRpc3BhdGNoZXIgdGVzdCByZWNlaXZlcjAgFw0yMDAxMDEwMDAwMDBa
GA8yMTIwMDEwMTAwMDAwMFowMTEvMC0GA1UEAwwmY29udHJvbC1wbGFuZSBkaXNw
YXRjaGVyIHRlc3QgcmVjZWl2ZXIwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARj
/K6COmMTTMFXfAKIoVhY0lhGK3SvJj7bV4pvIfVc6ODE+kJo9WT/wzf/1K3EAaCh
399NTNprRDC8VuEp1d+oo2UwYzAPBgNVHREECDAGhwR/AAABMAwGA1UdEwEB/wQC
MAAwDgYDVR0PAQH/BAQDAgeAMBMGA1UdJQQMMAoGCCsGAQUFBwMBMB0GA1UdDgQW
BBQ4VYFwhXl5Z13Q5ifMGC7Lzt/5szAKBggqhkjOPQQDAgNJADBGAiEA3y+RpZQh
5RuandYx5LlgK5I1+SyHZIVVysV3RmxRBbYCIQDe2P4p455rr7oBFffNRM42oc3D
ivQ6DlfDvlx4Lb9wAQ==
-----END CERTIFICATE-----
";

/// The key of [`SELF_SIGNED_CERT`], a test fixture that guards nothing.
const SELF_SIGNED_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgHp3/NfIuNavRR9hY
ENdzreZ7V+hpgX9IWh7RxTPr6+2hRANCAARj/K6COmMTTMFXfAKIoVhY0lhGK3Sv
Jj7bV4pvIfVc6ODE+kJo9WT/wzf/1K3EAaCh399NTNprRDC8VuEp1d+o
-----END PRIVATE KEY-----
";

/// An HTTPS receiver with [`SELF_SIGNED_CERT`] that answers `200` to every
/// request that reaches it; its URL and how many requests it answered.
async fn tls_receiver() -> (String, Arc<AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = CertificateDer::from_pem_slice(SELF_SIGNED_CERT.as_bytes()).unwrap();
    let key = PrivateKeyDer::from_pem_slice(SELF_SIGNED_KEY.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/hook", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                while read_request(&mut tls).await.is_some() {
                    count.fetch_add(1, Ordering::SeqCst);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if tls.write_all(ok).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, answered)
}

/// A receiver whose certificate no trusted authority signed is refused at
/// the handshake: the attempt fails (retried later, not delivered) with an
/// error naming TLS and the certificate, and no request reaches it. The
/// receiver itself works: a client that trusts its certificate gets `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_with_an_untrusted_certificate_is_not_sent_to() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let (url, answered) = tls_receiver().await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(SELF_SIGNED_CERT.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let trusting = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let addr = url.trim_start_matches("https://").trim_end_matches("/hook");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(trusting))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(b"POST /hook HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tls.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the receiver answers over TLS");
    assert_eq!(answered.load(Ordering::SeqCst), 1);

    let s = setup(&url).await;
    let id = publish(&s).await;
    run_until(&s, config(60), || async {
        state(&s, id).await.last_error.is_some()
    })
    .await;
    let d = state(&s, id).await;
    assert_eq!(d.state, DeliveryState::Pending, "retried later");
    let error = d.last_error.unwrap_or_default();
    assert!(
        error.contains("TLS") && error.contains("certificate"),
        "{error}"
    );
    assert_eq!(
        answered.load(Ordering::SeqCst),
        1,
        "the dispatcher's request never reached the receiver"
    );
}

/// Every header name that frames or routes a request, or that the
/// dispatcher sets itself, is refused as a custom header, in any case.
/// The list is this test's own, so a name taken out of
/// `RESERVED_HEADERS` fails it: a custom `transfer-encoding` beside the
/// dispatcher's own `content-length` would have a receiver's proxy read
/// the body as a second request (request smuggling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reserved_name_is_refused_as_a_custom_header() {
    const MUST_BE_REFUSED: &[&str] = &[
        "connection",
        "content-length",
        "content-type",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "webhook-anything-else",
    ];
    let s = setup("http://127.0.0.1:9/hook").await;
    let key = EndpointKey::new(&s.endpoint.account, s.endpoint.id);
    let set = |name: &str| EndpointUpdateRequest {
        headers: Some([(name.to_string(), "1".to_string())].into_iter().collect()),
        ..EndpointUpdateRequest::default()
    };
    for name in MUST_BE_REFUSED {
        for spelled in [name.to_string(), name.to_ascii_uppercase()] {
            match s.store.endpoint_update(key, set(&spelled)).await {
                Err(StoreError::InvalidInput(why)) => assert!(why.contains(&spelled), "{why}"),
                other => panic!("{spelled} was not refused: {other:?}"),
            }
        }
    }
    for allowed in ["authorization", "x-api-key", "traceparent"] {
        s.store
            .endpoint_update(key, set(allowed))
            .await
            .unwrap_or_else(|e| panic!("{allowed}: {e}"));
    }
}

/// The store's count of deliveries in `state`.
async fn count(s: &Setup, state: DeliveryState) -> usize {
    let counts = s.store.delivery_count_by_state().await.unwrap();
    counts
        .iter()
        .find(|(st, _)| *st == state)
        .map_or(0, |(_, n)| usize::try_from(*n).unwrap())
}

/// While its receiver answers quickly, a worker of one send slot claims
/// `ahead` more deliveries into its local queue (ADR 0038): the store shows
/// them leased at once. With `ahead` 0 it never holds more than its slot,
/// outcomes being recorded included. Every delivery arrives either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_run_ahead_of_one_slot_while_the_receiver_is_quick() {
    for ahead in [20usize, 0] {
        let r = receiver(vec![(200, None, Duration::from_millis(20)); 30]).await;
        let s = setup(&r.url).await;
        for _ in 0..30 {
            publish(&s).await;
        }
        let peak = AtomicUsize::new(0);
        let cfg = DispatcherConfig {
            concurrency: 1,
            ahead,
            ..config(5)
        };
        let report = run_until(&s, cfg, || async {
            peak.fetch_max(count(&s, DeliveryState::Leased).await, Ordering::SeqCst);
            count(&s, DeliveryState::Delivered).await == 30
        })
        .await;
        assert_eq!(report.delivered, 30);
        assert_eq!(r.seen.lock().unwrap().len(), 30, "each sent once");
        let peak = peak.load(Ordering::SeqCst);
        if ahead == 0 {
            assert!(peak <= 1, "one slot, nothing ahead: {peak} leased at once");
        } else {
            assert!(
                peak >= 10,
                "claimed ahead of the one slot: {peak} leased at most"
            );
        }
    }
}

/// An endpoint of the receiver's account presenting `client_tls`, if any.
async fn mtls_endpoint(s: &Setup, url: &str, client_tls: Option<ClientTls>) -> Endpoint {
    let mut req = EndpointCreateRequest::new(s.endpoint.account.clone(), url, generate_secret());
    req.client_tls = client_tls;
    s.store
        .endpoint_create(req.checked().unwrap())
        .await
        .unwrap()
}

/// The deliveries of the event `published` made, by endpoint.
async fn deliveries_of(s: &Setup, published: &Published) -> HashMap<EndpointId, Delivery> {
    let mut by = HashMap::new();
    for id in &published.deliveries {
        let d = state(s, *id).await;
        by.insert(d.endpoint_id, d);
    }
    by
}

/// Against a receiver that requires a client certificate signed by its
/// authority (ADR 0048): the endpoint with the right certificate is
/// delivered to; one with none and one with a certificate of another
/// authority are refused by the receiver and recorded as failed attempts
/// (retried later) whose reason names TLS and the receiver's alert. The
/// idle connection of the first is never reused for another endpoint: not
/// for one without a certificate (it would then be accepted), and not for
/// another endpoint with the same certificate (it gets its own handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_and_a_missing_or_wrong_one_is_refused() {
    let r = common::mtls::receiver().await;
    let s = &setup(&r.url).await;
    let with_none = s.endpoint.clone();
    let right = mtls_endpoint(s, &r.url, Some(common::mtls::client())).await;
    let wrong = mtls_endpoint(s, &r.url, Some(common::mtls::other())).await;
    let cfg = DispatcherConfig {
        extra_roots_pem: Some(common::mtls::CA.into()),
        ..config(600)
    };
    let d = Arc::new(Dispatcher::new(s.store.clone(), cfg).unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let run = {
        let (d, stop) = (d.clone(), stop.clone());
        tokio::spawn(async move { d.run(stop).await })
    };
    let publish_event = || async move {
        s.store
            .event_publish(
                PublishRequest::new(
                    s.endpoint.account.clone(),
                    "invoice.paid",
                    serde_json::json!({}),
                )
                .checked()
                .unwrap(),
            )
            .await
            .unwrap()
    };
    // The deliveries of `p` once each was delivered or failed, but the
    // held one of `skip`.
    let settled = |p: Published, skip: Option<EndpointId>| async move {
        let start = Instant::now();
        loop {
            let mut by = deliveries_of(s, &p).await;
            by.retain(|e, _| Some(*e) != skip);
            if by
                .values()
                .all(|d| d.state == DeliveryState::Delivered || d.last_error.is_some())
            {
                return by;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "not settled: {by:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };

    let first = settled(publish_event().await, None).await;
    assert_eq!(first[&right.id].state, DeliveryState::Delivered);
    for refused in [with_none.id, wrong.id] {
        let d = &first[&refused];
        assert_eq!(
            (d.state, d.attempts),
            (DeliveryState::Pending, 1),
            "retried later"
        );
        let error = d.last_error.clone().unwrap_or_default();
        assert!(error.contains("TLS") && error.contains("alert"), "{error}");
        assert!(!error.contains("PRIVATE KEY"), "{error}");
        println!("the attempt's error: {error}");
    }
    assert_eq!(
        r.counts(),
        (1, 2, 1),
        "one accepted connection, two refused, one answer"
    );

    // The right endpoint's connection is idle now. Its owner is disabled,
    // so the next event goes to the others only, one of them with the same
    // certificate on an endpoint of its own.
    let twin = mtls_endpoint(s, &r.url, Some(common::mtls::client())).await;
    s.store
        .endpoint_set_enabled(
            EndpointKey::new(&right.account, right.id),
            Enablement::Disabled { reason: None },
        )
        .await
        .unwrap();
    let second = settled(publish_event().await, Some(right.id)).await;
    stop.cancel();
    run.await.unwrap();
    let by_endpoint = |e: &Endpoint| second.get(&e.id).cloned();
    assert_eq!(by_endpoint(&twin).unwrap().state, DeliveryState::Delivered);
    assert_ne!(
        by_endpoint(&with_none).unwrap().state,
        DeliveryState::Delivered
    );
    assert_ne!(by_endpoint(&wrong).unwrap().state, DeliveryState::Delivered);
    assert_eq!(
        r.counts(),
        (2, 4, 2),
        "the twin made its own connection; the others were refused again, on new connections"
    );
}
