//! Helpers of the API's and the dashboard's tests (the dashboard's include
//! this file): the router in process over an embedded store, and requests
//! to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use api::{router, ApiConfig, ApiState};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane_core::{DynControlPlaneStore, SystemClock};
use control_plane_runtime::UsageMeter;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

pub const ADMIN: &str = "cpa_test_admin";

pub struct Api {
    pub app: axum::Router,
    pub store: DynControlPlaneStore,
    _dir: tempfile::TempDir,
}

/// The API over a new embedded store, serving `pages` beside it (the
/// dashboard, or `Router::new()`).
pub async fn api_with(pages: axum::Router<Arc<ApiState>>) -> Api {
    api_configured(pages, |_| ()).await
}

/// [`api_with`], with the API's configuration changed by `configure`.
pub async fn api_configured(
    pages: axum::Router<Arc<ApiState>>,
    configure: impl FnOnce(&mut ApiConfig),
) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store: DynControlPlaneStore = Arc::new(
        store_embedded::EmbeddedStore::open(
            store_embedded::EmbeddedConfig::new(dir.path().join("api.duckdb")),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    let mut config = ApiConfig::new(ADMIN);
    config.body_limit = 64 * 1024;
    configure(&mut config);
    let app = router(
        store.clone(),
        &config,
        Arc::new(api::Metrics::default()),
        Arc::new(UsageMeter::default()),
        pages,
    );
    Api {
        app,
        store,
        _dir: dir,
    }
}

pub struct Call<'a> {
    pub method: &'a str,
    pub path: String,
    pub token: Option<&'a str>,
    pub body: Option<String>,
    pub content_type: &'a str,
    pub headers: Vec<(&'a str, &'a str)>,
    pub client: Option<&'a str>,
}

pub fn call<'a>(method: &'a str, path: impl Into<String>) -> Call<'a> {
    Call {
        method,
        path: path.into(),
        token: Some(ADMIN),
        body: None,
        content_type: "application/json",
        headers: vec![],
        client: None,
    }
}

impl<'a> Call<'a> {
    pub fn token(mut self, t: Option<&'a str>) -> Self {
        self.token = t;
        self
    }
    pub fn json(mut self, v: Value) -> Self {
        self.body = Some(v.to_string());
        self
    }
    pub fn raw(mut self, body: impl Into<String>, content_type: &'a str) -> Self {
        self.body = Some(body.into());
        self.content_type = content_type;
        self
    }
    pub fn header(mut self, k: &'a str, v: &'a str) -> Self {
        self.headers.push((k, v));
        self
    }
    /// The client address the server sees (as `serve` gives it).
    pub fn from(mut self, addr: &'a str) -> Self {
        self.client = Some(addr);
        self
    }
    pub async fn send(self, api: &Api) -> (StatusCode, Value) {
        self.send_full(api).await.0
    }
    pub async fn send_full(self, api: &Api) -> ((StatusCode, Value), axum::http::HeaderMap) {
        let mut b = Request::builder().method(self.method).uri(&self.path);
        if let Some(addr) = self.client {
            let addr: std::net::SocketAddr = addr.parse().unwrap();
            b = b.extension(axum::extract::ConnectInfo(addr));
        }
        if let Some(t) = self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in &self.headers {
            b = b.header(*k, *v);
        }
        let req = match self.body {
            Some(body) if self.content_type.is_empty() => b.body(Body::from(body)).unwrap(),
            Some(body) => b
                .header("content-type", self.content_type)
                .body(Body::from(body))
                .unwrap(),
            None => b.body(Body::empty()).unwrap(),
        };
        let resp = api.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let ct = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        if status.is_client_error() || status.is_server_error() {
            assert_eq!(
                ct.as_deref(),
                Some("application/json"),
                "error content type"
            );
        }
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        ((status, v), headers)
    }
}

pub fn assert_error(v: &Value, code: &str) {
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

pub async fn create_endpoint(api: &Api, account: &str) -> Value {
    let (s, v) = call("POST", format!("/v1/accounts/{account}/endpoints"))
        .json(json!({"url": "https://example.com/hook", "event_types": ["order.paid"]}))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

/// A raw dashboard request: (status, headers, body as text).
pub async fn ui(
    api: &Api,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<String>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(c) = cookie {
        b = b.header("cookie", c);
    }
    let req = match form {
        Some(f) => b
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(f))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    let resp = api.app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Signs in with `token`; the session cookie (`cp_session=<id>`).
pub async fn sign_in(api: &Api, token: &str) -> String {
    let (s, h, body) = ui(
        api,
        "POST",
        "/ui/login",
        None,
        Some(format!("token={token}")),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{body}");
    let set = h["set-cookie"].to_str().unwrap();
    assert!(
        set.contains("HttpOnly")
            && set.contains("SameSite=Strict")
            && set.contains("Max-Age=43200"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
}

/// The CSRF token a dashboard page carries in its forms.
pub fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token on the page: {page}"))
        .to_string()
}
