//! Egress through a real proxy (Debian's `tinyproxy`, started here with a
//! configuration of its own, basic authentication on): a webhook leaves
//! through the proxy's tunnel to the address the rules checked (the proxy's
//! log names the address, never the URL's name); a destination the rules
//! refuse is refused before the proxy hears of it; `no_proxy` sends
//! directly; wrong proxy credentials fail the attempt, naming the
//! proxy's refusal (tinyproxy answers 401 where the standard says 407); a
//! client certificate (mTLS) is presented through the tunnel.
//!
//! Needs `tinyproxy` (`apt-get install tinyproxy`; `.ci/run` installs it);
//! fails, never skips, without.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::*;
use dispatcher::signing::generate_secret;
use dispatcher::{Dispatcher, DispatcherConfig, Proxy, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const ACCOUNT: &str = "acme";

/// `tinyproxy` in the foreground on a free port, killed on drop.
struct Tinyproxy {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tinyproxy {
    fn start() -> Tinyproxy {
        let bin = "/usr/bin/tinyproxy";
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: apt-get install tinyproxy"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("tinyproxy.log");
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 10\nMaxClients 50\nAllow 127.0.0.1\n\
                 LogLevel Info\nLogFile \"{}\"\nBasicAuth hooks s3cret\n",
                log.display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "tinyproxy never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Tinyproxy {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn url(&self, password: &str) -> String {
        format!("http://hooks:{password}@127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A receiver answering `200` to every request; the heads it read.
async fn receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    server(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()).await
}

/// A server answering `answer` to every request; the heads it read.
async fn server(answer: Vec<u8>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let answer = Arc::new(answer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let (seen, answer) = (seen.clone(), answer.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    seen.lock().unwrap().push(text[..end].to_string());
                    buf.drain(..end + 4 + length);
                    if s.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, heads)
}

/// Sends one event to an endpoint at `url` with a dispatcher whose proxy
/// is `proxy`; the first attempt recorded.
async fn first_attempt(url: &str, proxy: Proxy) -> AttemptRecord {
    first_attempt_with(url, proxy, |_| {}).await
}

/// As [`first_attempt`], the endpoint's request changed by `configure`
/// (a client certificate, OAuth2 credentials), to receivers the test
/// authority vouches for.
async fn first_attempt_with(
    url: &str,
    proxy: Proxy,
    configure: impl FnOnce(&mut EndpointCreateRequest),
) -> AttemptRecord {
    let dir = tempfile::tempdir().unwrap();
    let store = common::embedded_store(&dir, |_| {}).await;
    let account = AccountId::new(ACCOUNT).unwrap();
    let mut req = EndpointCreateRequest::new(account.clone(), url, generate_secret());
    req.event_types = vec!["invoice.paid".into()];
    configure(&mut req);
    store.endpoint_create(req.checked().unwrap()).await.unwrap();
    let published = store
        .event_publish(
            PublishRequest::new(account.clone(), "invoice.paid", serde_json::json!({"n": 1}))
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    let delivery = published.deliveries[0];
    let d = Dispatcher::new(
        store.clone(),
        DispatcherConfig {
            poll_interval: Duration::from_millis(50),
            request_timeout: Duration::from_secs(5),
            grace: Duration::from_millis(300),
            retry: RetryPolicy {
                schedule: vec![Duration::from_secs(600)],
                jitter: 0.0,
                max_retry_after: Duration::from_secs(600),
            },
            allowed_targets: vec![dispatcher::Cidr::parse("127.0.0.0/8").unwrap()],
            proxy: Some(proxy),
            extra_roots_pem: Some(common::mtls::CA.into()),
            ..DispatcherConfig::default()
        },
    )
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let run = tokio::spawn(async move { d.run(stopped).await });
    let start = Instant::now();
    let attempt = loop {
        let list = store
            .attempt_list_for_delivery(&account, delivery)
            .await
            .unwrap();
        if let Some(first) = list.into_iter().next() {
            break first;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no attempt of {url} after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.cancel();
    let _ = run.await;
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_leave_through_the_proxy_to_the_checked_address() {
    let proxy = Tinyproxy::start();
    let (port, heads) = receiver().await;

    // Through the proxy, named by a name that resolves to a checked address.
    let through = Proxy::parse(&proxy.url("s3cret"), None).unwrap();
    let a = first_attempt(&format!("http://localhost:{port}/hook"), through.clone()).await;
    assert_eq!(a.status_code, Some(200), "{a:?}");
    assert_eq!(a.result, AttemptResult::Delivered, "{a:?}");
    let got = heads.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("POST /hook HTTP/1.1"), "{got:?}");
    assert!(
        got[0]
            .to_ascii_lowercase()
            .contains(&format!("host: localhost:{port}")),
        "the receiver sees the URL's name: {got:?}"
    );
    assert!(
        !got[0].to_ascii_lowercase().contains("proxy-authorization"),
        "the proxy's credentials stay with the proxy: {got:?}"
    );
    let log = proxy.log();
    assert!(
        log.contains(&format!("CONNECT 127.0.0.1:{port}")),
        "the proxy was asked for the checked address: {log}"
    );
    assert!(
        !log.contains("CONNECT localhost"),
        "the proxy never resolves the name: {log}"
    );

    // A destination the rules refuse never reaches the proxy.
    let a = first_attempt("http://169.254.169.254/latest/meta-data", through.clone()).await;
    assert_eq!(a.status_code, None, "{a:?}");
    assert!(
        a.error.as_deref().unwrap_or_default().contains("private"),
        "{a:?}"
    );
    assert!(!proxy.log().contains("169.254.169.254"), "{}", proxy.log());

    // Bypassed by name: straight to the receiver, the proxy not asked.
    let before = proxy.log().matches("CONNECT").count();
    let direct = Proxy::parse(&proxy.url("s3cret"), Some("localhost")).unwrap();
    let a = first_attempt(&format!("http://localhost:{port}/direct"), direct).await;
    assert_eq!(a.status_code, Some(200), "{a:?}");
    assert_eq!(heads.lock().unwrap().len(), 2);
    assert_eq!(
        proxy.log().matches("CONNECT").count(),
        before,
        "{}",
        proxy.log()
    );

    // Wrong credentials: the attempt fails with the proxy's answer.
    let wrong = Proxy::parse(&proxy.url("wrong"), None).unwrap();
    let a = first_attempt(&format!("http://127.0.0.1:{port}/hook"), wrong).await;
    assert_eq!(a.status_code, None, "{a:?}");
    let error = a.error.clone().unwrap_or_default();
    assert!(
        error.contains("proxy credentials refused") && error.contains("CONNECT with 40"),
        "{a:?}"
    );
    assert!(
        !error.contains("wrong"),
        "no password in the attempt: {a:?}"
    );
    assert_eq!(
        heads.lock().unwrap().len(),
        2,
        "nothing reached the receiver"
    );
}

/// mTLS through the proxy (ADR 0048): TLS runs end to end inside the
/// `CONNECT` tunnel, so the endpoint's client certificate reaches a receiver
/// that requires it, and the proxy sees only the checked address. Without
/// the certificate the receiver refuses the same tunnel's handshake, and
/// the attempt fails saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_through_the_proxy_tunnel() {
    let proxy = Tinyproxy::start();
    let r = common::mtls::receiver().await;
    let through = Proxy::parse(&proxy.url("s3cret"), None).unwrap();
    let a = first_attempt_with(&r.url, through.clone(), |r| {
        r.client_tls = Some(common::mtls::client())
    })
    .await;
    assert_eq!(a.result, AttemptResult::Delivered, "{a:?}");
    let port = r
        .url
        .trim_start_matches("https://127.0.0.1:")
        .trim_end_matches("/hook");
    assert!(
        proxy.log().contains(&format!("CONNECT 127.0.0.1:{port}")),
        "through the proxy: {}",
        proxy.log()
    );
    let a = first_attempt_with(&r.url, through, |_| {}).await;
    assert_eq!(a.status_code, None, "{a:?}");
    let error = a.error.clone().unwrap_or_default();
    assert!(error.contains("TLS") && error.contains("alert"), "{a:?}");
    assert_eq!(
        r.counts(),
        (1, 1, 1),
        "one accepted, one refused, one answer"
    );
}

/// OAuth2 token requests leave through the proxy too (README, ADR 0046):
/// the token server is reached through a tunnel to its checked address,
/// then the webhook, carrying the token it gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_token_requests_leave_through_the_proxy() {
    let proxy = Tinyproxy::start();
    let token = r#"{"access_token":"tok-123","token_type":"Bearer","expires_in":3600}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{token}",
        token.len()
    );
    let (token_port, asked) = server(answer.into_bytes()).await;
    let (port, heads) = receiver().await;
    let through = Proxy::parse(&proxy.url("s3cret"), None).unwrap();
    let a = first_attempt_with(&format!("http://localhost:{port}/hook"), through, |r| {
        r.oauth2 = Some(ClientCredentials {
            token_url: format!("http://localhost:{token_port}/token"),
            client_id: "client".into(),
            client_secret: "secret".into(),
            scope: None,
            audience: None,
        });
    })
    .await;
    assert_eq!(a.status_code, Some(200), "{a:?}");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].starts_with("POST /token HTTP/1.1"), "{asked:?}");
    let got = heads.lock().unwrap().clone();
    assert!(
        got[0]
            .to_ascii_lowercase()
            .contains("authorization: bearer tok-123"),
        "{got:?}"
    );
    let log = proxy.log();
    assert!(
        log.contains(&format!("CONNECT 127.0.0.1:{token_port}")),
        "the token request went through the proxy: {log}"
    );
    assert!(log.contains(&format!("CONNECT 127.0.0.1:{port}")), "{log}");
}
