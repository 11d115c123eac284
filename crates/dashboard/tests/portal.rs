//! Issue 75's portal links (ADR 0049), in process over the embedded store:
//! the API that creates, lists and revokes them, the one-time redemption
//! behind a confirmation page, what a portal session reaches (its link's
//! account and endpoints, never another account's, never an operator's
//! page), the viewer's and the manager's roles, revocation and expiry, and
//! the framing setting.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use axum::http::StatusCode;
use control_plane_core::{
    AccountId, AttemptReport, ClaimRequest, Clock, DeliveryId, DeliveryOutcome, EndpointId,
    SystemClock,
};
use serde_json::{json, Value};

#[path = "../../api/tests/support/mod.rs"]
mod support;
use support::{assert_error, call, create_endpoint, csrf_of, sign_in, ui, Api, ADMIN};

async fn api() -> Api {
    support::api_with(dashboard::router()).await
}

/// A key of `account`.
async fn key(api: &Api, account: &str) -> String {
    let (s, v) = call("POST", format!("/v1/accounts/{account}/keys"))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["key"].as_str().unwrap().to_string()
}

/// A portal link of acme made with `token` (the answer).
async fn link(api: &Api, token: &str, body: Value) -> Value {
    let (s, v) = call("POST", "/v1/accounts/acme/portal-links")
        .token(Some(token))
        .json(body)
        .send(api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

/// Redeems the link of `token` through its confirmation page: the
/// portal's session cookie (`cp_portal=<id>`).
async fn open(api: &Api, token: &str) -> String {
    let path = format!("/portal/{token}");
    let (s, _, page) = ui(api, "GET", &path, None, None).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("id=\"open\""), "{page}");
    let (s, h, page) = ui(api, "POST", &path, None, Some(String::new())).await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(h["location"], "/portal/endpoints");
    let set = h["set-cookie"].to_str().unwrap();
    assert!(
        set.starts_with("cp_portal=")
            && set.contains("Path=/portal")
            && set.contains("HttpOnly")
            && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
}

async fn get(api: &Api, cookie: &str, path: &str) -> (StatusCode, String) {
    let (s, _, page) = ui(api, "GET", path, Some(cookie), None).await;
    (s, page)
}

/// Posts `form` (with the page's CSRF token) to `path`.
async fn post(api: &Api, cookie: &str, csrf: &str, path: &str, form: &str) -> (StatusCode, String) {
    let body = format!("csrf={csrf}{form}");
    let (s, h, page) = ui(api, "POST", path, Some(cookie), Some(body)).await;
    let to = h
        .get("location")
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    (s, format!("{to}{page}"))
}

/// Publishes one event to acme; its deliveries.
async fn publish(api: &Api, account: &str) -> Vec<String> {
    let (s, v) = call("POST", format!("/v1/accounts/{account}/events"))
        .json(json!({"type": "order.paid", "payload": {"n": 1}}))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    v["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn portal_links_are_created_listed_and_revoked_through_the_api() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = create_endpoint(&api, "other").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let acme_key = key(&api, "acme").await;
    let v = link(
        &api,
        &acme_key,
        json!({"role": "viewer", "endpoints": [e], "expires_in_s": 3600}),
    )
    .await;
    let token = v["token"].as_str().unwrap();
    assert!(token.starts_with("cpp_") && token.len() == 68, "{v}");
    assert_eq!(
        (v["role"].as_str(), v["account"].as_str()),
        (Some("viewer"), Some("acme"))
    );
    assert_eq!(v["endpoints"], json!([e]));
    let id = v["id"].as_str().unwrap().to_string();
    let admin = link(&api, ADMIN, json!({"role": "manager"})).await;
    assert_eq!(admin["endpoints"], json!([]), "every endpoint");
    for (body, code) in [
        (json!({"role": "owner"}), "invalid_input"),
        (
            json!({"role": "viewer", "expires_in_s": 0}),
            "invalid_input",
        ),
        (
            json!({"role": "viewer", "expires_in_s": 7 * 86_400 + 1}),
            "invalid_input",
        ),
        (
            json!({"role": "viewer", "endpoints": [other]}),
            "invalid_input",
        ),
        (
            json!({"role": "viewer", "endpoints": ["nope"]}),
            "invalid_input",
        ),
    ] {
        let (s, v) = call("POST", "/v1/accounts/acme/portal-links")
            .json(body.clone())
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert_error(&v, code);
    }
    // Another account's key reaches nothing of acme's links.
    let other_key = key(&api, "other").await;
    for (method, path) in [
        ("GET", "/v1/accounts/acme/portal-links".to_string()),
        ("POST", "/v1/accounts/acme/portal-links".to_string()),
        ("DELETE", format!("/v1/accounts/acme/portal-links/{id}")),
    ] {
        let (s, v) = call(method, path.clone())
            .token(Some(&other_key))
            .json(json!({"role": "manager"}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {v}");
    }
    let (s, v) = call("DELETE", format!("/v1/accounts/other/portal-links/{id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, v) = call("GET", "/v1/accounts/acme/portal-links")
        .token(Some(&acme_key))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["items"].as_array().unwrap().len(), 2, "{v}");
    assert!(
        !v.to_string().contains("cpp_"),
        "a listing never shows a token: {v}"
    );
    let (s, _) = call("DELETE", format!("/v1/accounts/acme/portal-links/{id}"))
        .token(Some(&acme_key))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, v) = call("GET", "/v1/accounts/acme/portal-links")
        .send(&api)
        .await;
    let revoked = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == id.as_str())
        .unwrap();
    assert!(revoked["revoked_at"].is_string(), "{v}");
    let (s, _, page) = ui(&api, "GET", &format!("/portal/{token}"), None, None).await;
    assert_eq!(s, StatusCode::GONE, "a revoked link opens nothing: {page}");
}

#[tokio::test]
async fn a_link_opens_once_and_only_from_its_confirmation_page() {
    let api = api().await;
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let token = v["token"].as_str().unwrap();
    // Reading the page (a link preview) changes nothing: it opens twice.
    let (s, _, page) = ui(&api, "GET", &format!("/portal/{token}"), None, None).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("acme") && page.contains("viewer"), "{page}");
    let cookie = open(&api, token).await;
    let (s, page) = get(&api, &cookie, "/portal/endpoints").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    for m in ["GET", "POST"] {
        let (s, _, page) = ui(
            &api,
            m,
            &format!("/portal/{token}"),
            None,
            Some(String::new()),
        )
        .await;
        assert_eq!(s, StatusCode::GONE, "{m} of a used link: {page}");
        assert!(
            page.contains("already used") && page.contains("href=\"/portal\""),
            "{page}"
        );
        assert!(!page.contains("/ui/logout"), "{page}");
    }
    // A redemption from another site is refused and burns nothing.
    let fresh = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let fresh = fresh["token"].as_str().unwrap();
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("/portal/{fresh}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "cross-site")
        .body(axum::body::Body::empty())
        .unwrap();
    let s = tower::ServiceExt::oneshot(api.app.clone(), req)
        .await
        .unwrap()
        .status();
    assert_eq!(s, StatusCode::FORBIDDEN);
    open(&api, fresh).await;
    // Junk tokens open nothing.
    let (s, _, _) = ui(&api, "GET", "/portal/cpp_nothing", None, None).await;
    assert_eq!(s, StatusCode::GONE);
}

#[tokio::test]
async fn a_portal_session_reaches_only_its_links_endpoints_and_no_operator_page() {
    let api = api().await;
    let shown = create_endpoint(&api, "acme").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let hidden = create_endpoint(&api, "acme").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let theirs = create_endpoint(&api, "other").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let acme = publish(&api, "acme").await;
    let others = publish(&api, "other").await;
    let (mut shown_d, mut hidden_d) = (None, None);
    for d in &acme {
        if api_delivery_endpoint(&api, d.parse().unwrap()).await == shown {
            shown_d = Some(d.clone());
        } else {
            hidden_d = Some(d.clone());
        }
    }
    let (shown_d, hidden_d) = (shown_d.unwrap(), hidden_d.unwrap());
    let v = link(
        &api,
        ADMIN,
        json!({"role": "manager", "endpoints": [shown]}),
    )
    .await;
    let cookie = open(&api, v["token"].as_str().unwrap()).await;
    let (s, page) = get(&api, &cookie, "/portal/endpoints").await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains(&shown) && !page.contains(&hidden), "{page}");
    assert!(
        !page.contains("add-endpoint"),
        "a link of some endpoints adds none: {page}"
    );
    let (s, page) = get(&api, &cookie, &format!("/portal/endpoints/{shown}")).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let (s, page) = get(&api, &cookie, &format!("/portal/deliveries/{shown_d}")).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let (s, page) = get(&api, &cookie, "/portal/deliveries").await;
    assert!(
        s == StatusCode::OK && page.contains(&shown_d) && !page.contains(&hidden_d),
        "{page}"
    );
    let csrf = csrf_of(&page);
    // Outside the link: the account's other endpoint, another account's
    // endpoint and delivery, all as if they did not exist.
    for path in [
        format!("/portal/endpoints/{hidden}"),
        format!("/portal/endpoints/{theirs}"),
        format!("/portal/deliveries/{hidden_d}"),
        format!("/portal/deliveries/{}", others[0]),
        format!("/portal/deliveries?endpoint={hidden}"),
        format!("/portal/attempts?endpoint={theirs}"),
    ] {
        let (s, page) = get(&api, &cookie, &path).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {page}");
        assert!(!page.contains("/ui/a/"), "{path}: {page}");
    }
    for (path, form) in [
        (format!("/portal/endpoints/{hidden}/disable"), ""),
        (format!("/portal/endpoints/{theirs}/delete"), ""),
        (format!("/portal/deliveries/{hidden_d}/replay"), ""),
        (
            "/portal/endpoints".to_string(),
            "&url=https%3A%2F%2Fexample.com%2Fx",
        ),
    ] {
        let (s, page) = post(&api, &cookie, &csrf, &path, form).await;
        assert!(
            s == StatusCode::NOT_FOUND || s == StatusCode::FORBIDDEN,
            "{path}: {s} {page}"
        );
    }
    let hidden_id: EndpointId = hidden.parse().unwrap();
    let e = api
        .store
        .endpoint_get(&AccountId::new("acme").unwrap(), hidden_id)
        .await
        .unwrap();
    assert!(e.enabled, "nothing outside the link changed");
    // The operator's pages and the API: the portal's cookie opens none,
    // nor does its session id put in the operator's cookie.
    let id = cookie.strip_prefix("cp_portal=").unwrap();
    for c in [cookie.clone(), format!("cp_session={id}")] {
        for path in [
            "/ui",
            "/ui/a/acme",
            "/ui/a/acme/endpoints",
            "/ui/a/other/deliveries",
        ] {
            let (s, h, page) = ui(&api, "GET", path, Some(&c), None).await;
            assert_eq!(s, StatusCode::SEE_OTHER, "{c} {path}: {page}");
            assert_eq!(h["location"], "/ui/login");
        }
        let (s, page) = post(&api, &c, &csrf, "/ui/a/acme/dead/replay", "").await;
        assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    }
    let (s, _) = call("GET", "/v1/accounts/acme/endpoints")
        .token(None)
        .header("cookie", &cookie)
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// The endpoint of delivery `d` of acme or other.
async fn api_delivery_endpoint(api: &Api, d: DeliveryId) -> String {
    for a in ["acme", "other"] {
        if let Ok(d) = api.store.delivery_get(&AccountId::new(a).unwrap(), d).await {
            return d.endpoint_id.to_string();
        }
    }
    panic!("no delivery {d}")
}

#[tokio::test]
async fn revoking_or_expiring_a_link_ends_its_sessions() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    // No session, or a made-up one: nothing.
    let (s, _, page) = ui(&api, "GET", "/portal/endpoints", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{page}");
    let junk = format!("cp_portal={}", "ab".repeat(32));
    assert_eq!(
        get(&api, &junk, "/portal/deliveries").await.0,
        StatusCode::UNAUTHORIZED
    );
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let cookie = open(&api, v["token"].as_str().unwrap()).await;
    assert_eq!(
        get(&api, &cookie, "/portal/endpoints").await.0,
        StatusCode::OK
    );
    let (s, _) = call(
        "DELETE",
        format!(
            "/v1/accounts/acme/portal-links/{}",
            v["id"].as_str().unwrap()
        ),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, h, page) = ui(&api, "GET", "/portal/endpoints", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{page}");
    assert!(page.contains("has ended"), "{page}");
    assert!(h["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    // A short link: its session ends with it, and unused it opens nothing.
    let used = link(&api, ADMIN, json!({"role": "viewer", "expires_in_s": 1})).await;
    let unused = link(&api, ADMIN, json!({"role": "viewer", "expires_in_s": 1})).await;
    let cookie = open(&api, used["token"].as_str().unwrap()).await;
    assert_eq!(
        get(&api, &cookie, "/portal/endpoints").await.0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        get(&api, &cookie, "/portal/endpoints").await.0,
        StatusCode::UNAUTHORIZED
    );
    let path = format!("/portal/{}", unused["token"].as_str().unwrap());
    let (s, _, page) = ui(&api, "POST", &path, None, Some(String::new())).await;
    assert_eq!(s, StatusCode::GONE, "{page}");
    // Signing out ends the session too.
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let cookie = open(&api, v["token"].as_str().unwrap()).await;
    let (_, page) = get(&api, &cookie, "/portal/endpoints").await;
    let (s, _) = post(&api, &cookie, &csrf_of(&page), "/portal/logout", "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(
        get(&api, &cookie, "/portal/endpoints").await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// Makes every due delivery of the store dead.
async fn kill_all(api: &Api) {
    let claimed = api
        .store
        .delivery_claim(ClaimRequest::new("w", 100, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    for c in &claimed {
        let report = AttemptReport {
            status_code: Some(400),
            error: Some("HTTP 400".into()),
            latency_ms: 3,
            response_body: None,
        };
        let _ = SystemClock.now();
        api.store
            .delivery_record_outcome(&c.lease, DeliveryOutcome::GiveUp(report))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_viewer_is_refused_a_managers_actions_and_a_manager_may_take_them() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let d = publish(&api, "acme").await.remove(0);
    kill_all(&api).await;
    let acme = AccountId::new("acme").unwrap();
    let eid: EndpointId = e.parse().unwrap();
    let viewer = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let cookie = open(&api, viewer["token"].as_str().unwrap()).await;
    let (_, page) = get(&api, &cookie, &format!("/portal/endpoints/{e}")).await;
    assert!(
        !page.contains("id=\"disable\"") && !page.contains("id=\"save\""),
        "{page}"
    );
    let csrf = csrf_of(&page);
    let (s, page) = get(&api, &cookie, "/portal/endpoints/new").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{page}");
    for (path, form) in [
        (format!("/portal/endpoints/{e}/disable"), String::new()),
        (
            format!("/portal/endpoints/{e}/rotate-secret"),
            String::new(),
        ),
        (format!("/portal/endpoints/{e}/delete"), String::new()),
        (format!("/portal/endpoints/{e}/recover"), "&hours=1".into()),
        (
            format!("/portal/endpoints/{e}/edit"),
            "&url=https%3A%2F%2Fexample.com%2Fz".into(),
        ),
        (format!("/portal/deliveries/{d}/replay"), String::new()),
        (
            "/portal/endpoints".into(),
            "&url=https%3A%2F%2Fexample.com%2Fy".into(),
        ),
    ] {
        let (s, page) = post(&api, &cookie, &csrf, &path, &form).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{path}: {page}");
        assert!(page.contains("view only"), "{page}");
    }
    let e_now = api.store.endpoint_get(&acme, eid).await.unwrap();
    assert!(
        e_now.enabled && e_now.url == "https://example.com/hook",
        "a viewer changed nothing"
    );
    // A manager of every endpoint: each action works.
    let manager = link(&api, ADMIN, json!({"role": "manager"})).await;
    let cookie = open(&api, manager["token"].as_str().unwrap()).await;
    let (_, page) = get(&api, &cookie, &format!("/portal/endpoints/{e}")).await;
    let csrf = csrf_of(&page);
    // Without the CSRF token, or from another site: refused.
    let (s, _, _) = ui(
        &api,
        "POST",
        &format!("/portal/endpoints/{e}/disable"),
        Some(&cookie),
        Some("csrf=x".into()),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/disable"),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    assert!(!api.store.endpoint_get(&acme, eid).await.unwrap().enabled);
    let (_, page) = get(
        &api,
        &cookie,
        &format!("/portal/endpoints/{e}?done=disabled"),
    )
    .await;
    assert!(page.contains("id=\"enable\""), "{page}");
    let (s, _) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/enable"),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let form = "&url=https%3A%2F%2Fexample.com%2Fnew&description=renamed&event_types=a.b%2C+c.d";
    let (s, _) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/edit"),
        form,
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let changed = api.store.endpoint_get(&acme, eid).await.unwrap();
    assert_eq!(
        (
            changed.url.as_str(),
            changed.description.as_deref(),
            changed.event_types.clone()
        ),
        (
            "https://example.com/new",
            Some("renamed"),
            vec!["a.b".to_string(), "c.d".to_string()]
        )
    );
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/rotate-secret"),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("id=\"new-secret\">whsec_"), "{page}");
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/deliveries/{d}/replay"),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    let did: DeliveryId = d.parse().unwrap();
    assert_eq!(
        api.store
            .delivery_get(&acme, did)
            .await
            .unwrap()
            .state
            .as_str(),
        "pending"
    );
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/recover"),
        "&hours=1",
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    let (s, page) = get(&api, &cookie, "/portal/endpoints/new").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        "/portal/endpoints",
        "&url=https%3A%2F%2Fexample.com%2Fadded&description=mine",
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("id=\"new-secret\">whsec_"), "{page}");
    assert_eq!(api.store.endpoint_list(&acme).await.unwrap().len(), 2);
    let (s, page) = post(
        &api,
        &cookie,
        &csrf,
        &format!("/portal/endpoints/{e}/delete"),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(api.store.endpoint_list(&acme).await.unwrap().len(), 1);
    // The manager's session reaches no operator page either.
    let (s, _, _) = ui(&api, "GET", "/ui/a/acme", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    // An operator signed in still reaches the dashboard beside it.
    let operator = sign_in(&api, ADMIN).await;
    assert_eq!(get(&api, &operator, "/ui/a/acme").await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_portal_is_framed_only_by_the_configured_sites() {
    let api = api().await;
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let path = format!("/portal/{}", v["token"].as_str().unwrap());
    let (_, h, _) = ui(&api, "GET", &path, None, None).await;
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert_eq!(h["x-frame-options"], "DENY");
    let config = dashboard::DashboardConfig {
        portal_frame_ancestors: dashboard::FrameAncestors::parse("'self' https://app.example.com")
            .unwrap(),
    };
    let framed = support::api_with(dashboard::router_with(config)).await;
    let v = link(&framed, ADMIN, json!({"role": "viewer"})).await;
    let path = format!("/portal/{}", v["token"].as_str().unwrap());
    let (_, h, _) = ui(&framed, "GET", &path, None, None).await;
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'self' https://app.example.com;"),
        "{csp}"
    );
    assert!(h.get("x-frame-options").is_none());
    let (s, h, _) = ui(&framed, "POST", &path, None, Some(String::new())).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let set = h["set-cookie"].to_str().unwrap();
    assert!(
        set.contains("SameSite=None") && set.ends_with("; Secure"),
        "{set}"
    );
    // The operator's pages are never framed.
    let (_, h, _) = ui(&framed, "GET", "/ui/login", None, None).await;
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
}

/// The portal's event-types and attempts pages show their account's
/// content: a registered type with its description (another account's
/// never), and a failed attempt with the receiver's status, linked to its
/// delivery.
#[tokio::test]
async fn the_portal_shows_its_accounts_event_types_and_attempts() {
    let api = api().await;
    for (account, name, text) in [
        ("acme", "order.paid", "An order was paid <in full>"),
        ("other", "user.secret", "Another account's type"),
    ] {
        let (s, v) = call("PUT", format!("/v1/accounts/{account}/event-types/{name}"))
            .json(json!({"description": text}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    create_endpoint(&api, "acme").await;
    let delivery = publish(&api, "acme").await.remove(0);
    kill_all(&api).await;
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let cookie = open(&api, v["token"].as_str().unwrap()).await;
    let (s, page) = get(&api, &cookie, "/portal/event-types").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(
        page.contains("order.paid") && page.contains("An order was paid &lt;in full&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("user.secret"),
        "another account's type: {page}"
    );
    let (s, page) = get(&api, &cookie, "/portal/attempts").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("HTTP 400"), "{page}");
    assert!(
        page.contains(&format!("/portal/deliveries/{delivery}")),
        "the attempt links its delivery: {page}"
    );
}

/// The portal's pages carry the zone form too: its viewer names a zone and
/// the times follow; the form leads back into the portal only, and needs
/// the session's CSRF token.
#[tokio::test]
async fn a_portal_viewer_names_the_zone_its_times_are_shown_in() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    let delivery = publish(&api, "acme").await.remove(0);
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let cookie = open(&api, v["token"].as_str().unwrap()).await;
    let path = format!("/portal/deliveries/{delivery}");
    let (_, page) = get(&api, &cookie, &path).await;
    assert!(page.contains("action=\"/portal/zone\""), "{page}");
    assert!(page.contains("Z</small>"), "UTC by default: {page}");
    let csrf = csrf_of(&page);
    let form = format!(
        "csrf={csrf}&zone=Asia%2FKolkata&back={}",
        path.replace('/', "%2F")
    );
    let (s, h, body) = ui(&api, "POST", "/portal/zone", Some(&cookie), Some(form)).await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(h["location"], path.as_str());
    let zone = h["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(zone, "cp_zone=Asia%2FKolkata");
    let (_, page) = get(&api, &format!("{cookie}; {zone}"), &path).await;
    assert!(
        page.contains(" IST</small>") && !page.contains("Z</small>"),
        "{page}"
    );
    // Back into the portal only; a stale token keeps nothing.
    let form = format!("csrf={csrf}&zone=UTC&back=%2Fui%2Fa%2Fother");
    let (s, h, _) = ui(&api, "POST", "/portal/zone", Some(&cookie), Some(form)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert_eq!(h["location"], "/portal");
    let form = "csrf=nope&zone=UTC&back=%2Fportal".to_string();
    let (s, h, _) = ui(&api, "POST", "/portal/zone", Some(&cookie), Some(form)).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(h.get("set-cookie").is_none());
}

/// The operator lists the account's portal links on the dashboard and
/// revokes one there: its session ends at once; another account's link
/// cannot be revoked from this account's page.
#[tokio::test]
async fn the_operator_lists_and_revokes_portal_links_on_the_dashboard() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    let v = link(&api, ADMIN, json!({"role": "viewer"})).await;
    let id = v["id"].as_str().unwrap().to_string();
    let portal = open(&api, v["token"].as_str().unwrap()).await;
    let (s, _) = get(&api, &portal, "/portal/endpoints").await;
    assert_eq!(s, StatusCode::OK);
    let (s, theirs) = call("POST", "/v1/accounts/other/portal-links")
        .json(json!({"role": "viewer"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{theirs}");
    let cookie = sign_in(&api, ADMIN).await;
    let (_, endpoints) = get(&api, &cookie, "/ui/a/acme/endpoints").await;
    assert!(endpoints.contains("/ui/a/acme/portal-links"), "{endpoints}");
    let (s, page) = get(&api, &cookie, "/ui/a/acme/portal-links").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains(&id) && page.contains("viewer"), "{page}");
    assert!(
        page.contains("every endpoint") && page.contains("opened "),
        "{page}"
    );
    assert!(!page.contains(theirs["id"].as_str().unwrap()), "{page}");
    let csrf = csrf_of(&page);
    let revoke = |path: String| {
        let (api, cookie, csrf) = (&api, cookie.clone(), csrf.clone());
        async move { post(api, &cookie, &csrf, &path, "").await }
    };
    let (s, _) = revoke(format!(
        "/ui/a/acme/portal-links/{}/revoke",
        theirs["id"].as_str().unwrap()
    ))
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another account's link");
    let (s, to) = revoke(format!("/ui/a/acme/portal-links/{id}/revoke")).await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{to}");
    let (_, page) = get(&api, &cookie, "/ui/a/acme/portal-links").await;
    assert!(
        page.contains("revoked ") && !page.contains(&format!("id=\"revoke-{id}\"")),
        "{page}"
    );
    let (s, _) = get(&api, &portal, "/portal/endpoints").await;
    assert_ne!(s, StatusCode::OK, "the revoked link's session ended");
}
