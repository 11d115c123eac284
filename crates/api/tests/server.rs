//! The API's server limits over real sockets: a half-sent head, a silent
//! connection and an idle kept-alive one are closed within the header
//! timeout; a slow body is answered `408`; the connection bound holds; and a
//! stop is not held up by connections that never finish their request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::{router, ApiConfig, ServerLimits};
use control_plane_core::{DynControlPlaneStore, SystemClock};
use control_plane_runtime::UsageMeter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "cpa_test_admin_for_the_server_limits";

struct Server {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start(limits: ServerLimits, body_timeout: Duration) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store: DynControlPlaneStore = Arc::new(
        store_embedded::EmbeddedStore::open(
            store_embedded::EmbeddedConfig::new(dir.path().join("server.duckdb")),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    let mut config = ApiConfig::new(ADMIN);
    config.body_timeout = body_timeout;
    let app = router(
        store,
        &config,
        Arc::new(api::Metrics::default()),
        Arc::new(UsageMeter::default()),
        axum::Router::new(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let done = tokio::spawn(api::serve(listener, app, stop.clone(), limits));
    Server {
        addr,
        stop,
        done,
        _dir: dir,
    }
}

fn limits(header_timeout: Duration) -> ServerLimits {
    ServerLimits {
        header_timeout,
        ..ServerLimits::default()
    }
}

/// Reads until the peer closes; the bytes read. Fails after `within`.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(within, conn.read_to_end(&mut out))
        .await
        .expect("the server kept the connection open")
        .ok();
    out
}

async fn healthz(addr: std::net::SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    String::from_utf8_lossy(&closed_within(&mut c, Duration::from_secs(10)).await).into_owned()
}

#[tokio::test]
async fn half_sent_heads_and_silent_connections_are_closed_at_the_header_timeout() {
    let s = start(limits(Duration::from_secs(1)), Duration::from_secs(30)).await;
    let t0 = Instant::now();
    let mut half = TcpStream::connect(s.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    // Meanwhile a healthy client is served.
    assert!(healthz(s.addr).await.starts_with("HTTP/1.1 200"));
    closed_within(&mut half, Duration::from_secs(5)).await;
    closed_within(&mut silent, Duration::from_secs(5)).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_at_the_header_timeout() {
    let s = start(limits(Duration::from_secs(1)), Duration::from_secs(30)).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = closed_within(&mut c, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

#[tokio::test]
async fn a_body_slower_than_the_body_timeout_is_answered_408() {
    let s = start(limits(Duration::from_secs(10)), Duration::from_secs(1)).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST /v1/accounts/acme/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"type\""
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("no answer to a stalled body")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
}

#[tokio::test]
async fn past_the_connection_bound_new_connections_wait_for_a_free_one() {
    let s = start(
        ServerLimits {
            header_timeout: Duration::from_secs(2),
            max_connections: 1,
            ..ServerLimits::default()
        },
        Duration::from_secs(30),
    )
    .await;
    let t0 = Instant::now();
    let mut holder = TcpStream::connect(s.addr).await.unwrap();
    holder.write_all(b"GET /hea").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The second client is served only once the first is closed.
    let answer = healthz(s.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "served beside a held connection past the bound of 1: {waited:?}"
    );
    closed_within(&mut holder, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_stop_is_not_held_up_by_half_sent_requests() {
    let s = start(
        ServerLimits {
            header_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_millis(500),
            ..ServerLimits::default()
        },
        Duration::from_secs(60),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..50 {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        if i % 2 == 0 {
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost").await.unwrap();
        }
        held.push(c);
    }
    assert!(healthz(s.addr).await.starts_with("HTTP/1.1 200"));
    let t0 = Instant::now();
    s.stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), s.done)
        .await
        .expect("the server did not stop within 5 s")
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(3), "stopping took {took:?}");
    // No new connection is served after the stop.
    let refused = TcpStream::connect(s.addr).await;
    assert!(refused.is_err(), "the listener is still open");
}
