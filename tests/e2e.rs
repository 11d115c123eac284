//! End to end: the real `control-plane` binary, on both profiles, driven
//! through its HTTP API, delivering to a real HTTP receiver that verifies
//! every signature with its own Standard Webhooks check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use workspace_tests::{
    api_call, signature_is_valid as verify, Answer, Process, Received, Receiver, Schema,
};

const ADMIN: &str = "cpa_e2e_admin_token_0123456789abcdef";

// ---------------------------------------------------------------- receiver

/// Behaviour by path: `ok`; `flaky` (500, then 200); `slow` (first answer
/// after 6 s, beyond the request timeout); `limited` (429 with
/// `Retry-After: 3`, longer than the 1 s retry schedule, then 200); `gone` (410); `down` (500 while `down` is
/// on); `sleepy` (every answer after 1 s, within the 2 s request timeout).
fn cases(down: Arc<AtomicBool>) -> Answer {
    Arc::new(move |r: Received, n: usize| {
        let down = down.load(Ordering::SeqCst);
        Box::pin(async move {
            match (r.path.as_str(), n) {
                ("flaky", 1) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                ("slow", 1) => {
                    tokio::time::sleep(Duration::from_secs(6)).await;
                    StatusCode::OK.into_response()
                }
                ("limited", 1) => {
                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3")]).into_response()
                }
                ("gone", _) => StatusCode::GONE.into_response(),
                ("down", _) if down => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                ("sleepy", _) => {
                    tokio::time::sleep(Duration::from_millis(1000)).await;
                    StatusCode::OK.into_response()
                }
                _ => StatusCode::OK.into_response(),
            }
        })
    })
}

// ----------------------------------------------------------------- service

enum Profile {
    Embedded(tempfile::TempDir),
    Postgres(Schema),
}

impl Profile {
    fn embedded() -> Profile {
        Profile::Embedded(tempfile::tempdir().unwrap())
    }

    fn postgres() -> Profile {
        Profile::Postgres(Schema::new("cp_e2e"))
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Profile::Embedded(dir) => vec![(
                "CONTROLPLANE_EMBEDDED_PATH",
                dir.path().join("e2e.duckdb").to_string_lossy().into_owned(),
            )],
            Profile::Postgres(schema) => schema.env(4),
        }
    }
}

/// The running binary and a client for its API.
struct Service {
    process: Process,
    base: String,
    http: reqwest::Client,
}

impl Service {
    /// Starts `serve` on `profile`: short retries (1 s), a 4 s lease (so a
    /// 2 s request timeout), loopback allowed as a destination.
    fn start(profile: &Profile) -> Service {
        Service::start_with(profile, &[])
    }

    /// As [`Service::start`], with `extra` variables.
    fn start_with(profile: &Profile, extra: &[(&'static str, &str)]) -> Service {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut env = profile.env();
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env.extend([
            ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
            ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
            ("CONTROLPLANE_RETRY_SCHEDULE", "1s,1s,1s".to_string()),
            ("CONTROLPLANE_LEASE", "4s".to_string()),
        ]);
        let process = Process::start(env!("CARGO_BIN_EXE_control-plane"), "serve", &env);
        Service {
            base: process.api(),
            process,
            http: reqwest::Client::new(),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        api_call(&self.http, &self.base, ADMIN, method, path, body).await
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
        self.process.terminate()
    }

    fn log(&self) -> String {
        self.process.log()
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

/// How the service under test writes its log.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logs {
    /// The default: text at `info`.
    Text,
    /// `CONTROLPLANE_LOG_FORMAT=json` at `debug`, so every attempt is logged.
    JsonDebug,
}

/// Every case of issue 5 against one running service, concurrently.
async fn every_case(profile: Profile, logs: Logs) {
    let down_switch = Arc::new(AtomicBool::new(false));
    let (rx, hooks) = Receiver::start(cases(down_switch.clone())).await;
    let mut svc = match logs {
        Logs::Text => Service::start(&profile),
        Logs::JsonDebug => Service::start_with(
            &profile,
            &[
                ("CONTROLPLANE_LOG_FORMAT", "json"),
                ("CONTROLPLANE_LOG", "debug"),
            ],
        ),
    };
    let long = Duration::from_secs(40);

    let (ok_ep, ok_secret) = svc.endpoint(&format!("{hooks}/ok"), &["case.ok"]).await;
    let (_, flaky_secret) = svc
        .endpoint(&format!("{hooks}/flaky"), &["case.flaky"])
        .await;
    let (_, slow_secret) = svc.endpoint(&format!("{hooks}/slow"), &["case.slow"]).await;
    let (_, limited_secret) = svc
        .endpoint(&format!("{hooks}/limited"), &["case.limited"])
        .await;
    let (gone_ep, gone_secret) = svc.endpoint(&format!("{hooks}/gone"), &["case.gone"]).await;
    let (_, watcher_secret) = svc
        .endpoint(&format!("{hooks}/watcher"), &["endpoint.disabled"])
        .await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_url = format!("http://{}/nobody", closed.local_addr().unwrap());
    drop(closed);
    svc.endpoint(&refused_url, &["case.refused"]).await;
    down_switch.store(true, Ordering::SeqCst);
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

    // 429 with Retry-After: the next attempt waits at least that long (3 s,
    // where the schedule alone would wait 1 s).
    let d = svc.wait_delivery(&limited[0], long, delivered).await;
    assert_eq!(results(&d), ["failed:429", "delivered:200"]);
    let got = rx.requests("limited");
    assert!(got.iter().all(|r| verify(&limited_secret, r)));
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(2900),
        "Retry-After honoured: {:?}",
        got[1].at - got[0].at
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
    down_switch.store(false, Ordering::SeqCst);
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

    // Every request the receiver saw, the 410 and the alert included,
    // carried a valid signature of its own endpoint.
    let secrets: HashMap<&str, &String> = HashMap::from([
        ("ok", &ok_secret),
        ("flaky", &flaky_secret),
        ("slow", &slow_secret),
        ("limited", &limited_secret),
        ("gone", &gone_secret),
        ("watcher", &watcher_secret),
        ("down", &down_secret),
    ]);
    let all = rx.all();
    assert!(all.len() >= 14, "{} requests", all.len());
    for r in &all {
        let secret = secrets
            .get(r.path.as_str())
            .unwrap_or_else(|| panic!("a request to an unknown path: {r:?}"));
        assert!(verify(secret, r), "not signed by its endpoint: {r:?}");
    }
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
    if logs == Logs::JsonDebug {
        json_log_names_each_attempt(&svc.process.log());
    }
    drop(profile);
}

/// SIGTERM while a send is in flight: the send finishes within the grace
/// period (or its lease is released), the process exits cleanly, and after a
/// restart the delivery is delivered: nothing is lost.
async fn sigterm_during_a_slow_send(profile: Profile) {
    let (rx, hooks) = Receiver::start(cases(Arc::default())).await;
    let mut svc = Service::start(&profile);
    let (_, secret) = svc.endpoint(&format!("{hooks}/sleepy"), &[]).await;
    let ids = svc.publish("slow.one").await;
    let start = Instant::now();
    while rx.count() == 0 {
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
    every_case(Profile::embedded(), Logs::Text).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_profile_delivers_every_case() {
    every_case(Profile::postgres(), Logs::JsonDebug).await;
}

/// Every line of a JSON log is one JSON object with a level and a message,
/// and the attempts' lines carry the account, endpoint, delivery and attempt.
fn json_log_names_each_attempt(log: &str) {
    let mut attempts = 0;
    for line in log.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        if v["message"] == "attempt recorded" {
            let span = &v["span"];
            for field in ["account", "endpoint_id", "delivery_id"] {
                assert!(span[field].is_string(), "no {field}: {line}");
            }
            assert!(span["attempt"].is_u64(), "no attempt: {line}");
            assert!(v["result"].is_string() && v["state"].is_string(), "{line}");
            attempts += 1;
        }
    }
    assert!(attempts >= 10, "{attempts} attempt lines in:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::postgres()).await;
}
