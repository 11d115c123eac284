//! The dashboard in a real browser: Debian's headless Chromium driven over
//! WebDriver (`chromedriver`) against the real binary on the embedded
//! profile. Signs in, watches a delivery fail and then succeed, replays a
//! dead letter (one, then in bulk), retries a dead task, checks that a
//! payload holding `<script>` is shown as text and that an account key
//! cannot open another account's pages. Held deliveries say why, the
//! endpoint page links both ways, the bulk replay asks once more, and every
//! page fits 1280 and 390 px without breaking a state or a button inside a
//! word. A second test checks that the API reference at `/docs` renders.
//! Screenshots of each page go to `<target>/debug/ui-screenshots/`.
//!
//! Needs `chromium` and `chromium-driver` (`apt-get install chromium
//! chromium-driver`; `.ci/run` installs them); fails, never skips, without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use base64::Engine;
use serde_json::{json, Value};
use workspace_tests::{api_call, Answer, Process, Received, Receiver};

const ADMIN: &str = "cpa_browser_admin_token_0123456789abcdef";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// `flaky`: 500 on the first request, then 200; `broken`: always 500.
fn answers() -> Answer {
    std::sync::Arc::new(|r: Received, n: usize| {
        Box::pin(async move {
            match (r.path.as_str(), n) {
                ("flaky", 1) | ("broken", _) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                _ => StatusCode::OK.into_response(),
            }
        })
    })
}

fn which(var: &str, default: &str) -> String {
    let path = std::env::var(var).unwrap_or_else(|_| default.to_string());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: install Debian's chromium and chromium-driver \
         (apt-get install chromium chromium-driver) or set {var}"
    );
    path
}

/// `chromedriver` on a free port, killed on drop.
struct Driver {
    child: Child,
    base: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(http: &reqwest::Client) -> Driver {
        let bin = which("CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let start = Instant::now();
        while http
            .get(format!("{}/status", driver.base))
            .send()
            .await
            .is_err()
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        driver
    }
}

/// One WebDriver session in headless Chromium.
struct Browser {
    http: reqwest::Client,
    session: String,
    shots: PathBuf,
}

impl Browser {
    async fn open(http: reqwest::Client, driver: &Driver) -> Browser {
        let chromium = which("CHROMIUM", "/usr/bin/chromium");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }
        }}});
        let v = send(
            &http,
            "POST",
            &format!("{}/session", driver.base),
            Some(caps),
        )
        .await;
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        // The test binary is <target>/debug/deps/browser-*.
        let shots = std::env::current_exe()
            .unwrap()
            .parent()
            .and_then(|p| p.parent())
            .unwrap()
            .join("ui-screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            session: format!("{}/session/{session}", driver.base),
            http,
            shots,
        }
    }

    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let v = send(&self.http, method, &format!("{}{path}", self.session), body).await;
        v["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    async fn url(&self) -> String {
        self.cmd("GET", "/url", None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self
            .cmd(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e[ELEMENT].as_str().unwrap().to_string())
            .collect()
    }

    async fn find(&self, css: &str) -> String {
        let found = self.find_all(css).await;
        assert!(
            !found.is_empty(),
            "no {css} on {}:\n{}",
            self.url().await,
            self.text("body").await
        );
        found[0].clone()
    }

    async fn text(&self, css: &str) -> String {
        match self.find_all(css).await.first() {
            Some(e) => self
                .cmd("GET", &format!("/element/{e}/text"), None)
                .await
                .as_str()
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        }
    }

    /// Clicks a button that submits a form, and waits until the page it
    /// leads to has replaced this one (a click does not wait for that).
    async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.cmd("POST", &format!("/element/{e}/click"), Some(json!({})))
            .await;
        let start = Instant::now();
        loop {
            let v = self.cmd("GET", &format!("/element/{e}/name"), None).await;
            // "stale element reference" (or "no such element" in some
            // driver versions): the document it was in is gone.
            if v.get("error").is_some() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "clicking {css} led nowhere: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while self
            .cmd(
                "POST",
                "/execute/sync",
                Some(json!({"script": "return document.readyState", "args": []})),
            )
            .await
            != "complete"
        {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the page never loaded"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    async fn screenshot(&self, name: &str) {
        let png = self.cmd("GET", "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), bytes).unwrap();
    }

    /// Reloads `url` until `css` has text containing `want`.
    async fn wait_text(&self, url: &str, css: &str, want: &str) -> String {
        let start = Instant::now();
        loop {
            self.go(url).await;
            let t = self.text(css).await;
            if t.contains(want) {
                return t;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{css} on {url} never showed {want:?}; last: {t:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn sign_in(&self, base: &str, token: &str) {
        self.go(&format!("{base}/ui/login")).await;
        self.type_into("#token", token).await;
        self.click("#sign-in").await;
    }

    async fn script(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Lays pages out `width` px wide (a phone's viewport below 500 px).
    async fn width(&self, width: u32) {
        let params = json!({"width": width, "height": 900, "deviceScaleFactor": 1,
                            "mobile": width < 500});
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": params})),
        )
        .await;
    }

    /// Emulates the browser's dark (or light) colour scheme preference.
    async fn dark(&self, dark: bool) {
        let scheme = if dark { "dark" } else { "light" };
        let params = json!({"features": [{"name": "prefers-color-scheme", "value": scheme}]});
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": params})),
        )
        .await;
    }

    /// Asserts that the page at `url` fits its width (nothing scrolls
    /// sideways) and that no state, button, time or heading breaks inside
    /// a word (its text on more than one line); saves a screenshot.
    async fn check_layout(&self, url: &str, shot: &str) {
        self.go(url).await;
        let fit = self
            .script("return [document.documentElement.scrollWidth, window.innerWidth]")
            .await;
        let (scroll, inner) = (fit[0].as_u64().unwrap(), fit[1].as_u64().unwrap());
        assert!(
            scroll <= inner,
            "{url} is {scroll} px wide in a {inner} px window"
        );
        let broken = self
            .script(
                "return [...document.querySelectorAll('.st, button, time, th, .nowrap, .card .label')]\
                 .filter(e => { const r = document.createRange(); r.selectNodeContents(e); \
                   const tops = [...r.getClientRects()].map(x => Math.round(x.top)); \
                   return tops.some(t => Math.abs(t - tops[0]) > 4); })\
                 .map(e => e.outerHTML.slice(0, 120))",
            )
            .await;
        assert_eq!(
            broken,
            json!([]),
            "{url} at {inner} px breaks these inside: {broken}"
        );
        self.screenshot(&format!("{shot}-{inner}")).await;
    }

    async fn close(&self) {
        self.cmd("DELETE", "", None).await;
    }
}

async fn send(http: &reqwest::Client, method: &str, url: &str, body: Option<Value>) -> Value {
    let mut req = http.request(method.parse().unwrap(), url);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let bytes = r.bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// The service's API as the admin.
async fn api(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    api_call(http, base, ADMIN, method, path, body).await
}

async fn wait_api(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let (_, v) = api(http, base, "GET", path, None).await;
        if done(&v) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{path} never got there: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let driver = Driver::start(&http).await;
    let (_receiver, hooks) = Receiver::start(answers()).await;
    let dir = tempfile::tempdir().unwrap();
    let service = Process::start(
        env!("CARGO_BIN_EXE_control-plane"),
        "serve",
        &[
            (
                "CONTROLPLANE_EMBEDDED_PATH",
                dir.path().join("ui.duckdb").to_string_lossy().into_owned(),
            ),
            ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
            ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
            ("CONTROLPLANE_RETRY_SCHEDULE", "1s".to_string()),
            ("CONTROLPLANE_LEASE", "4s".to_string()),
        ],
    );
    let base = service.api();

    // Two endpoints of acme, one of another account, keys for both.
    let (mut ids, mut secrets) = (Vec::new(), Vec::new());
    for path in ["flaky", "broken"] {
        let (s, v) = api(
            &http,
            &base,
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(
                json!({"url": format!("{hooks}/{path}"), "description": format!("the {path} one")}),
            ),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
        let secret = v["secret"].as_str().unwrap().to_string();
        assert!(secret.starts_with("whsec_"), "{v}");
        secrets.push(secret);
    }
    let (s, _) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/other/endpoints",
        Some(json!({"url": format!("{hooks}/ok"), "description": "other-secret-endpoint"})),
    )
    .await;
    assert_eq!(s, 201);
    let (_, key) = api(&http, &base, "POST", "/v1/accounts/acme/keys", None).await;
    let acme_key = key["key"].as_str().unwrap().to_string();

    // One event, to both endpoints, with markup in its payload.
    let (s, published) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/events",
        Some(json!({"type": "order.created", "payload": {"note": "<script>alert(1)</script>"}})),
    )
    .await;
    assert_eq!(s, 202, "{published}");
    let deliveries: Vec<String> = published["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    let mut flaky = None;
    let mut broken = None;
    for d in &deliveries {
        let (_, v) = api(
            &http,
            &base,
            "GET",
            &format!("/v1/accounts/acme/deliveries/{d}"),
            None,
        )
        .await;
        if v["endpoint_id"] == ids[0] {
            flaky = Some(d.clone());
        } else {
            broken = Some(d.clone());
        }
    }
    let (flaky, broken) = (flaky.unwrap(), broken.unwrap());
    // A task whose payload the publish handler refuses: dead at once.
    let (s, _) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/tasks",
        Some(json!({"id": "nightly/report", "kind": "control-plane.publish", "payload": {"nope": 1}})),
    )
    .await;
    assert_eq!(s, 201);

    let browser = Browser::open(http.clone(), &driver).await;

    // Signing in with a wrong token stays on the sign-in page.
    browser.sign_in(&base, "cpk_not_a_real_key").await;
    let error = browser.text("#error").await;
    assert!(
        error.contains("not valid"),
        "{}: {error:?} {}",
        browser.url().await,
        browser.text("body").await
    );

    // The admin signs in, picks the account, sees the overview.
    browser.sign_in(&base, ADMIN).await;
    assert!(
        browser.url().await.ends_with("/ui"),
        "{}",
        browser.url().await
    );
    browser.type_into("#account", "acme").await;
    browser.click("#open-account").await;
    assert!(browser.url().await.ends_with("/ui/a/acme"));
    let acme = format!("{base}/ui/a/acme");

    // The flaky delivery fails once, then succeeds: both on its page.
    let page = format!("{acme}/deliveries/{flaky}");
    browser.wait_text(&page, "#fact-state", "delivered").await;
    let attempts = browser.text("#attempts").await;
    assert!(
        attempts.contains("failed") && attempts.contains("500"),
        "{attempts}"
    );
    assert!(
        attempts.contains("delivered") && attempts.contains("200"),
        "{attempts}"
    );
    // The payload's markup is text: shown literally, never a script element.
    let request = browser.text("#request").await;
    assert!(request.contains("<script>alert(1)</script>"), "{request}");
    assert!(
        request.contains(&format!("webhook-id: {flaky}")),
        "{request}"
    );
    assert!(browser.find_all("script").await.is_empty());
    // The signing secrets the API returned once are on no page (the
    // signature, made with one, is).
    let whole = browser.text("body").await;
    for secret in &secrets {
        let key = secret.trim_start_matches("whsec_");
        assert!(
            !whole.contains(key),
            "a signing secret on the delivery page"
        );
    }
    assert!(
        request.contains("webhook-signature: v1,"),
        "the request shows its signature: {request}"
    );
    browser.screenshot("delivery").await;

    // The broken one dies; replay it from its row on the dead-letter page.
    wait_api(
        &http,
        &base,
        &format!("/v1/accounts/acme/deliveries/{broken}"),
        |v| v["state"] == "dead",
    )
    .await;
    browser
        .wait_text(&format!("{acme}/dead"), "#dead", &broken)
        .await;
    browser.screenshot("dead-letters").await;
    browser.click(&format!("#replay-{broken}")).await;
    assert!(browser.text("#notice").await.contains("Replayed"));
    // A fresh budget: a third attempt follows, then it dies again.
    wait_api(
        &http,
        &base,
        &format!("/v1/accounts/acme/deliveries/{broken}"),
        |v| v["state"] == "dead" && v["attempt_log"].as_array().is_some_and(|a| a.len() == 4),
    )
    .await;
    // Bulk replay of everything dead: it says what it will do and asks
    // once more.
    browser.go(&format!("{acme}/dead")).await;
    browser.click("#replay-all").await;
    assert_eq!(
        browser.text("#replay-summary").await,
        "Replay 1 dead delivery of 1 endpoint?"
    );
    browser.screenshot("replay-confirmation").await;
    browser.click("#confirm-replay").await;
    assert_eq!(browser.text("#notice").await, "Replayed 1 dead deliveries.");
    wait_api(
        &http,
        &base,
        &format!("/v1/accounts/acme/deliveries/{broken}"),
        |v| v["attempt_log"].as_array().is_some_and(|a| a.len() >= 5),
    )
    .await;

    // Its fifth failure in a row opened the broken endpoint's circuit: the
    // delivery says it is held until the next probe, and the overview
    // counts it as held.
    let state = browser
        .wait_text(
            &format!("{acme}/deliveries/{broken}"),
            "#fact-state",
            "circuit open",
        )
        .await;
    assert!(state.starts_with("held"), "{state}");
    browser.go(&acme).await;
    assert_eq!(browser.text("#count-held").await, "1");
    // A disabled endpoint holds its deliveries and says why.
    let (s, paused) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/endpoints",
        Some(json!({"url": format!("{hooks}/paused"), "event_types": ["order.paused"]})),
    )
    .await;
    assert_eq!(s, 201, "{paused}");
    let paused = paused["id"].as_str().unwrap().to_string();
    let (s, _) = api(
        &http,
        &base,
        "POST",
        &format!("/v1/accounts/acme/endpoints/{paused}/disable"),
        Some(json!({"reason": "paused for the test"})),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/events",
        Some(json!({"type": "order.paused", "payload": {}})),
    )
    .await;
    assert_eq!(s, 202);
    browser
        .go(&format!("{acme}/deliveries?state=pending"))
        .await;
    let listed = browser.text("#deliveries").await;
    assert!(
        listed.contains("held endpoint disabled: paused for the test"),
        "{listed}"
    );

    // The endpoint page: reached from the endpoints list, it links to its
    // deliveries, which link back.
    browser.go(&format!("{acme}/endpoints")).await;
    browser
        .click(&format!("a.url[href='/ui/a/acme/endpoints/{}']", ids[0]))
        .await;
    assert_eq!(browser.text("#fact-id").await, ids[0]);
    browser.click("#endpoint-deliveries").await;
    let active = browser.text("#active-filters").await;
    assert!(active.contains("/flaky"), "{active}");
    assert!(browser.text("#deliveries").await.contains(&flaky));
    browser.go(&format!("{acme}/deliveries/{flaky}")).await;
    browser.click("#fact-endpoint a").await;
    assert!(browser
        .url()
        .await
        .ends_with(&format!("/endpoints/{}", ids[0])));

    // Every page fits a wide screen and a phone, and no state or button
    // breaks inside a word.
    let pages = [
        ("overview", acme.clone()),
        ("endpoints", format!("{acme}/endpoints")),
        ("endpoint", format!("{acme}/endpoints/{}", ids[1])),
        ("deliveries", format!("{acme}/deliveries")),
        ("delivery", format!("{acme}/deliveries/{broken}")),
        ("dead-letters", format!("{acme}/dead")),
        ("attempts", format!("{acme}/attempts")),
        ("alerts", format!("{acme}/alerts")),
        ("event-types", format!("{acme}/event-types")),
        ("tasks", format!("{acme}/tasks")),
    ];
    for width in [1280, 390] {
        browser.width(width).await;
        for (shot, url) in &pages {
            browser.check_layout(url, shot).await;
        }
    }
    browser.width(1280).await;
    // The browser's dark mode darkens the pages (no script, the stylesheet's
    // media query); the layout holds there too.
    browser.dark(true).await;
    for (shot, url) in &pages[..4] {
        browser.check_layout(url, &format!("{shot}-dark")).await;
    }
    let background = browser
        .script("return getComputedStyle(document.body).backgroundColor")
        .await;
    assert_eq!(background, "rgb(12, 17, 29)", "dark mode");
    browser.dark(false).await;

    // The overview counts, the endpoints page, the dead task and its retry.
    // (The flaky endpoint takes every type: by now it has also received the
    // alert of the broken endpoint's circuit opening.)
    browser.go(&acme).await;
    let delivered: u64 = browser.text("#count-delivered").await.parse().unwrap();
    assert!((1..=2).contains(&delivered), "{delivered}");
    browser.screenshot("overview").await;
    browser.go(&format!("{acme}/endpoints")).await;
    let endpoints = browser.text("#endpoints").await;
    assert!(
        endpoints.contains("the flaky one") && endpoints.contains("closed"),
        "{endpoints}"
    );
    assert!(!endpoints.contains("other-secret-endpoint"));
    let whole = browser.text("body").await;
    for secret in &secrets {
        let key = secret.trim_start_matches("whsec_");
        assert!(
            !whole.contains(key),
            "a signing secret on the endpoints page"
        );
    }
    browser.screenshot("endpoints").await;
    browser
        .wait_text(&format!("{acme}/tasks"), "#dead-tasks", "nightly/report")
        .await;
    browser.screenshot("tasks").await;
    browser.click("#retry-nightly\\/report").await;
    assert!(browser.text("#notice").await.contains("Retried"));
    assert!(browser.text("#task").await.contains("nightly/report"));

    // The catalogue: a registered type, its schema escaped, and its example
    // sent to the flaky endpoint from the page.
    let (s, v) = api(
        &http,
        &base,
        "PUT",
        "/v1/accounts/acme/event-types/order.created",
        Some(json!({
            "description": "An order was placed <b>now</b>",
            "schema": {"type": "object", "properties": {"note": {"type": "string"}}},
            "example": {"note": "example order"}
        })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    browser.go(&format!("{acme}/event-types")).await;
    let catalogue = browser.text("#event-types").await;
    assert!(
        catalogue.contains("An order was placed <b>now</b>") && catalogue.contains("\"note\""),
        "{catalogue}"
    );
    browser.screenshot("event-types").await;
    // A select holding the longest URL no longer widens the page.
    browser.width(390).await;
    browser
        .check_layout(&format!("{acme}/event-types"), "event-types-registered")
        .await;
    browser.width(1280).await;
    browser.click("#send-example-order\\.created").await;
    assert!(
        browser.url().await.contains("/ui/a/acme/deliveries/"),
        "{}",
        browser.url().await
    );
    browser
        .wait_text(&browser.url().await, "body", "example order")
        .await;

    // Sign out; the pages need a session again.
    browser.click(".signout button").await;
    browser.go(&acme).await;
    assert!(browser.url().await.ends_with("/ui/login"));

    // An account key sees its own account only.
    browser.sign_in(&base, &acme_key).await;
    assert!(
        browser.url().await.ends_with("/ui/a/acme"),
        "{}",
        browser.url().await
    );
    for page in ["", "/endpoints", "/event-types", "/dead", "/tasks"] {
        browser.go(&format!("{base}/ui/a/other{page}")).await;
        assert!(
            browser.text("#error").await.contains("not found"),
            "other{page}"
        );
        assert!(!browser.text("body").await.contains("other-secret-endpoint"));
    }
    browser.close().await;
    drop(driver);

    // Outside the browser: the cookie's attributes, the headers, and a
    // POST without the session's CSRF token.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirects
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let r = no_redirects
        .get(format!("{base}/ui/a/acme"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("unsafe"),
        "{csp}"
    );
    for csrf in ["", "csrf=0123456789abcdef0123456789abcdef"] {
        let r = no_redirects
            .post(format!("{base}/ui/a/acme/dead/replay"))
            .header("cookie", &session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(csrf)
            .send()
            .await
            .unwrap();
        assert!(
            matches!(r.status().as_u16(), 403 | 422),
            "{csrf:?}: {}",
            r.status()
        );
    }
    let r = no_redirects
        .post(format!("{base}/ui/login"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a sign-in posted from another site");
}

/// The interactive API reference at `/docs` renders the document's routes
/// in the browser, from assets the binary serves itself: the page names no
/// other origin, and its policy lets scripts come from this one only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reference_renders_in_a_real_browser() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let driver = Driver::start(&http).await;
    let dir = tempfile::tempdir().unwrap();
    let service = Process::start(
        env!("CARGO_BIN_EXE_control-plane"),
        "serve",
        &[
            (
                "CONTROLPLANE_EMBEDDED_PATH",
                dir.path()
                    .join("docs.duckdb")
                    .to_string_lossy()
                    .into_owned(),
            ),
            ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ],
    );
    let base = service.api();
    let page = http.get(format!("{base}/docs/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    for external in ["http://", "https://", "//cdn", "unpkg", "jsdelivr"] {
        assert!(
            !html.contains(&format!("src=\"{external}"))
                && !html.contains(&format!("href=\"{external}")),
            "/docs loads {external}: {html}"
        );
    }

    let browser = Browser::open(http.clone(), &driver).await;
    let paths = browser
        .wait_text(
            &format!("{base}/docs/"),
            ".swagger-ui",
            "/v1/accounts/{account}/endpoints",
        )
        .await;
    for route in ["/v1/accounts/{account}/events", "/healthz"] {
        assert!(paths.contains(route), "{route} is not on /docs: {paths}");
    }
    browser.screenshot("docs").await;
    browser.close().await;
}

/// Creates a portal link of acme; (its id, its `/portal/{token}` URL).
async fn portal_link(http: &reqwest::Client, base: &str, body: Value) -> (String, String) {
    let (s, v) = api(
        http,
        base,
        "POST",
        "/v1/accounts/acme/portal-links",
        Some(body),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let token = v["token"].as_str().unwrap();
    (
        v["id"].as_str().unwrap().to_string(),
        format!("{base}/portal/{token}"),
    )
}

/// Issue 75's portal in a real browser (ADR 0049): a revoked link and an
/// expired one open nothing; a viewer sees no manager's button and a
/// manager's action forged into its page is refused; a manager disables
/// an endpoint; revoking the manager's link ends its session at the next
/// page; the portal's pages fit 1280 and 390 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_works_in_a_real_browser() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let driver = Driver::start(&http).await;
    let dir = tempfile::tempdir().unwrap();
    let service = Process::start(
        env!("CARGO_BIN_EXE_control-plane"),
        "serve",
        &[
            (
                "CONTROLPLANE_EMBEDDED_PATH",
                dir.path()
                    .join("portal.duckdb")
                    .to_string_lossy()
                    .into_owned(),
            ),
            ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ],
    );
    let base = service.api();
    let (s, v) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/endpoints",
        Some(json!({"url": "https://example.com/orders", "description": "orders"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let endpoint = v["id"].as_str().unwrap().to_string();
    let (s, _) = api(
        &http,
        &base,
        "POST",
        "/v1/accounts/acme/events",
        Some(json!({"type": "order.created", "payload": {"n": 1}})),
    )
    .await;
    assert_eq!(s, 202);
    let browser = Browser::open(http.clone(), &driver).await;

    // A revoked link and an expired one open nothing.
    let (revoked, revoked_url) = portal_link(&http, &base, json!({"role": "manager"})).await;
    let (s, _) = api(
        &http,
        &base,
        "DELETE",
        &format!("/v1/accounts/acme/portal-links/{revoked}"),
        None,
    )
    .await;
    assert_eq!(s, 204);
    let (_, expired_url) =
        portal_link(&http, &base, json!({"role": "manager", "expires_in_s": 1})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for url in [&revoked_url, &expired_url] {
        browser.go(url).await;
        let text = browser.text("#error").await;
        assert!(text.contains("has expired or was revoked"), "{url}: {text}");
        assert!(browser.find_all("#open").await.is_empty());
    }
    browser.screenshot("portal-spent").await;

    // A viewer: no manager's button; a manager's action forged into the
    // page (with the session's own CSRF token) is refused.
    let (_, viewer_url) = portal_link(&http, &base, json!({"role": "viewer"})).await;
    browser.go(&viewer_url).await;
    browser.click("#open").await;
    assert!(browser.url().await.ends_with("/portal/endpoints"));
    assert_eq!(browser.text("#role").await, "viewer");
    browser
        .go(&format!("{base}/portal/endpoints/{endpoint}"))
        .await;
    assert!(browser.find_all("#disable").await.is_empty());
    browser
        .script(&format!(
            "const f = document.createElement('form'); f.method = 'post'; \
             f.action = '/portal/endpoints/{endpoint}/disable'; \
             f.innerHTML = '<input type=hidden name=csrf value=\"' + \
               document.querySelector('input[name=csrf]').value + \
               '\"><button id=forged>Disable</button>'; \
             document.querySelector('main').append(f); return 1"
        ))
        .await;
    browser.click("#forged").await;
    let refused = browser.text("#error").await;
    assert!(refused.contains("view only"), "{refused}");
    let (_, e) = api(
        &http,
        &base,
        "GET",
        &format!("/v1/accounts/acme/endpoints/{endpoint}"),
        None,
    )
    .await;
    assert_eq!(e["enabled"], true, "{e}");

    // A manager disables the endpoint.
    let (manager, manager_url) = portal_link(&http, &base, json!({"role": "manager"})).await;
    browser.go(&manager_url).await;
    browser.click("#open").await;
    assert_eq!(browser.text("#role").await, "manager");
    for (path, shot) in [
        ("/portal/endpoints".to_string(), "portal-endpoints"),
        (format!("/portal/endpoints/{endpoint}"), "portal-endpoint"),
        ("/portal/deliveries".to_string(), "portal-deliveries"),
        ("/portal/attempts".to_string(), "portal-attempts"),
        ("/portal/event-types".to_string(), "portal-event-types"),
    ] {
        for width in [1280, 390] {
            browser.width(width).await;
            browser.check_layout(&format!("{base}{path}"), shot).await;
        }
    }
    browser.width(1280).await;
    browser
        .go(&format!("{base}/portal/endpoints/{endpoint}"))
        .await;
    browser.click("#disable").await;
    assert!(browser.text("#notice").await.contains("disabled"));
    let (_, e) = api(
        &http,
        &base,
        "GET",
        &format!("/v1/accounts/acme/endpoints/{endpoint}"),
        None,
    )
    .await;
    assert_eq!(e["enabled"], false, "{e}");
    // The operator's pages stay closed to the portal's session.
    browser.go(&format!("{base}/ui/a/acme")).await;
    assert!(browser.url().await.ends_with("/ui/login"));

    // Revoking the manager's link ends its session at the next page.
    let (s, _) = api(
        &http,
        &base,
        "DELETE",
        &format!("/v1/accounts/acme/portal-links/{manager}"),
        None,
    )
    .await;
    assert_eq!(s, 204);
    browser.go(&format!("{base}/portal/endpoints")).await;
    assert!(browser.text("#ended").await.contains("has ended"));
    browser.screenshot("portal-ended").await;
    browser.close().await;
}
