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
    api_call, signature_is_valid as verify, text_of, Answer, Process, Received, Receiver, Schema,
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
    let metrics = text_of(
        svc.http
            .get(format!("{}/metrics", svc.base))
            .bearer_auth(ADMIN),
    )
    .await;
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

/// Connections that never finish a request (half a head, or nothing at
/// all) do not hold up a SIGTERM: the process exits cleanly within the 10 s
/// README promises, while the header timeout is still far away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_do_not_hold_up_a_sigterm() {
    use tokio::io::AsyncWriteExt;
    let profile = Profile::embedded();
    let mut svc = Service::start_with(&profile, &[("CONTROLPLANE_HTTP_HEADER_TIMEOUT", "5m")]);
    let addr = svc.base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for i in 0..100 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if i % 2 == 0 {
            c.write_all(b"POST /v1/accounts/acme/events HTTP/1.1\r\nhost: x\r\n")
                .await
                .unwrap();
        }
        held.push(c);
    }
    let (s, _) = svc.call("GET", "/v1/accounts/acme/endpoints", None).await;
    assert_eq!(s, 200, "served beside them");
    let start = Instant::now();
    let status = svc.terminate();
    let took = start.elapsed();
    assert!(status.success(), "{}", svc.log());
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::embedded()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_profile_loses_nothing_on_sigterm_mid_send() {
    sigterm_during_a_slow_send(Profile::postgres()).await;
}

/// Spans of one OTLP/JSON export body: `(name, trace id, span id, parent
/// span id)`, ids in hex as OTLP/JSON writes them.
fn exported_spans(body: &str) -> Vec<(String, String, String, String)> {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut out = Vec::new();
    for rs in v["resourceSpans"].as_array().into_iter().flatten() {
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for s in ss["spans"].as_array().into_iter().flatten() {
                let text = |k: &str| s[k].as_str().unwrap_or_default().to_lowercase();
                out.push((
                    text("name"),
                    text("traceId"),
                    text("spanId"),
                    text("parentSpanId"),
                ));
            }
        }
    }
    out
}

/// Tracing (README: Tracing): with an OTLP endpoint set, a publish that
/// carries a `traceparent` and the delivery of its event are exported as
/// one trace (the caller's), the attempt a child of the publish, and the
/// receiver gets the attempt's own context in its `traceparent` header.
/// The collector is an in-process HTTP server reading OTLP/JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_and_its_delivery_are_exported_as_one_trace() {
    let json_ok: Answer = Arc::new(|_, _| {
        Box::pin(async { ([("content-type", "application/json")], "{}").into_response() })
    });
    let (collector, otlp) = Receiver::start(json_ok).await;
    let (rx, hooks) = Receiver::start(cases(Arc::default())).await;
    let profile = Profile::embedded();
    let svc = Service::start_with(
        &profile,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    svc.endpoint(&format!("{hooks}/ok"), &[]).await;
    let (trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let res = svc
        .http
        .post(format!("{}/v1/accounts/acme/events", svc.base))
        .bearer_auth(ADMIN)
        .header("traceparent", format!("00-{trace}-{caller_span}-01"))
        .header("content-type", "application/json")
        .body(json!({"type": "order.created", "payload": {"n": 1}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let v: Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
    let id = v["deliveries"][0].as_str().unwrap().to_string();
    svc.wait_delivery(&id, Duration::from_secs(20), delivered)
        .await;
    let sent = rx.requests("ok");
    assert_eq!(sent.len(), 1, "{:?}", sent.len());
    let header = sent[0]
        .headers
        .get("traceparent")
        .cloned()
        .unwrap_or_default();
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {header:?}");
    assert_eq!(parts[1], trace, "the receiver is in the caller's trace");
    let start = Instant::now();
    let (publish, attempt) = loop {
        let spans: Vec<_> = collector
            .requests("v1/traces")
            .iter()
            .flat_map(|r| exported_spans(&r.body))
            .collect();
        let named = |n: &str| spans.iter().find(|s| s.0 == n).cloned();
        if let (Some(p), Some(a)) = (named("publish"), named("delivery")) {
            break (p, a);
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "spans exported so far: {spans:?}\n{}",
            svc.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(publish.1, trace, "{publish:?}");
    assert_eq!(publish.3, caller_span, "the publish is the caller's child");
    assert_eq!(attempt.1, trace, "{attempt:?}");
    assert_eq!(attempt.3, publish.2, "the attempt is the publish's child");
    assert_eq!(parts[2], attempt.2, "the receiver is the attempt's child");
    drop(svc);
    drop(profile);
}

/// OAuth2 client credentials (README: OAuth2): the dispatcher fetches a
/// token with basic client authentication and a form body, sends it as
/// `Bearer` on every request, fetches once for several deliveries, fetches
/// again once the token has expired and after the receiver answers `401`;
/// the client secret is never shown by the API nor logged, nor is a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_tokens_are_fetched_cached_renewed_and_never_shown() {
    use base64::Engine as _;
    let revoked = Arc::new(AtomicBool::new(false));
    let refuse = revoked.clone();
    let answer: Answer = Arc::new(move |r: Received, n| {
        let refuse = refuse.clone();
        Box::pin(async move {
            if r.path == "token" {
                let token = json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": 5});
                return ([("content-type", "application/json")], token.to_string()).into_response();
            }
            // The second token is revoked once: the receiver answers 401.
            let bearer = r.headers.get("authorization").cloned().unwrap_or_default();
            if bearer == "Bearer tok-2" && !refuse.swap(true, Ordering::SeqCst) {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            "ok".into_response()
        })
    });
    let (rx, hooks) = Receiver::start(answer).await;
    let profile = Profile::embedded();
    // At debug, so that a secret or token in any log line would show.
    let svc = Service::start_with(&profile, &[("CONTROLPLANE_LOG", "debug")]);
    let (s, v) = svc
        .call(
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(json!({"url": format!("{hooks}/protected"), "oauth2": {
                "token_url": format!("{hooks}/token"), "client_id": "hooks",
                "client_secret": "cs-secret-1", "scope": "webhooks"}})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["oauth2"]["client_id"], "hooks");
    assert_eq!(v["oauth2"]["scope"], "webhooks");
    assert!(!v.to_string().contains("cs-secret-1"), "{v}");
    let ep = v["id"].as_str().unwrap().to_string();
    let (_, read) = svc
        .call("GET", &format!("/v1/accounts/acme/endpoints/{ep}"), None)
        .await;
    assert!(!read.to_string().contains("cs-secret-1"), "{read}");
    assert_eq!(read["oauth2"]["token_url"], format!("{hooks}/token"));

    // Three deliveries, one token.
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.extend(svc.publish("order.created").await);
    }
    for id in &ids {
        svc.wait_delivery(id, Duration::from_secs(20), delivered)
            .await;
    }
    let tokens = rx.requests("token");
    assert_eq!(tokens.len(), 1, "one token for three deliveries");
    let basic = base64::engine::general_purpose::STANDARD.encode("hooks:cs-secret-1");
    assert_eq!(tokens[0].headers["authorization"], format!("Basic {basic}"));
    assert_eq!(
        tokens[0].headers["content-type"],
        "application/x-www-form-urlencoded"
    );
    assert_eq!(
        tokens[0].body,
        "grant_type=client_credentials&scope=webhooks"
    );
    let sent = rx.requests("protected");
    assert_eq!(sent.len(), 3);
    assert!(sent
        .iter()
        .all(|r| r.headers["authorization"] == "Bearer tok-1"));

    // After it expires (5 s, renewed half a second early) a new token is
    // fetched; the receiver refuses it once, so a third one is fetched and
    // the retry gets through.
    tokio::time::sleep(Duration::from_millis(4_700)).await;
    let id = svc.publish("order.created").await.remove(0);
    let d = svc
        .wait_delivery(&id, Duration::from_secs(20), delivered)
        .await;
    assert_eq!(results(&d), ["failed:401", "delivered:200"], "{d}");
    assert_eq!(rx.requests("token").len(), 3);
    let last: Vec<String> = rx
        .requests("protected")
        .iter()
        .skip(3)
        .map(|r| r.headers["authorization"].clone())
        .collect();
    assert_eq!(last, ["Bearer tok-2", "Bearer tok-3"]);
    let log = svc.log();
    assert!(
        !log.contains("cs-secret-1") && !log.contains("tok-"),
        "{log}"
    );
    drop(svc);
    drop(profile);
}

/// A client certificate's key (mTLS, ADR 0048) is never shown by the API
/// nor logged, at `debug`, while the dispatcher loads it and presents it
/// (here to a receiver that ends every connection: the attempt fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_key_is_never_shown_nor_logged() {
    let key = include_str!("../testdata/mtls/client.key");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let profile = Profile::embedded();
    let svc = Service::start_with(&profile, &[("CONTROLPLANE_LOG", "debug")]);
    let create = |certificate: &str| {
        json!({"url": format!("https://127.0.0.1:{port}/hook"), "client_tls": {
            "certificate": certificate, "key": key}})
    };
    // Refused (the key is not this certificate's): the answer says why,
    // without the key.
    let (s, v) = svc
        .call(
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(create(include_str!("../testdata/mtls/other.pem"))),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    let (s, v) = svc
        .call(
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(create(include_str!("../testdata/mtls/client.pem"))),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert!(v["client_tls"]["subject"].is_string(), "{v}");
    let id = svc.publish("order.created").await.remove(0);
    let d = svc
        .wait_delivery(&id, Duration::from_secs(20), |d| {
            !d["attempt_log"].as_array().unwrap().is_empty()
        })
        .await;
    assert_ne!(d["state"], "delivered", "{d}");
    let log = svc.log();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!log.contains(line), "the key is in the log: {log}");
        assert!(!d.to_string().contains(line), "{d}");
        assert!(!v.to_string().contains(line), "{v}");
    }
    drop(svc);
    drop(profile);
}

/// A `worker` given `CONTROLPLANE_LISTEN` answers `/healthz` and `/readyz`
/// there (an orchestrator's probes), and nothing of the API.
#[tokio::test]
async fn a_worker_serves_its_probes_on_the_listen_address() {
    let schema = Schema::new("cp_probes");
    let worker = Process::start(
        env!("CARGO_BIN_EXE_control-plane"),
        "worker",
        &schema.env(2),
    );
    let base = worker
        .probes()
        .unwrap_or_else(|| panic!("no probes address in the ready line:\n{}", worker.log()));
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{base}{path}")).send();
    let health = get("/healthz").await.unwrap();
    assert_eq!(health.status(), 200);
    let body: Value = serde_json::from_str(&health.text().await.unwrap()).unwrap();
    assert_eq!(body["status"], "ok");
    let ready = get("/readyz").await.unwrap();
    assert_eq!(ready.status(), 200);
    let body: Value = serde_json::from_str(&ready.text().await.unwrap()).unwrap();
    assert_eq!(body["store"], "postgres");
    assert_eq!(get("/v1/openapi.json").await.unwrap().status(), 404);
    assert_eq!(get("/metrics").await.unwrap().status(), 404);
}
