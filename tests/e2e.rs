//! End to end: the real `control-plane` binary, on both profiles, driven
//! through its HTTP API, delivering to a real HTTP receiver that verifies
//! every signature with its own Standard Webhooks check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

const ADMIN: &str = "cpa_e2e_admin_token_0123456789abcdef";

// ---------------------------------------------------------------- receiver

/// One webhook as the receiver saw it.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HashMap<String, String>,
    body: String,
    at: Instant,
}

#[derive(Default)]
struct Receiver {
    seen: Mutex<Vec<Received>>,
    hits: Mutex<HashMap<String, u32>>,
    down: AtomicBool,
    started: AtomicU32,
}

impl Receiver {
    fn requests(&self, path: &str) -> Vec<Received> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

/// Behaviour by path: `ok`; `flaky` (500, then 200); `slow` (first answer
/// after 6 s, beyond the request timeout); `limited` (429 with
/// `Retry-After: 1`, then 200); `gone` (410); `down` (500 while the switch is
/// on); `sleepy` (every answer after 1.5 s, within the 2 s request timeout).
async fn hook(
    State(r): State<Arc<Receiver>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let n = {
        let mut hits = r.hits.lock().unwrap();
        let n = hits.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    r.started.fetch_add(1, Ordering::SeqCst);
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    r.seen.lock().unwrap().push(Received {
        path: path.clone(),
        headers,
        body,
        at: Instant::now(),
    });
    match (path.as_str(), n) {
        ("flaky", 1) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        ("slow", 1) => {
            tokio::time::sleep(Duration::from_secs(6)).await;
            StatusCode::OK.into_response()
        }
        ("limited", 1) => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response(),
        ("gone", _) => StatusCode::GONE.into_response(),
        ("down", _) if r.down.load(Ordering::SeqCst) => {
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        ("sleepy", _) => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            StatusCode::OK.into_response()
        }
        _ => StatusCode::OK.into_response(),
    }
}

async fn start_receiver() -> (Arc<Receiver>, String) {
    let state = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/{path}", axum::routing::post(hook))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (state, base)
}

/// An independent Standard Webhooks verifier: HMAC-SHA256 over
/// `id.timestamp.body` with the base64 key after `whsec_`.
fn verify(secret: &str, r: &Received) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let (id, ts) = (&r.headers["webhook-id"], &r.headers["webhook-timestamp"]);
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.{}", r.body).as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let fresh = ts
        .parse::<i64>()
        .map(|t| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            (now - t).abs() < 300
        })
        .unwrap_or(false);
    fresh
        && r.headers["content-type"] == "application/json"
        && r.headers["webhook-signature"]
            .split(' ')
            .any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

// ----------------------------------------------------------------- service

enum Profile {
    Embedded(tempfile::TempDir),
    Postgres(String),
}

impl Profile {
    fn embedded() -> Profile {
        Profile::Embedded(tempfile::tempdir().unwrap())
    }

    fn postgres() -> Profile {
        Profile::Postgres(format!("cp_e2e_{}", uuid_like()))
    }

    fn env(&self, c: &mut Command) {
        match self {
            Profile::Embedded(dir) => {
                c.env("CONTROLPLANE_EMBEDDED_PATH", dir.path().join("e2e.duckdb"));
            }
            Profile::Postgres(schema) => {
                c.env("CONTROLPLANE_STORE", "postgres")
                    .env("CONTROLPLANE_DATABASE_URL", test_database_url())
                    .env("CONTROLPLANE_DATABASE_SCHEMA", schema)
                    .env("CONTROLPLANE_POOL_SIZE", "4");
            }
        }
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Profile::Postgres(schema) = self {
            let schema = schema.clone();
            // A plain thread: drop may run inside a runtime.
            let _ = std::thread::spawn(move || drop_schema(&schema)).join();
        }
    }
}

fn uuid_like() -> String {
    format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn test_database_url() -> String {
    std::env::var("CONTROLPLANE_TEST_DATABASE_URL").expect(
        "CONTROLPLANE_TEST_DATABASE_URL is not set: run the tests through `cargo xtask test`, which provides a database",
    )
}

fn drop_schema(schema: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&test_database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .unwrap();
    });
}

/// The running binary and a client for its API.
struct Service {
    child: std::process::Child,
    base: String,
    http: reqwest::Client,
    log: Arc<Mutex<Vec<String>>>,
}

impl Service {
    /// Starts `serve` on `profile`: short retries (1 s), a 4 s lease (so a
    /// 2 s request timeout), loopback allowed as a destination.
    fn start(profile: &Profile) -> Service {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let mut c = Command::new(env!("CARGO_BIN_EXE_control-plane"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
            c.env_remove(k);
        }
        profile.env(&mut c);
        c.arg("serve")
            .env("CONTROLPLANE_LISTEN", "127.0.0.1:0")
            .env("CONTROLPLANE_ADMIN_TOKEN", ADMIN)
            .env("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8")
            .env("CONTROLPLANE_RETRY_SCHEDULE", "1s,1s,1s")
            .env("CONTROLPLANE_LEASE", "4s")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        if !ready.contains("API on ") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the service did not start: {ready:?}");
        }
        let base = ready
            .split("API on ")
            .nth(1)
            .unwrap_or_else(|| panic!("no API address in {ready:?}"))
            .trim()
            .to_string();
        let log = Arc::new(Mutex::new(vec![ready]));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Service {
            child,
            base,
            http,
            log,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method.parse().unwrap(), url)
            .header("authorization", format!("Bearer {ADMIN}"));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let bytes = r.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn endpoint(&self, url: &str, types: &[&str]) -> (String, String) {
        let (s, v) = self
            .call(
                "POST",
                "/v1/accounts/acme/endpoints",
                Some(json!({"url": url, "event_types": types})),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        (
            v["id"].as_str().unwrap().to_string(),
            v["secret"].as_str().unwrap().to_string(),
        )
    }

    async fn publish(&self, event_type: &str) -> Vec<String> {
        let (s, v) = self
            .call(
                "POST",
                "/v1/accounts/acme/events",
                Some(json!({"type": event_type, "payload": {"n": 1}})),
            )
            .await;
        assert_eq!(s, 202, "{v}");
        v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect()
    }

    async fn delivery(&self, id: &str) -> Value {
        let (s, v) = self
            .call("GET", &format!("/v1/accounts/acme/deliveries/{id}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Polls a delivery until `done` holds, for at most `within`.
    async fn wait_delivery(
        &self,
        id: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let d = self.delivery(id).await;
            if done(&d) {
                return d;
            }
            assert!(
                start.elapsed() < within,
                "delivery {id} did not get there in {within:?}: {d}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let kill = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(kill.success());
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn results(d: &Value) -> Vec<String> {
    d["attempt_log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{}:{}",
                a["result"].as_str().unwrap(),
                a["status_code"]
                    .as_u64()
                    .map_or("-".into(), |c| c.to_string())
            )
        })
        .collect()
}

fn delivered(d: &Value) -> bool {
    d["state"] == "delivered"
}

// ----------------------------------------------------------------- the cases

/// Every case of issue 5 against one running service, concurrently.
async fn every_case(profile: Profile) {
    let (rx, hooks) = start_receiver().await;
    let mut svc = Service::start(&profile);
    let long = Duration::from_secs(40);

    let (ok_ep, ok_secret) = svc.endpoint(&format!("{hooks}/ok"), &["case.ok"]).await;
    let (_, flaky_secret) = svc
        .endpoint(&format!("{hooks}/flaky"), &["case.flaky"])
        .await;
    let (_, slow_secret) = svc.endpoint(&format!("{hooks}/slow"), &["case.slow"]).await;
    let (_, limited_secret) = svc
        .endpoint(&format!("{hooks}/limited"), &["case.limited"])
        .await;
    let (gone_ep, _) = svc.endpoint(&format!("{hooks}/gone"), &["case.gone"]).await;
    let (_, watcher_secret) = svc
        .endpoint(&format!("{hooks}/watcher"), &["endpoint.disabled"])
        .await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_url = format!("http://{}/nobody", closed.local_addr().unwrap());
    drop(closed);
    svc.endpoint(&refused_url, &["case.refused"]).await;
    rx.down.store(true, Ordering::SeqCst);
    let (_, down_secret) = svc.endpoint(&format!("{hooks}/down"), &["case.down"]).await;

    let ok = svc.publish("case.ok").await;
    let flaky = svc.publish("case.flaky").await;
    let slow = svc.publish("case.slow").await;
    let limited = svc.publish("case.limited").await;
    let gone = svc.publish("case.gone").await;
    let refused = svc.publish("case.refused").await;
    let down = svc.publish("case.down").await;
    for d in [&ok, &flaky, &slow, &limited, &gone, &refused, &down] {
        assert_eq!(d.len(), 1, "each case has its own endpoint");
    }

    // Delivered, signed.
    let d = svc.wait_delivery(&ok[0], long, delivered).await;
    assert_eq!(results(&d), ["delivered:200"]);
    let got = rx.requests("ok");
    assert_eq!(got.len(), 1);
    assert!(verify(&ok_secret, &got[0]), "signature of {:?}", got[0]);
    assert_eq!(got[0].headers["webhook-id"], ok[0]);
    let body: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(body["type"], "case.ok");
    assert_eq!(body["data"], json!({"n": 1}));
    assert!(body["timestamp"].is_string());

    // 500, then success: the same webhook-id and body both times.
    let d = svc.wait_delivery(&flaky[0], long, delivered).await;
    assert_eq!(results(&d), ["failed:500", "delivered:200"]);
    let got = rx.requests("flaky");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| verify(&flaky_secret, r)));
    assert_eq!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    assert_eq!(got[0].body, got[1].body);

    // A timeout is retried.
    let d = svc.wait_delivery(&slow[0], long, delivered).await;
    assert_eq!(results(&d), ["failed:-", "delivered:200"]);
    assert_eq!(d["attempt_log"][0]["error"], "timed out");
    assert!(rx.requests("slow").iter().all(|r| verify(&slow_secret, r)));

    // 429 with Retry-After: the next attempt waits at least that long.
    let d = svc.wait_delivery(&limited[0], long, delivered).await;
    assert_eq!(results(&d), ["failed:429", "delivered:200"]);
    let got = rx.requests("limited");
    assert!(got.iter().all(|r| verify(&limited_secret, r)));
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(900),
        "Retry-After honoured"
    );

    // 410 disables the endpoint; the watcher hears about it, signed.
    let start = Instant::now();
    loop {
        let (_, e) = svc
            .call(
                "GET",
                &format!("/v1/accounts/acme/endpoints/{gone_ep}"),
                None,
            )
            .await;
        if e["enabled"] == false {
            assert!(e.get("secret").is_none(), "no secret on read");
            break;
        }
        assert!(start.elapsed() < long, "410 did not disable: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let d = svc.delivery(&gone[0]).await;
    assert_eq!(results(&d), ["failed:410"]);
    let start = Instant::now();
    while rx.requests("watcher").is_empty() {
        assert!(start.elapsed() < long, "no endpoint.disabled event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let alert = &rx.requests("watcher")[0];
    assert!(verify(&watcher_secret, alert));
    let body: Value = serde_json::from_str(&alert.body).unwrap();
    assert_eq!(body["type"], "endpoint.disabled");
    assert_eq!(body["data"]["endpoint_id"], gone_ep);

    // Connection refused is retried.
    let d = svc
        .wait_delivery(&refused[0], long, |d| {
            d["attempt_log"].as_array().is_some_and(|a| a.len() >= 2)
        })
        .await;
    assert_eq!(d["attempt_log"][0]["error"], "connection failed");
    assert_eq!(d["attempt_log"][0]["will_retry"], true);

    // Dead after the last attempt, then replayed and delivered.
    let d = svc
        .wait_delivery(&down[0], long, |d| d["state"] == "dead")
        .await;
    assert_eq!(
        results(&d),
        ["failed:500", "failed:500", "failed:500", "failed:500"]
    );
    rx.down.store(false, Ordering::SeqCst);
    let (s, v) = svc
        .call(
            "POST",
            &format!("/v1/accounts/acme/deliveries/{}/replay", down[0]),
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "pending");
    let d = svc.wait_delivery(&down[0], long, delivered).await;
    assert_eq!(results(&d).last().unwrap(), "delivered:200");
    let got = rx.requests("down");
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|r| verify(&down_secret, r)));

    // Usage and metrics follow the traffic.
    let start = Instant::now();
    loop {
        let (s, u) = svc.call("GET", "/v1/accounts/acme/usage", None).await;
        assert_eq!(s, 200, "{u}");
        let total = |m: &str| -> u64 {
            u["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["metric"] == m)
                .map(|r| r["amount"].as_u64().unwrap())
                .sum()
        };
        if total("events_published") == 7 && total("attempts") >= 14 {
            assert!(total("bytes_sent") > 0);
            break;
        }
        assert!(start.elapsed() < long, "usage not recorded: {u}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = svc
        .http
        .get(format!("{}/metrics", svc.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("controlplane_deliveries{state=\"delivered\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("controlplane_attempts_total{result=\"retry\"}"));
    assert!(metrics.contains("controlplane_delivery_duration_seconds_count"));
    assert!(metrics.contains("controlplane_open_circuits"));

    // Every request the receiver saw carried a valid signature of its endpoint.
    let started = rx.started.load(Ordering::SeqCst) as usize;
    assert_eq!(started, rx.seen.lock().unwrap().len());
    let _ = ok_ep;

    // No secret reached the log.
    let status = svc.terminate();
    assert!(status.success(), "{}", svc.log());
    for secret in [
        &ok_secret,
        &flaky_secret,
        &slow_secret,
        &down_secret,
        &watcher_secret,
    ] {
        let raw = secret.strip_prefix("whsec_").unwrap();
        assert!(!svc.log().contains(raw), "a secret reached the log");
    }
    assert!(
        !svc.log().contains(ADMIN),
        "the admin token reached the log"
    );
    drop(profile);
}

/// SIGTERM while a send is in flight: the send finishes within the grace
/// period (or its lease is released), the process exits cleanly, and after a
/// restart the delivery is delivered: nothing is lost.
async fn sigterm_during_a_slow_send(profile: Profile) {
    let (rx, hooks) = start_receiver().await;
    let mut svc = Service::start(&profile);
    let (_, secret) = svc.endpoint(&format!("{hooks}/sleepy"), &[]).await;
    let ids = svc.publish("slow.one").await;
    let start = Instant::now();
    while rx.started.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "no send started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = svc.terminate();
    assert!(status.success(), "{}", svc.log());
    assert!(svc.log().contains("stopped dispatcher"), "{}", svc.log());
    drop(svc);
    let svc = Service::start(&profile);
    let d = svc
        .wait_delivery(&ids[0], Duration::from_secs(40), delivered)
        .await;
    let got = rx.requests("sleepy");
    assert!(!got.is_empty() && got.len() <= 2, "{got:?}");
    assert!(got.iter().all(|r| verify(&secret, r)));
    assert!(got.iter().all(|r| r.headers["webhook-id"] == ids[0]));
    assert!(results(&d).iter().any(|r| r == "delivered:200"), "{d}");
    drop(svc);
    drop(profile);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_profile_delivers_every_case() {
    every_case(Profile::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_profile_delivers_every_case() {
    every_case(Profile::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::postgres()).await;
}
