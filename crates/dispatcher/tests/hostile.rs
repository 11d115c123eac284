//! The dispatcher against receivers that misbehave on purpose, one
//! behaviour per path, all at once, beside a healthy endpoint of another
//! account, with the slot count of a small deployment (16): every hostile
//! attempt is recorded with the outcome it deserves within its bound, and
//! the healthy endpoint's deliveries arrive as if the others were not there.
//! Beside them, a crowd of 20 more silent endpoints (more than the slots)
//! that the worker has never seen: without parking their sends would hold
//! every slot until the request timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::*;
use dispatcher::signing::generate_secret;
use dispatcher::{Dispatcher, DispatcherConfig, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Silent endpoints beside the behaviours, each with one delivery: more
/// than the 16 slots.
const CROWD: usize = 20;

/// What a hostile path's first attempt must record: a status, or a failure
/// whose error contains the text.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Status(u16),
    Error(&'static str),
}

/// Every behaviour, its path and what its attempt records.
const BEHAVIOURS: &[(&str, Expect)] = &[
    ("silence", Expect::Error("timed out")),
    ("trickled-head", Expect::Error("timed out")),
    ("head-of-100-kib", Expect::Error("request failed")),
    ("100000-headers", Expect::Error("request failed")),
    ("endless-continue", Expect::Error("timed out")),
    ("length-and-no-body", Expect::Status(200)),
    ("endless-chunked", Expect::Status(200)),
    ("reset", Expect::Error("request failed")),
    ("garbage", Expect::Error("request failed")),
    ("bad-chunk-framing", Expect::Status(200)),
    ("redirect-to-private", Expect::Status(302)),
    ("eighty-headers", Expect::Status(200)),
    ("two-lengths", Expect::Error("request failed")),
    ("early-413", Expect::Status(413)),
    ("http-1.0-close-delimited", Expect::Status(200)),
];

/// Reads one request's head and body (by `content-length`); its path. The
/// body of `early-413` is left unread: that receiver answers after the head.
async fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let path = head.split(' ').nth(1)?.trim_start_matches('/').to_string();
    if path == "early-413" {
        return Some(path);
    }
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < end + len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(path)
}

/// Behaves as its path says, on every connection.
async fn hostile_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                // A behaviour that answers validly keeps the connection for
                // the next request, as a real receiver would.
                while let Some(path) = read_request(&mut s).await {
                    if !behave(&path, &mut s).await {
                        return;
                    }
                }
            });
        }
    });
    base
}

/// Acts out `path` on `s`; whether the connection may carry another request.
async fn behave(path: &str, s: &mut TcpStream) -> bool {
    let forever = Duration::from_secs(3600);
    match path {
        "silence" => tokio::time::sleep(forever).await,
        "trickled-head" => {
            for b in b"HTTP/1.1 200 OK\r\nx-slow: "
                .iter()
                .chain(std::iter::repeat(&b'a'))
            {
                if s.write_all(&[*b]).await.is_err() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        "head-of-100-kib" => {
            let pad = "a".repeat(100 * 1024);
            let _ = s
                .write_all(
                    format!("HTTP/1.1 200 OK\r\nx-pad: {pad}\r\ncontent-length: 0\r\n\r\n")
                        .as_bytes(),
                )
                .await;
            tokio::time::sleep(forever).await;
        }
        "100000-headers" => {
            let mut head = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..100_000 {
                head.push_str(&format!("x{i}: y\r\n"));
            }
            head.push_str("content-length: 0\r\n\r\n");
            let _ = s.write_all(head.as_bytes()).await;
            tokio::time::sleep(forever).await;
        }
        "endless-continue" => loop {
            if s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        },
        "length-and-no-body" => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 65536\r\n\r\n")
                .await;
            tokio::time::sleep(forever).await;
        }
        "endless-chunked" => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            while s.write_all(b"1\r\na\r\n").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        "reset" => {
            // Closing with linger zero sends a reset instead of a FIN.
            let _ = socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO));
        }
        "garbage" => {
            let _ = s.write_all(b"\x00\xff\xfe garbage, not HTTP\r\n\r\n").await;
        }
        "bad-chunk-framing" => {
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n",
                )
                .await;
            tokio::time::sleep(forever).await;
        }
        "redirect-to-private" => {
            return s
                .write_all(b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data\r\ncontent-length: 0\r\n\r\n")
                .await
                .is_ok();
        }
        "eighty-headers" => {
            let mut head = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..80 {
                head.push_str(&format!("x-h{i}: {i}\r\n"));
            }
            head.push_str("content-length: 0\r\n\r\n");
            return s.write_all(head.as_bytes()).await.is_ok();
        }
        "two-lengths" => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab")
                .await;
            tokio::time::sleep(forever).await;
        }
        "early-413" => {
            let _ = s
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
        "http-1.0-close-delimited" => {
            let _ = s
                .write_all(b"HTTP/1.0 200 OK\r\n\r\nthe body runs to the close")
                .await;
        }
        other => panic!("no behaviour {other}"),
    }
    false
}

/// A well-behaved receiver: answers at once, keeps connections, and notes
/// when each `webhook-id` arrived.
async fn healthy_server(arrivals: Arc<Mutex<HashMap<String, Instant>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let field = |name: &str| {
                        head.lines()
                            .find_map(|l| l.strip_prefix(name))
                            .map(|v| v.trim().to_string())
                    };
                    let len: usize = field("content-length:")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + len {
                        match s.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                    buf.drain(..end + len);
                    if let Some(id) = field("webhook-id:") {
                        arrivals
                            .lock()
                            .unwrap()
                            .entry(id)
                            .or_insert_with(Instant::now);
                    }
                    if s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_receivers_get_their_outcomes_and_leave_a_healthy_account_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |_| {}).await;
    let hostile = AccountId::new("hostile").unwrap();
    let good = AccountId::new("good").unwrap();
    let base = hostile_server().await;
    let mut by_endpoint = HashMap::new();
    for (path, expect) in BEHAVIOURS {
        let mut req = EndpointCreateRequest::new(
            hostile.clone(),
            format!("{base}/{path}"),
            generate_secret(),
        );
        req.event_types = vec![path.to_string()];
        let e = store.endpoint_create(req.checked().unwrap()).await.unwrap();
        by_endpoint.insert(e.id, (*path, *expect));
    }
    for _ in 0..CROWD {
        let mut req = EndpointCreateRequest::new(
            hostile.clone(),
            format!("{base}/silence"),
            generate_secret(),
        );
        req.event_types = vec!["crowd".to_string()];
        let e = store.endpoint_create(req.checked().unwrap()).await.unwrap();
        by_endpoint.insert(e.id, ("silence (crowd)", Expect::Error("timed out")));
    }
    let arrivals: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let healthy_url = healthy_server(arrivals.clone()).await;
    store
        .endpoint_create(
            EndpointCreateRequest::new(good.clone(), healthy_url, generate_secret())
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    let mut hostile_deliveries = Vec::new();
    // The early 413 gets a payload far larger than the socket buffers, so
    // the receiver answers (and closes) while the request is being written.
    let large = "x".repeat(4 * 1024 * 1024);
    for (path, _) in BEHAVIOURS {
        for i in 0..4 {
            let payload = if *path == "early-413" {
                serde_json::json!({ "i": i, "pad": large })
            } else {
                serde_json::json!({ "i": i })
            };
            let p = store
                .event_publish(
                    PublishRequest::new(hostile.clone(), *path, payload)
                        .checked()
                        .unwrap(),
                )
                .await
                .unwrap();
            hostile_deliveries.extend(p.deliveries);
        }
    }
    let crowd = store
        .event_publish(
            PublishRequest::new(hostile.clone(), "crowd", serde_json::json!({}))
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(crowd.deliveries.len(), CROWD);
    hostile_deliveries.extend(crowd.deliveries);
    let d = Dispatcher::new(
        store.clone(),
        DispatcherConfig {
            concurrency: 16,
            poll_interval: Duration::from_millis(50),
            request_timeout: REQUEST_TIMEOUT,
            slow_answer: Duration::from_millis(500),
            retry: RetryPolicy {
                schedule: vec![Duration::from_secs(3600)],
                jitter: 0.0,
                max_retry_after: Duration::from_secs(3600),
            },
            allowed_targets: vec![dispatcher::Cidr::parse("127.0.0.0/8").unwrap()],
            ..DispatcherConfig::default()
        },
    )
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { d.run(stopped).await });

    // The healthy account publishes while the hostile sends hold their
    // sockets: 30 events, 100 ms apart, starting once every slot is taken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sent = Vec::new();
    for i in 0..30 {
        let p = store
            .event_publish(
                PublishRequest::new(good.clone(), "order.paid", serde_json::json!({ "i": i }))
                    .checked()
                    .unwrap(),
            )
            .await
            .unwrap();
        sent.push((p.deliveries[0].to_string(), Instant::now()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every hostile delivery gets its first attempt recorded.
    let started = Instant::now();
    let attempts = loop {
        let mut firsts = Vec::new();
        for id in &hostile_deliveries {
            let a = store
                .attempt_list_for_delivery(&hostile, *id)
                .await
                .unwrap();
            if let Some(first) = a.into_iter().next() {
                firsts.push(first);
            }
        }
        if firsts.len() == hostile_deliveries.len() {
            break firsts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of {} hostile deliveries have an attempt after 60 s",
            firsts.len(),
            hostile_deliveries.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.cancel();
    let _ = run.await;

    for a in &attempts {
        let (path, expect) = by_endpoint[&a.endpoint_id];
        match expect {
            Expect::Status(code) => assert_eq!(a.status_code, Some(code), "{path}: {a:?}"),
            Expect::Error(text) => {
                assert_eq!(a.status_code, None, "{path}: {a:?}");
                let error = a.error.clone().unwrap_or_default();
                assert!(error.contains(text), "{path}: {error:?}");
            }
        }
        // Each send held its slot no longer than the request timeout.
        assert!(
            Duration::from_millis(a.latency_ms) <= REQUEST_TIMEOUT + Duration::from_secs(1),
            "{path} held its slot for {} ms",
            a.latency_ms
        );
    }

    // Every healthy delivery arrived, none after waiting for a hostile send
    // to time out (5 s): isolation, not luck, brought them through.
    let seen = arrivals.lock().unwrap().clone();
    let mut waits: Vec<Duration> = sent
        .iter()
        .map(|(id, at)| {
            seen.get(id)
                .unwrap_or_else(|| panic!("healthy delivery {id} never arrived"))
                .saturating_duration_since(*at)
        })
        .collect();
    waits.sort();
    // Memory is a benchmark's to judge, not a test's: printed for the record.
    let peak = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or_default()
        .to_string();
    eprintln!("hostile suite: healthy waits {waits:?}; peak memory of the test process {peak}");
    let worst = *waits.last().unwrap();
    assert!(
        worst < Duration::from_millis(2500),
        "a healthy delivery waited {worst:?} beside the hostile receivers: {waits:?}"
    );
}
