//! The API in process over the embedded store: authentication, isolation,
//! error shapes, limits, and the routes' answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use axum::http::StatusCode;
use control_plane_core::{
    AccountId, AttemptReport, ClaimRequest, DeliveryId, DeliveryOutcome, DeliveryState,
    TaskClaimRequest, TaskFailed,
};
use serde_json::{json, Value};

mod support;
use support::*;

async fn api() -> Api {
    api_with(axum::Router::new()).await
}

#[tokio::test]
async fn health_is_open_and_everything_else_needs_a_token() {
    let api = api().await;
    let (s, v) = call("GET", "/healthz").token(None).send(&api).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, v) = call("GET", "/readyz").token(None).send(&api).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["store"], "embedded");
    for (m, p) in [
        ("GET", "/metrics"),
        ("GET", "/v1/accounts/acme/endpoints"),
        ("POST", "/v1/accounts/acme/events"),
        ("POST", "/v1/accounts/acme/keys"),
        ("GET", "/v1/accounts/acme/usage"),
    ] {
        let (s, v) = call(m, p).token(None).send(&api).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {p}");
        assert_error(&v, "unauthorized");
        let (s, _) = call(m, p).token(Some("cpk_wrong")).send(&api).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {p}");
    }
    let (s, _) = call("GET", "/metrics").send(&api).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn an_account_key_reaches_its_own_account_only() {
    let api = api().await;
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let token = key["key"].as_str().unwrap().to_string();
    assert!(token.starts_with("cpk_"));
    let theirs = create_endpoint(&api, "other").await;
    let their_id = theirs["id"].as_str().unwrap();
    // Ids that exist in the other account: an account key must get the same
    // 404 for them as for anything else outside its reach.
    let (s, published) = call("POST", "/v1/accounts/other/events")
        .json(json!({"type": "order.paid", "payload": 1}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{published}");
    let their_event = published["id"].as_str().unwrap().to_string();
    let their_delivery = published["deliveries"][0].as_str().unwrap().to_string();
    let (s, task) = call("POST", "/v1/accounts/other/tasks")
        .json(json!({"id": "t1", "kind": "k"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let their_reads = [
        format!("/v1/accounts/other/endpoints/{their_id}"),
        format!("/v1/accounts/other/endpoints/{their_id}/stats"),
        format!("/v1/accounts/other/deliveries/{their_delivery}"),
        format!("/v1/accounts/other/events/{their_event}"),
        "/v1/accounts/other/tasks/t1".to_string(),
    ];
    for p in &their_reads {
        let (s, v) = call("GET", p.clone()).send(&api).await;
        assert_eq!(s, StatusCode::OK, "the admin reads {p}: {v}");
    }
    let mine = call("POST", "/v1/accounts/acme/endpoints")
        .token(Some(&token))
        .json(json!({"url": "https://example.com/mine"}))
        .send(&api)
        .await;
    assert_eq!(mine.0, StatusCode::CREATED, "{}", mine.1);
    let routes = [
        ("GET", "/v1/accounts/other/endpoints".to_string()),
        ("POST", "/v1/accounts/other/endpoints".to_string()),
        ("GET", format!("/v1/accounts/other/endpoints/{their_id}")),
        ("PATCH", format!("/v1/accounts/other/endpoints/{their_id}")),
        ("DELETE", format!("/v1/accounts/other/endpoints/{their_id}")),
        (
            "POST",
            format!("/v1/accounts/other/endpoints/{their_id}/rotate-secret"),
        ),
        (
            "POST",
            format!("/v1/accounts/other/endpoints/{their_id}/enable"),
        ),
        ("POST", "/v1/accounts/other/events".to_string()),
        ("GET", "/v1/accounts/other/deliveries".to_string()),
        (
            "GET",
            format!("/v1/accounts/other/deliveries/{their_delivery}"),
        ),
        (
            "POST",
            format!("/v1/accounts/other/deliveries/{their_delivery}/replay"),
        ),
        (
            "POST",
            format!("/v1/accounts/other/endpoints/{their_id}/disable"),
        ),
        (
            "GET",
            format!("/v1/accounts/other/endpoints/{their_id}/stats"),
        ),
        ("GET", "/v1/accounts/other/events".to_string()),
        ("GET", format!("/v1/accounts/other/events/{their_event}")),
        ("POST", "/v1/accounts/other/deliveries/replay".to_string()),
        ("POST", "/v1/accounts/other/tasks".to_string()),
        ("GET", "/v1/accounts/other/tasks/t1".to_string()),
        ("POST", "/v1/accounts/other/tasks/t1/retry".to_string()),
        ("GET", "/v1/accounts/other/dead-tasks".to_string()),
        ("GET", "/v1/accounts/other/usage".to_string()),
        ("GET", "/v1/accounts/other/alerts".to_string()),
        ("POST", "/v1/accounts/other/keys".to_string()),
        ("POST", "/v1/accounts/acme/keys".to_string()),
        ("GET", "/metrics".to_string()),
        // The other account's ids under the key's own account: scoped by
        // the store, not only by the path.
        ("GET", format!("/v1/accounts/acme/endpoints/{their_id}")),
        (
            "GET",
            format!("/v1/accounts/acme/deliveries/{their_delivery}"),
        ),
        ("GET", format!("/v1/accounts/acme/events/{their_event}")),
        ("GET", "/v1/accounts/acme/tasks/t1".to_string()),
    ];
    for (m, p) in &routes {
        let body = json!({"url": "https://example.com/x", "type": "t", "payload": 1, "kind": "k"});
        let (s, v) = call(m, p.clone())
            .token(Some(&token))
            .json(body)
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{m} {p}: {v}");
        assert_error(&v, "not_found");
    }
    let (s, v) = call("GET", format!("/v1/accounts/other/endpoints/{their_id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "nothing changed: {v}");
    let (s, list) = call("GET", "/v1/accounts/acme/endpoints")
        .token(Some(&token))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let key_id = key["id"].as_str().unwrap();
    let (s, _) = call("DELETE", format!("/v1/accounts/acme/keys/{key_id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call("GET", "/v1/accounts/acme/endpoints")
        .token(Some(&token))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "a revoked key stops working");
}

#[tokio::test]
async fn only_the_admin_may_raise_max_in_flight_above_the_default() {
    let api = api().await;
    let (_, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    let token = key["key"].as_str().unwrap().to_string();
    let create = |n: u32, t: Option<&str>| {
        let t = t.map(str::to_string);
        let api = &api;
        async move {
            call("POST", "/v1/accounts/acme/endpoints")
                .token(t.as_deref())
                .json(json!({"url": "https://example.com/x", "max_in_flight": n}))
                .send(api)
                .await
        }
    };
    let (s, body) = create(17, Some(&token)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "forbidden");
    assert!(body
        .to_string()
        .contains("CONTROLPLANE_ENDPOINT_CONCURRENCY"));
    let (s, mine) = create(16, Some(&token)).await;
    assert_eq!(s, StatusCode::CREATED, "{mine}");
    let id = mine["id"].as_str().unwrap();
    let (s, body) = call("PATCH", format!("/v1/accounts/acme/endpoints/{id}"))
        .token(Some(&token))
        .json(json!({"max_in_flight": 100}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let (s, body) = create(100, Some(ADMIN)).await;
    assert_eq!(s, StatusCode::CREATED, "the admin may: {body}");
    assert_eq!(
        api.store
            .endpoint_list(&AccountId::new("acme").unwrap())
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn an_endpoint_takes_its_own_retry_schedule_checked() {
    let api = api().await;
    let create = |retry: Value| {
        let api = &api;
        async move {
            call("POST", "/v1/accounts/acme/endpoints")
                .json(json!({"url": "https://example.com/x", "retry": retry}))
                .send(api)
                .await
        }
    };
    let (s, e) = create(json!({"schedule": [1, 60, 3600]})).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    assert_eq!(
        e["retry"],
        json!({"schedule": [1, 60, 3600], "max_attempts": 4})
    );
    for bad in [
        json!({"schedule": []}),
        json!({"schedule": [0]}),
        json!({"schedule": [604_801]}),
        json!({"schedule": [5], "max_attempts": 0}),
        json!({"schedule": [5], "max_attempts": 101}),
        json!({"schedule": [5], "jitter": 1}),
    ] {
        let (s, body) = create(bad.clone()).await;
        assert!(s.is_client_error(), "{bad}: {s} {body}");
    }
    let id = e["id"].as_str().unwrap();
    let path = format!("/v1/accounts/acme/endpoints/{id}");
    let (s, changed) = call("PATCH", &path)
        .json(json!({"retry": {"schedule": [30], "max_attempts": 10}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{changed}");
    assert_eq!(
        changed["retry"],
        json!({"schedule": [30], "max_attempts": 10})
    );
    let (_, kept) = call("PATCH", &path)
        .json(json!({"description": "d"}))
        .send(&api)
        .await;
    assert_eq!(kept["retry"]["max_attempts"], 10, "kept when not given");
    let (_, cleared) = call("PATCH", &path)
        .json(json!({"retry": null}))
        .send(&api)
        .await;
    assert_eq!(cleared["retry"], Value::Null);
    let (_, got) = call("GET", &path).send(&api).await;
    assert_eq!(got["retry"], Value::Null, "{got}");
}

#[tokio::test]
async fn only_the_admin_erases_an_account_and_its_doors_shut_at_once() {
    let api = api().await;
    let (_, key) = call("POST", "/v1/accounts/gone/keys").send(&api).await;
    let token = key["key"].as_str().unwrap().to_string();
    create_endpoint(&api, "gone").await;
    create_endpoint(&api, "kept").await;
    let (s, body) = call("DELETE", "/v1/accounts/gone")
        .token(Some(&token))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "an account key may not: {body}");
    let (s, begun) = call("DELETE", "/v1/accounts/gone").send(&api).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{begun}");
    assert_eq!(
        (&begun["keys_revoked"], &begun["endpoints_disabled"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(begun["task"]["kind"], "control-plane.erase");
    let (s, _) = call("GET", "/v1/accounts/gone/endpoints")
        .token(Some(&token))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the key is revoked at once");
    let (_, listed) = call("GET", "/v1/accounts/gone/endpoints").send(&api).await;
    assert_eq!(listed["items"][0]["enabled"], false, "{listed}");
    // What the task runs, holding its lease: nothing of the account is
    // left but the task.
    let gone = AccountId::new("gone").unwrap();
    let running = api
        .store
        .workflow_claim(
            TaskClaimRequest::new(
                "w",
                vec!["control-plane.erase".to_string()],
                1,
                std::time::Duration::from_secs(60),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    let done = control_plane_runtime::erase(api.store.as_ref(), &gone, None, |_| {})
        .await
        .unwrap();
    assert!(done.done && done.rows_removed >= 1, "{done:?}");
    let (_, listed) = call("GET", "/v1/accounts/gone/endpoints").send(&api).await;
    assert_eq!(listed["items"], json!([]));
    let task = begun["task"]["id"].as_str().unwrap();
    let (s, _) = call("GET", format!("/v1/accounts/gone/tasks/{task}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "the erasure task stays");
    let (_, kept) = call("GET", "/v1/accounts/kept/endpoints").send(&api).await;
    assert_eq!(kept["items"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn an_ed25519_endpoint_shows_its_public_key_and_rotates_within_its_scheme() {
    let api = api().await;
    let (s, e) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/x", "signature": "ed25519"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    assert_eq!(e["signature"], "ed25519");
    assert!(e["secret"].as_str().unwrap().starts_with("whsk_"), "{e}");
    let first = e["public_key"].as_str().unwrap().to_string();
    assert!(first.starts_with("whpk_"), "{e}");
    let path = format!("/v1/accounts/acme/endpoints/{}", e["id"].as_str().unwrap());
    let (_, got) = call("GET", &path).send(&api).await;
    assert_eq!(got["public_key"], first.as_str());
    assert!(got.get("secret").is_none(), "the key is shown once");
    let (s, rotated) = call("POST", format!("{path}/rotate-secret"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{rotated}");
    assert!(rotated["secret"].as_str().unwrap().starts_with("whsk_"));
    assert_ne!(rotated["public_key"], first.as_str(), "a new key pair");
    let hmac = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (s, body) = call("POST", format!("{path}/rotate-secret"))
        .json(json!({"secret": hmac}))
        .send(&api)
        .await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the scheme stays: {body}"
    );
    let (s, body) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/x", "signature": "ed25519", "secret": hmac}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (s, plain) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/x", "secret": hmac}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{plain}");
    assert_eq!(
        (&plain["signature"], &plain["public_key"]),
        (&json!("hmac"), &Value::Null)
    );
}

#[tokio::test]
async fn keys_are_stored_hashed() {
    let api = api().await;
    let (_, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    let token = key["key"].as_str().unwrap();
    assert!(api.store.account_key_find(token).await.unwrap().is_none());
    assert!(api
        .store
        .account_key_find(&api::hash_token(token))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn bad_input_gets_a_shaped_error_and_changes_nothing() {
    let api = api().await;
    let p = "/v1/accounts/acme/endpoints";
    let cases: Vec<(Call<'_>, StatusCode, &str)> = vec![
        (
            call("POST", p).raw("{", "application/json"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            call("POST", p).raw("{\"url\": 5}", "application/json"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", p).json(json!({"url": "https://x.io", "colour": "red"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", p).json(json!({"url": "ftp://x.io"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", p).json(json!({"url": "https://x.io", "secret": "plain"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", p).raw("url=x", "application/x-www-form-urlencoded"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            call("POST", p).raw(
                format!("{{\"url\": \"https://x.io/{}\"}}", "a".repeat(70_000)),
                "application/json",
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            call("PUT", p).json(json!({})),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            call("GET", "/v2/nothing"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            call("GET", "/v1/accounts/acme/endpoints/not-a-uuid"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            call("GET", "/v1/accounts/bad%20name/endpoints"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            call("GET", "/v1/accounts/acme/deliveries?limit=abc"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            call("GET", "/v1/accounts/acme/deliveries?limit=0"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("GET", "/v1/accounts/acme/deliveries?state=sleeping"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("GET", "/v1/accounts/acme/deliveries?cursor=x"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            call("POST", "/v1/accounts/acme/events")
                .json(json!({"type": "circuit.opened", "payload": {}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", "/v1/accounts/acme/events").json(json!({"type": "", "payload": {}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("POST", "/v1/accounts/acme/tasks").json(json!({"kind": ""})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            call("GET", "/v1/accounts/acme/usage?from=yesterday"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (c, status, code) in cases {
        let what = format!("{} {}", c.method, c.path);
        let (s, v) = c.send(&api).await;
        assert_eq!(s, status, "{what}: {v}");
        assert_error(&v, code);
    }
    let (_, list) = call("GET", p).send(&api).await;
    assert!(
        list["items"].as_array().unwrap().is_empty(),
        "nothing was created"
    );
}

#[tokio::test]
async fn endpoints_show_their_secret_only_when_created_or_rotated() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let secret = e["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"));
    let id = e["id"].as_str().unwrap();
    let (_, got) = call("GET", format!("/v1/accounts/acme/endpoints/{id}"))
        .send(&api)
        .await;
    assert!(got.get("secret").is_none());
    assert_eq!(got["circuit"]["mode"], "closed");
    let (_, list) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert!(!list.to_string().contains(secret));
    let (s, rotated) = call(
        "POST",
        format!("/v1/accounts/acme/endpoints/{id}/rotate-secret"),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::OK, "{rotated}");
    assert_ne!(rotated["secret"], e["secret"]);
    assert!(rotated["previous_secret_expires_at"].is_string());
    let (s, patched) = call("PATCH", format!("/v1/accounts/acme/endpoints/{id}"))
        .json(json!({"description": "billing", "rate_limit_per_s": 5}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{patched}");
    assert_eq!(
        (
            patched["description"].as_str(),
            patched["rate_limit_per_s"].as_u64()
        ),
        (Some("billing"), Some(5))
    );
    let (_, cleared) = call("PATCH", format!("/v1/accounts/acme/endpoints/{id}"))
        .json(json!({"description": null}))
        .send(&api)
        .await;
    assert!(cleared["description"].is_null());
    assert_eq!(cleared["rate_limit_per_s"], 5, "absent fields stay");
}

#[tokio::test]
async fn publishing_is_idempotent_by_header_and_deliveries_are_listed() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let publish = || {
        call("POST", "/v1/accounts/acme/events")
            .header("idempotency-key", "order-7")
            .json(json!({"type": "order.paid", "payload": {"id": 7}}))
    };
    let (s, first) = publish().send(&api).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["duplicate"], false);
    let (_, again) = publish().send(&api).await;
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["deliveries"], first["deliveries"]);
    // The key is bound to its request: another payload under it is refused.
    let (s, other) = call("POST", "/v1/accounts/acme/events")
        .header("idempotency-key", "order-7")
        .json(json!({"type": "order.paid", "payload": {"id": 8}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    assert_error(&other, "invalid_input");
    let delivery = first["deliveries"][0].as_str().unwrap();
    let (s, list) = call(
        "GET",
        format!(
            "/v1/accounts/acme/deliveries?state=pending&endpoint={}",
            e["id"].as_str().unwrap()
        ),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["items"][0]["id"], delivery);
    assert!(list["next_cursor"].is_null());
    // By the event's type and the creation time, through the query string.
    let count = |q: &'static str| {
        let api = &api;
        async move {
            let (s, v) = call("GET", format!("/v1/accounts/acme/deliveries?{q}"))
                .send(api)
                .await;
            assert_eq!(s, StatusCode::OK, "{q}: {v}");
            v["items"].as_array().unwrap().len()
        }
    };
    assert_eq!(count("type=order.paid").await, 1);
    assert_eq!(count("type=order.refunded").await, 0);
    assert_eq!(count("since=0&until=99999999999").await, 1);
    assert_eq!(count("since=99999999999").await, 0);
    assert_eq!(count("until=1").await, 0);
    let (s, v) = call("GET", "/v1/accounts/acme/deliveries?since=-5")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let long = "x".repeat(256);
    let (s, v) = call("GET", format!("/v1/accounts/acme/deliveries?type={long}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, d) = call("GET", format!("/v1/accounts/acme/deliveries/{delivery}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(d["state"], "pending");
    assert_eq!(d["attempt_log"], json!([]));
    let (s, v) = call(
        "POST",
        format!("/v1/accounts/acme/deliveries/{delivery}/replay"),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "only dead deliveries replay: {v}");
    assert_error(&v, "conflict");
}

/// A batch publish stores every event or none, answers each event as a
/// single publish does, in order, and keys each event on its own.
#[tokio::test]
async fn a_batch_publish_is_all_or_nothing_with_a_key_per_event() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    async fn events_stored(api: &Api) -> usize {
        let (_, v) = call("GET", "/v1/accounts/acme/events?limit=1000")
            .send(api)
            .await;
        v["items"].as_array().unwrap().len()
    }
    let batch = json!({"events": [
        {"type": "order.paid", "payload": {"n": 1}, "idempotency_key": "b-1"},
        {"type": "order.paid", "payload": {"n": 2}},
        {"type": "order.paid", "payload": {"n": 3}, "idempotency_key": "b-3"},
    ]});
    let (s, first) = call("POST", "/v1/accounts/acme/events/batch")
        .json(batch.clone())
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    let answers = first["events"].as_array().unwrap();
    assert_eq!(answers.len(), 3);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a["duplicate"], false, "{a}");
        assert_eq!(a["deliveries"].as_array().unwrap().len(), 1, "{a}");
        let (s, e) = call(
            "GET",
            format!("/v1/accounts/acme/events/{}", a["id"].as_str().unwrap()),
        )
        .send(&api)
        .await;
        assert_eq!(s, StatusCode::OK);
        let body: Value = serde_json::from_str(e["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["data"]["n"], i + 1, "in the order given");
    }
    assert_eq!(events_stored(&api).await, 3);
    // Again: the keyed events come back as they were, the unkeyed one is new.
    let (s, again) = call("POST", "/v1/accounts/acme/events/batch")
        .json(batch)
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["events"][0]["id"], answers[0]["id"]);
    assert_eq!(again["events"][0]["duplicate"], true);
    assert_ne!(again["events"][1]["id"], answers[1]["id"]);
    assert_eq!(again["events"][2]["id"], answers[2]["id"]);
    assert_eq!(events_stored(&api).await, 4);
    // One bad event refuses the batch: nothing of it is stored.
    for (bad, says) in [
        (
            json!({"events": [
                {"type": "order.paid", "payload": {}},
                {"type": "", "payload": {}},
            ]}),
            "events[1]",
        ),
        (
            json!({"events": [
                {"type": "order.paid", "payload": {}, "idempotency_key": "k"},
                {"type": "order.void", "payload": {}, "idempotency_key": "k"},
            ]}),
            "events[1].idempotency_key",
        ),
        (
            json!({"events": [
                {"type": "order.paid", "payload": {}},
                {"type": "order.paid", "payload": {"n": 9}, "idempotency_key": "b-1"},
            ]}),
            "b-1",
        ),
        (json!({"events": []}), "1 to 100"),
        (
            json!({"events": vec![json!({"type": "t", "payload": {}}); 101]}),
            "1 to 100",
        ),
    ] {
        let (s, v) = call("POST", "/v1/accounts/acme/events/batch")
            .json(bad.clone())
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert_error(&v, "invalid_input");
        assert!(v.to_string().contains(says), "{bad}: {v}");
        assert_eq!(events_stored(&api).await, 4, "{bad} stored something");
    }
}

/// An `Idempotency-Key` on a mutating route: the same request again gets
/// the first answer (marked as a replay) and runs nothing; another request
/// under the key is 422; a repeat while the first runs is 409; another
/// caller's key of the same name is its own.
#[tokio::test]
async fn every_mutating_route_takes_an_idempotency_key() {
    use api::idempotency::{request_hash, KEY_TTL, REPLAYED};
    use control_plane_core::{
        AccountId, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyOwner,
    };

    let api = api().await;
    async fn endpoints(api: &Api) -> usize {
        let (_, v) = call("GET", "/v1/accounts/acme/endpoints").send(api).await;
        v["items"].as_array().unwrap().len()
    }
    let create = |url: &str| {
        call("POST", "/v1/accounts/acme/endpoints")
            .header("idempotency-key", "ep-1")
            .json(json!({"url": url}))
    };
    let ((s, first), h) = create("https://example.com/a").send_full(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert!(h.get(REPLAYED).is_none());
    let ((s, again), h) = create("https://example.com/a").send_full(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{again}");
    assert!(first["secret"].as_str().unwrap().starts_with("whsec_"));
    let mut shown_once = first.clone();
    shown_once["secret"] = Value::Null;
    assert_eq!(again, shown_once, "the first answer, without its secret");
    assert_eq!(h.get(REPLAYED).unwrap(), "true");
    assert_eq!(endpoints(&api).await, 1, "the repeat created nothing");
    let (s, v) = create("https://example.com/b").send(&api).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "invalid_input");
    assert_eq!(endpoints(&api).await, 1);

    // A delete repeated under its key answers as the first did, not 404.
    let id = first["id"].as_str().unwrap();
    let path = format!("/v1/accounts/acme/endpoints/{id}");
    let delete = || call("DELETE", path.as_str()).header("idempotency-key", "del-1");
    let (s, deleted) = delete().send(&api).await;
    assert_eq!(s, StatusCode::OK, "{deleted}");
    let (s, again) = delete().send(&api).await;
    assert_eq!((s, &again), (StatusCode::OK, &deleted));
    let (s, _) = call("DELETE", path.as_str()).send(&api).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "without a key it runs again");

    // Another caller (an account key) has keys of its own.
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let token = key["key"].as_str().unwrap().to_string();
    let (s, theirs) = call("POST", "/v1/accounts/acme/endpoints")
        .token(Some(&token))
        .header("idempotency-key", "ep-1")
        .json(json!({"url": "https://example.com/b"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{theirs}");
    assert_ne!(theirs["id"], first["id"]);

    // While the first request with a key runs, a repeat is 409.
    let body = json!({"url": "https://example.com/c"}).to_string();
    let busy = IdempotencyBeginRequest::new(
        IdempotencyOwner::AdminOf(&AccountId::new("acme").unwrap()).scope(),
        "busy",
        request_hash(
            &axum::http::Method::POST,
            "/v1/accounts/acme/endpoints",
            body.as_bytes(),
        ),
        KEY_TTL,
    )
    .unwrap();
    assert!(matches!(
        api.store.idempotency_begin(&busy).await.unwrap(),
        IdempotencyBegin::Started(_)
    ));
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .header("idempotency-key", "busy")
        .raw(body, "application/json")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    // A key that is not visible ASCII is refused before anything runs.
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .header("idempotency-key", "")
        .json(json!({"url": "https://example.com/d"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

/// The attempt log is searched per account and per endpoint, by result,
/// status code and time, a page at a time.
#[tokio::test]
async fn attempts_are_searched_per_account_and_per_endpoint() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let endpoint = e["id"].as_str().unwrap();
    for n in 0..3 {
        let (s, v) = call("POST", "/v1/accounts/acme/events")
            .json(json!({"type": "order.paid", "payload": {"n": n}}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    }
    let claimed = api
        .store
        .delivery_claim(ClaimRequest::new("w", 10, std::time::Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    for (i, c) in claimed.iter().enumerate() {
        let report = |code| AttemptReport {
            status_code: Some(code),
            error: None,
            latency_ms: 1,
            response_body: None,
        };
        let outcome = if i == 0 {
            DeliveryOutcome::Delivered(report(200))
        } else {
            DeliveryOutcome::GiveUp(report(400))
        };
        api.store
            .delivery_record_outcome(&c.lease, outcome)
            .await
            .unwrap();
    }
    let search = |path: String| {
        let api = &api;
        async move {
            let (s, v) = call("GET", path).send(api).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v
        }
    };
    let all = search("/v1/accounts/acme/attempts".into()).await;
    assert_eq!(all["items"].as_array().unwrap().len(), 3, "{all}");
    assert_eq!(all["items"][0]["endpoint_id"], endpoint);
    assert!(all["items"][0]["delivery_id"].is_string());
    let failed = search("/v1/accounts/acme/attempts?result=failed".into()).await;
    let failed = failed["items"].as_array().unwrap();
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|a| a["status_code"] == 400));
    let ok = search("/v1/accounts/acme/attempts?status_code=200".into()).await;
    assert_eq!(ok["items"].as_array().unwrap().len(), 1);
    assert_eq!(ok["items"][0]["result"], "delivered");
    let later = search("/v1/accounts/acme/attempts?since=4102444800".into()).await;
    assert_eq!(later["items"], json!([]));
    // An endpoint's, two at a time.
    let base = format!("/v1/accounts/acme/endpoints/{endpoint}/attempts");
    let first = search(format!("{base}?limit=2")).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_str().unwrap();
    let rest = search(format!("{base}?limit=2&cursor={cursor}")).await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 1);
    assert!(rest["next_cursor"].is_null());
    // Bad filters and unknown endpoints.
    let (s, v) = call("GET", "/v1/accounts/acme/attempts?result=nope")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = call("GET", "/v1/accounts/acme/attempts?status_code=42")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let unknown = "/v1/accounts/acme/endpoints/0b8e9c1e-5f7a-4c1e-9a59-1f0d2f3a4b5c/attempts";
    let (s, v) = call("GET", unknown).send(&api).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // Another account sees none of them.
    let (s, v) = call("GET", "/v1/accounts/other/attempts").send(&api).await;
    assert_eq!((s, v["items"].clone()), (StatusCode::OK, json!([])));
}

/// Tasks are listed by state: pending, running (leased) and dead.
#[tokio::test]
async fn tasks_are_listed_by_state() {
    let api = api().await;
    for id in ["t1", "t2"] {
        let (s, v) = call("POST", "/v1/accounts/acme/tasks")
            .json(json!({"id": id, "kind": "report", "payload": {}}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let listed = |state: &'static str| {
        let api = &api;
        async move {
            let (s, v) = call("GET", format!("/v1/accounts/acme/tasks?state={state}"))
                .send(api)
                .await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("pending").await, vec!["t2", "t1"]);
    assert!(listed("running").await.is_empty());
    let claimed = api
        .store
        .workflow_claim(
            TaskClaimRequest::new(
                "w",
                vec!["report".into()],
                1,
                std::time::Duration::from_secs(30),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        listed("running").await,
        vec![claimed[0].task.id.to_string()]
    );
    assert_eq!(listed("pending").await.len(), 1);
    assert!(listed("dead").await.is_empty());
    let (s, v) = call("GET", "/v1/accounts/acme/tasks?state=completed")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn dead_deliveries_are_replayed_in_bulk_once() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let endpoint = e["id"].as_str().unwrap();
    let (_, published) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.paid", "payload": {}}))
        .send(&api)
        .await;
    // The delivery dies through the store: the worker gives up on it.
    let acme = AccountId::new("acme").unwrap();
    let delivery: DeliveryId = published["deliveries"][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let c = api
        .store
        .delivery_claim(ClaimRequest::new("w", 1, std::time::Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    api.store
        .delivery_record_outcome(
            &c[0].lease,
            DeliveryOutcome::GiveUp(AttemptReport {
                status_code: Some(400),
                error: None,
                latency_ms: 1,
                response_body: None,
            }),
        )
        .await
        .unwrap();
    let replay = |body: Value| call("POST", "/v1/accounts/acme/deliveries/replay").json(body);
    for bad in [
        json!({"endpoint_id": "nope"}),
        json!({"dead_since": -1}),
        json!({"dead_before": 1}),
    ] {
        let (s, v) = replay(bad).send(&api).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_error(&v, "invalid_input");
    }
    // A filter sent without a content type is refused, not dropped unread
    // (which would replay every dead delivery of the account).
    let (s, v) = call("POST", "/v1/accounts/acme/deliveries/replay")
        .raw(
            json!({"endpoint_id": "0b8e9c1e-5f7a-4c1e-9a59-1f0d2f3a4b5c"}).to_string(),
            "",
        )
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    assert_error(&v, "unsupported_media_type");
    assert_eq!(
        api.store.delivery_get(&acme, delivery).await.unwrap().state,
        DeliveryState::Dead,
        "bad input replays nothing"
    );
    let (s, v) = replay(json!({"endpoint_id": endpoint, "dead_since": 0}))
        .send(&api)
        .await;
    assert_eq!((s, &v), (StatusCode::OK, &json!({"replayed": 1})));
    let d = api.store.delivery_get(&acme, delivery).await.unwrap();
    assert_eq!(d.state, DeliveryState::Pending);
    let (s, v) = call("POST", "/v1/accounts/acme/deliveries/replay")
        .send(&api)
        .await;
    assert_eq!((s, &v), (StatusCode::OK, &json!({"replayed": 0})), "once");
}

#[tokio::test]
async fn tasks_are_enqueued_idempotently_and_read_back() {
    let api = api().await;
    let body = json!({"id": "job-1", "kind": "report", "payload": {"month": 11}});
    let (s, t) = call("POST", "/v1/accounts/acme/tasks")
        .json(body.clone())
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    assert_eq!(t["state"], "pending");
    let (s, _) = call("POST", "/v1/accounts/acme/tasks")
        .json(body)
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "the same task again");
    let (s, v) = call("POST", "/v1/accounts/acme/tasks")
        .json(json!({"id": "job-1", "kind": "report", "payload": {"month": 12}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, t) = call("GET", "/v1/accounts/acme/tasks/job-1")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(t["payload"], json!({"month": 11}));
    let (s, _) = call("GET", "/v1/accounts/other/tasks/job-1")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn operators_disable_endpoints_read_events_and_retry_dead_tasks() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let endpoint = e["id"].as_str().unwrap();
    let claim = || {
        api.store
            .delivery_claim(ClaimRequest::new("w", 10, std::time::Duration::from_secs(30)).unwrap())
    };

    // Disabled: deliveries are held, not dropped, until it is enabled.
    let disable = format!("/v1/accounts/acme/endpoints/{endpoint}/disable");
    for bad in ["", "nul\u{0}"] {
        let (s, v) = call("POST", &disable)
            .json(json!({"reason": bad}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    }
    // A body without a content type is refused, not read as no reason.
    let (s, v) = call("POST", &disable)
        .raw(json!({"reason": "maintenance"}).to_string(), "")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    let (s, v) = call("POST", &disable)
        .json(json!({"reason": "customer maintenance"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["enabled"], &v["disabled_reason"]),
        (&json!(false), &json!("customer maintenance"))
    );
    let (_, published) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.paid", "payload": {"<script>": 1}}))
        .send(&api)
        .await;
    assert!(claim().await.unwrap().is_empty(), "held while disabled");
    let (s, _) = call(
        "POST",
        format!("/v1/accounts/acme/endpoints/{endpoint}/enable"),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::OK);
    let released = claim().await.unwrap();
    assert_eq!(released.len(), 1, "released on enable");
    api.store
        .delivery_record_outcome(
            &released[0].lease,
            DeliveryOutcome::Delivered(AttemptReport {
                status_code: Some(200),
                error: None,
                latency_ms: 42,
                response_body: None,
            }),
        )
        .await
        .unwrap();
    let (s, stats) = call(
        "GET",
        format!("/v1/accounts/acme/endpoints/{endpoint}/stats"),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::OK, "{stats}");
    for window in ["last_hour", "last_day"] {
        assert_eq!(stats[window]["attempts"]["delivered"], 1);
        assert_eq!(stats[window]["success_rate"], 1.0);
        // The bound of the rollup bucket that holds 42 ms (ADR 0032).
        let bucket = control_plane_core::latency_bucket(42);
        assert_eq!(
            stats[window]["p95_latency_ms"],
            control_plane_core::latency_bucket_bound(bucket)
        );
    }

    // An event reads back with the exact body its deliveries send.
    let event = published["id"].as_str().unwrap();
    let (s, v) = call("GET", format!("/v1/accounts/acme/events/{event}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["type"], "order.paid");
    let body: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["data"], json!({"<script>": 1}));
    let (s, _) = call("GET", format!("/v1/accounts/other/events/{event}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another account's event");
    let (s, listed) = call("GET", "/v1/accounts/acme/events?type=order.paid&limit=10")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    assert_eq!(listed["items"][0]["id"], event);
    assert!(listed["next_cursor"].is_null());
    let (s, none) = call("GET", "/v1/accounts/acme/events?type=other")
        .send(&api)
        .await;
    assert_eq!((s, &none["items"]), (StatusCode::OK, &json!([])));
    let (s, v) = call("GET", "/v1/accounts/acme/events?since=yesterday")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    // A dead-lettered task is listed, retried once, then gone from the list.
    call("POST", "/v1/accounts/acme/tasks")
        .json(json!({"id": "job-9", "kind": "report", "payload": {}}))
        .send(&api)
        .await;
    let leased = api
        .store
        .workflow_claim(
            TaskClaimRequest::new(
                "w",
                vec!["report".into()],
                1,
                std::time::Duration::from_secs(30),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    api.store
        .workflow_fail(&leased[0].lease, TaskFailed::permanent("bad input"))
        .await
        .unwrap();
    let (s, dead) = call("GET", "/v1/accounts/acme/dead-tasks").send(&api).await;
    assert_eq!(s, StatusCode::OK, "{dead}");
    assert_eq!(dead["items"][0]["id"], "job-9");
    let retry = "/v1/accounts/acme/tasks/job-9/retry";
    let (s, t) = call("POST", retry).send(&api).await;
    assert_eq!((s, &t["state"]), (StatusCode::OK, &json!("pending")), "{t}");
    let (s, v) = call("POST", retry).send(&api).await;
    assert_eq!(s, StatusCode::CONFLICT, "only dead tasks retry: {v}");
    let (_, dead) = call("GET", "/v1/accounts/acme/dead-tasks").send(&api).await;
    assert_eq!(dead["items"], json!([]));
}

/// Random bodies, headers and path segments on every route: never a 500,
/// never a panic, every error in the API's shape.
#[test]
fn malformed_input_never_causes_a_500() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(api());
    let endpoint = rt.block_on(create_endpoint(&api, "acme"));
    let eid = endpoint["id"].as_str().unwrap().to_string();
    let json_value = prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(|b| json!(b)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        ".{0,40}".prop_map(|s| json!(s)),
    ];
    let field = prop_oneof![
        Just("url"),
        Just("event_types"),
        Just("secret"),
        Just("ordered"),
        Just("rate_limit_per_s"),
        Just("description"),
        Just("type"),
        Just("payload"),
        Just("kind"),
        Just("id"),
        Just("delay_seconds"),
        Just("reason"),
        Just("endpoint_id"),
        Just("dead_since"),
        Just("dead_until"),
        Just("other"),
    ];
    let object = proptest::collection::vec((field, json_value), 0..6).prop_map(|kv| {
        let mut m = serde_json::Map::new();
        for (k, v) in kv {
            m.insert(k.to_string(), v);
        }
        Value::Object(m).to_string()
    });
    let body = prop_oneof![
        object,
        ".{0,200}",
        proptest::collection::vec(any::<u8>(), 0..100)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned())
    ];
    let route = prop_oneof![
        Just(("POST", "/v1/accounts/{a}/endpoints".to_string())),
        Just(("PATCH", format!("/v1/accounts/{{a}}/endpoints/{eid}"))),
        Just((
            "POST",
            format!("/v1/accounts/{{a}}/endpoints/{eid}/rotate-secret")
        )),
        Just((
            "POST",
            format!("/v1/accounts/{{a}}/endpoints/{eid}/disable")
        )),
        Just(("POST", "/v1/accounts/{a}/events".to_string())),
        Just(("POST", "/v1/accounts/{a}/deliveries/replay".to_string())),
        Just(("POST", "/v1/accounts/{a}/tasks".to_string())),
        Just((
            "GET",
            "/v1/accounts/{a}/deliveries?limit={s}&state={s}&cursor={s}".to_string()
        )),
        Just(("GET", "/v1/accounts/{a}/usage?from={s}&to={s}".to_string())),
        Just(("GET", "/v1/accounts/{a}/endpoints/{s}".to_string())),
        Just(("GET", "/v1/accounts/{a}/tasks/{s}".to_string())),
    ];
    let segment = "[a-zA-Z0-9%_.~-]{0,20}";
    let header = "[ -~]{0,60}";
    let mut runner = TestRunner::new(Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        ..Config::default()
    });
    runner
        .run(
            &(route, body, segment, segment, header, any::<bool>()),
            |(route, body, account, s, key, admin)| {
                let (method, path) = route;
                let account = if account.is_empty() {
                    "acme".to_string()
                } else {
                    account
                };
                let path = path.replace("{a}", &account).replace("{s}", &s);
                let token = if admin {
                    ADMIN.to_string()
                } else {
                    key.clone()
                };
                let (status, v) = rt.block_on(async {
                    let mut c = call(method, path.clone()).raw(body.clone(), "application/json");
                    c.token = Some(&token);
                    c = c.header("idempotency-key", &key);
                    c.send(&api).await
                });
                if status.is_server_error() {
                    return Err(TestCaseError::fail(format!(
                        "{method} {path} {body:?} gave {status}: {v}"
                    )));
                }
                if status.is_client_error() {
                    let code = v["error"]["code"].as_str().unwrap_or("");
                    if code.is_empty() {
                        return Err(TestCaseError::fail(format!(
                            "{method} {path}: unshaped error {v}"
                        )));
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The document is served without a token, is the one the code generates,
/// and every operation in it is routed and answers a status it documents.
#[tokio::test]
async fn the_openapi_document_is_served_and_every_operation_in_it_is_routed() {
    let api = api().await;
    let (s, served) = call("GET", "/v1/openapi.json").token(None).send(&api).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        served,
        serde_json::to_value(api::openapi_document()).unwrap()
    );
    assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut operations = 0;
    for (path, item) in served["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let method = method.to_uppercase();
            let concrete = path
                .replace("{account}", "acme")
                .replace("{id}", "00000000-0000-0000-0000-000000000000");
            let (s, v) = call(&method, concrete).send(&api).await;
            let what = format!("{method} {path} answered {s}: {v}");
            assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{what}");
            assert_ne!(v["error"]["message"], "route not found", "{what}");
            assert!(op["responses"].get(s.as_str()).is_some(), "{what}");
            if path.starts_with("/v1/accounts/") || path.starts_with("/v1/sessions") {
                assert!(op["security"].is_array(), "{what}: no security");
                assert!(op["responses"].get("401").is_some(), "{what}: no 401");
            }
            operations += 1;
        }
    }
    assert_eq!(operations, 46, "every route is described");
    // Every link leads to an operation of the document.
    let ids: Vec<&Value> = served["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .map(|op| &op["operationId"])
        .collect();
    let mut links = 0;
    for item in served["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for response in op["responses"].as_object().unwrap().values() {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    assert!(ids.contains(&&link["operationId"]), "{link}");
                    links += 1;
                }
            }
        }
    }
    assert!(links >= 11, "creations link to what they created ({links})");
}

/// Concurrent publishes are written in groups (one transaction each); a bad
/// one among them fails alone and every good one is stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_fail_only_the_bad_one() {
    let api = api().await;
    let too_long = "t".repeat(300);
    let calls = (0..40).map(|i| {
        let event_type = if i == 17 {
            too_long.clone()
        } else {
            format!("order.{i}")
        };
        call("POST", "/v1/accounts/acme/events")
            .json(json!({"type": event_type, "payload": {"i": i}}))
            .send(&api)
    });
    let answers = futures::future::join_all(calls).await;
    let mut ids = std::collections::HashSet::new();
    for (i, (s, v)) in answers.iter().enumerate() {
        if i == 17 {
            assert_eq!(*s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        } else {
            assert_eq!(*s, StatusCode::ACCEPTED, "{i}: {v}");
            assert!(ids.insert(v["id"].as_str().unwrap().to_string()));
        }
    }
    let (s, page) = call("GET", "/v1/accounts/acme/events?limit=1000")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    let stored: std::collections::HashSet<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        stored, ids,
        "every accepted event once, the bad one not at all"
    );
}

/// Past 30 unknown bearer tokens in a minute, an address's unknown tokens
/// are answered `429` with `Retry-After`, whether or not they look like a
/// key; its valid tokens (the admin's and an account key, as behind a proxy
/// or a NAT that others share) still get in, and another address is not
/// affected.
#[tokio::test]
async fn unknown_bearer_tokens_are_limited_per_address_valid_ones_are_not() {
    let api = api().await;
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let key = key["key"].as_str().unwrap().to_string();
    let bad = "192.0.2.7:40000";
    for i in 0..api::auth::BEARER_FAILURES {
        let (s, _) = call("GET", "/v1/accounts/acme/endpoints")
            .token(Some("cpk_wrong"))
            .from(bad)
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "failure {i}");
    }
    let unknown_key = api::generate_token("cpk_");
    for token in ["cpk_wrong", unknown_key.as_str()] {
        let ((s, v), h) = call("GET", "/v1/accounts/acme/endpoints")
            .token(Some(token))
            .from(bad)
            .send_full(&api)
            .await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{token}: {v}");
        assert_error(&v, "too_many_requests");
        let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
    }
    for (who, token) in [("the admin", ADMIN), ("an account key", key.as_str())] {
        let (s, v) = call("GET", "/v1/accounts/acme/endpoints")
            .token(Some(token))
            .from(bad)
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::OK, "{who} from the limited address: {v}");
    }
    let (s, _) = call("GET", "/v1/accounts/acme/endpoints")
        .token(Some("cpk_wrong"))
        .from("192.0.2.8:40000")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "another address");
}

#[tokio::test]
async fn quotas_refuse_what_an_account_may_not_hold_naming_the_setting() {
    let api = api_configured(axum::Router::new(), |c| {
        c.quotas = api::Quotas {
            endpoints: 2,
            event_types: 2,
            schema_bytes: 2048,
        }
    })
    .await;
    create_endpoint(&api, "acme").await;
    create_endpoint(&api, "acme").await;
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/third"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("CONTROLPLANE_QUOTA_ENDPOINTS"),
        "{v}"
    );
    // Another account has its own quota.
    create_endpoint(&api, "other").await;

    let put = |name: &str, schema: Value| {
        call("PUT", format!("/v1/accounts/acme/event-types/{name}"))
            .json(json!({"description": "d", "schema": schema}))
    };
    let small = json!({"type": "object"});
    for name in ["a.one", "a.two"] {
        let (s, v) = put(name, small.clone()).send(&api).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    // Replacing a registered type is not one more.
    let (s, v) = put("a.two", small.clone()).send(&api).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = put("a.three", small.clone()).send(&api).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("CONTROLPLANE_QUOTA_EVENT_TYPES"));
    let big = json!({"type": "object", "description": "x".repeat(2100)});
    let (s, v) = put("a.two", big).send(&api).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("CONTROLPLANE_QUOTA_SCHEMA_BYTES"));
    let (s, v) = call("GET", "/v1/accounts/acme/event-types/a.two")
        .send(&api)
        .await;
    assert_eq!(
        (s, &v["schema"]),
        (StatusCode::OK, &small),
        "nothing replaced"
    );
}

#[tokio::test]
async fn endpoints_and_event_types_are_listed_a_page_at_a_time() {
    let api = api().await;
    for _ in 0..5 {
        create_endpoint(&api, "acme").await;
    }
    // The order of the whole listing: by creation, then id.
    let (_, all) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    let ids: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 5);
    for name in ["t.c", "t.a", "t.e", "t.b", "t.d"] {
        let (s, v) = call("PUT", format!("/v1/accounts/acme/event-types/{name}"))
            .json(json!({"description": "d"}))
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    for (path, field, want) in [
        ("/v1/accounts/acme/endpoints", "id", ids.clone()),
        (
            "/v1/accounts/acme/event-types",
            "name",
            ["t.a", "t.b", "t.c", "t.d", "t.e"]
                .map(String::from)
                .to_vec(),
        ),
    ] {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let url = match &cursor {
                Some(c) => format!("{path}?limit=2&cursor={c}"),
                None => format!("{path}?limit=2"),
            };
            let (s, v) = call("GET", url).send(&api).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            let items = v["items"].as_array().unwrap();
            assert!(items.len() <= 2);
            seen.extend(items.iter().map(|i| i[field].as_str().unwrap().to_string()));
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(seen, want, "{path}");
        let (s, v) = call("GET", format!("{path}?limit=0")).send(&api).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        let (_, v) = call("GET", path).send(&api).await;
        assert_eq!(
            v["items"].as_array().unwrap().len(),
            5,
            "one page of the default 100"
        );
    }
}

/// What an admin reads of an account: to tell that a request wrote nothing.
async fn everything_of(api: &Api, account: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    for what in [
        "endpoints",
        "event-types",
        "events",
        "deliveries",
        "tasks?state=pending",
        "tasks?state=dead",
        "alerts",
        "portal-links",
    ] {
        let (s, v) = call("GET", format!("/v1/accounts/{account}/{what}"))
            .send(api)
            .await;
        assert_eq!(s, StatusCode::OK, "{what}: {v}");
        seen.push(v);
    }
    seen
}

/// DESIGN 3.11, generated from the OpenAPI document so that a new route is
/// covered the day it is added: every route, called with no token, a junk
/// token, a revoked key and another account's key, with and without an
/// `Idempotency-Key`, is refused (`401`, or `404` for the other account's
/// key) and writes nothing: no row, and no idempotency record (a repeat is
/// never a replay).
#[tokio::test]
async fn anonymous_and_cross_account_requests_write_nothing_on_any_route() {
    let api = api().await;
    let endpoint = create_endpoint(&api, "acme").await;
    let endpoint_id = endpoint["id"].as_str().unwrap().to_string();
    let key_of = |account: &'static str| {
        let api = &api;
        async move {
            let (s, k) = call("POST", format!("/v1/accounts/{account}/keys"))
                .send(api)
                .await;
            assert_eq!(s, StatusCode::CREATED, "{k}");
            k
        }
    };
    let other = key_of("globex").await["key"].as_str().unwrap().to_string();
    let revoked = key_of("acme").await;
    let (s, v) = call(
        "DELETE",
        format!("/v1/accounts/acme/keys/{}", revoked["id"].as_str().unwrap()),
    )
    .send(&api)
    .await;
    assert!(s.is_success(), "{v}");
    let revoked = revoked["key"].as_str().unwrap().to_string();
    let before = everything_of(&api, "acme").await;

    let doc = api::openapi_document();
    let open = ["/healthz", "/readyz", "/v1/openapi.json"];
    let mut routes = 0;
    // Each call from its own address: the failed-token limiter (30 a
    // minute per address) would otherwise answer 429, which writes
    // nothing either but hides the 401.
    let mut client = 0u32;
    for (template, methods) in doc["paths"].as_object().unwrap() {
        if open.contains(&template.as_str()) {
            continue;
        }
        let path = template
            .replace("{account}", "acme")
            .replace("{id}", &endpoint_id)
            .replace("{name}", "order.paid");
        let path = regex_free_fill(&path);
        for method in methods.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            routes += 1;
            for (who, token, expected) in [
                ("no token", None, StatusCode::UNAUTHORIZED),
                ("a junk token", Some("cpk_junk"), StatusCode::UNAUTHORIZED),
                (
                    "a revoked key",
                    Some(revoked.as_str()),
                    StatusCode::UNAUTHORIZED,
                ),
                (
                    "another account's key",
                    Some(other.as_str()),
                    StatusCode::NOT_FOUND,
                ),
            ] {
                for key in [None, Some("probe")] {
                    client += 1;
                    let addr = format!("10.{}.{}.1:4000", client / 256, client % 256);
                    let send = || {
                        let mut c = call(&method, path.clone()).token(token).from(&addr);
                        if method != "GET" && method != "DELETE" {
                            c = c.json(json!({}));
                        }
                        if let Some(k) = key {
                            c = c.header("idempotency-key", k);
                        }
                        c.send_full(&api)
                    };
                    let ((s, v), _) = send().await;
                    assert_eq!(s, expected, "{method} {path} with {who}: {v}");
                    let ((s, _), h) = send().await;
                    assert_eq!(s, expected, "{method} {path} with {who}, again");
                    assert!(
                        h.get("idempotent-replayed").is_none(),
                        "{method} {path} with {who} stored an answer"
                    );
                }
            }
        }
    }
    assert!(routes > 30, "every route of the document: {routes}");
    assert_eq!(
        everything_of(&api, "acme").await,
        before,
        "nothing was written"
    );
}

/// A path template's remaining `{param}`s, each filled with `x`.
fn regex_free_fill(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push('x');
            }
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

/// A revoked key replays nothing, and no stored answer holds a secret: the
/// repeat of a create under its key shows `null` for the secret.
#[tokio::test]
async fn a_revoked_key_replays_nothing_and_records_keep_no_secret() {
    let api = api().await;
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let token = key["key"].as_str().unwrap().to_string();
    let create = || {
        call("POST", "/v1/accounts/acme/endpoints")
            .token(Some(&token))
            .header("idempotency-key", "once")
            .json(json!({"url": "https://example.com/a"}))
    };
    let (s, first) = create().send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert!(first["secret"].as_str().unwrap().starts_with("whsec_"));
    let ((s, again), h) = create().send_full(&api).await;
    assert_eq!(
        (s, h.get("idempotent-replayed").unwrap().to_str().unwrap()),
        (StatusCode::CREATED, "true")
    );
    assert_eq!(again["id"], first["id"]);
    assert!(again["secret"].is_null(), "{again}");
    assert!(!again.to_string().contains("whsec_"));
    // The admin's key creation is replayed without the key.
    let admin_key = || call("POST", "/v1/accounts/acme/keys").header("idempotency-key", "k1");
    let (_, made) = admin_key().send(&api).await;
    let (_, replayed) = admin_key().send(&api).await;
    assert!(made["key"].as_str().unwrap().starts_with("cpk_"));
    assert_eq!(replayed["id"], made["id"]);
    assert!(replayed["key"].is_null() && !replayed.to_string().contains("cpk_"));

    let (s, v) = call(
        "DELETE",
        format!("/v1/accounts/acme/keys/{}", key["id"].as_str().unwrap()),
    )
    .send(&api)
    .await;
    assert!(s.is_success(), "{v}");
    let ((s, v), h) = create().send_full(&api).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert!(h.get("idempotent-replayed").is_none());
}

/// A request under a key whose client went away (its future dropped
/// mid-handler) frees the key at once: the retry runs instead of `409`.
#[tokio::test]
async fn a_request_whose_client_gave_up_frees_its_key() {
    use tower::ServiceExt;
    let api = api().await;
    // Many endpoints make the batch's handler take a while.
    for _ in 0..90 {
        create_endpoint(&api, "acme").await;
    }
    let events: Vec<Value> = (0..100)
        .map(|i| json!({"type": "order.paid", "payload": {"i": i}}))
        .collect();
    let body = json!({"events": events}).to_string();
    let request = || {
        axum::http::Request::builder()
            .method("POST")
            .uri("/v1/accounts/acme/events/batch")
            .header("authorization", format!("Bearer {ADMIN}"))
            .header("content-type", "application/json")
            .header("idempotency-key", "gave-up")
            .body(axum::body::Body::from(body.clone()))
            .unwrap()
    };
    // The client gives up after 1 ms: the server drops the request.
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(1),
        api.app.clone().oneshot(request()),
    )
    .await;
    assert!(gave_up.is_err(), "the request had to be cut short");
    let mut answered = None;
    for _ in 0..200 {
        let r = api.app.clone().oneshot(request()).await.unwrap();
        if r.status() != StatusCode::CONFLICT {
            answered = Some(r.status());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(answered, Some(StatusCode::ACCEPTED), "the key was freed");
}

/// One batch may create at most 10,000 deliveries: 100 events to 101
/// endpoints is refused whole, naming the bound, and stores nothing.
#[tokio::test]
async fn a_batch_that_fans_out_past_the_bound_is_refused_whole() {
    let api = api().await;
    for _ in 0..101 {
        create_endpoint(&api, "acme").await;
    }
    let events = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"type": "order.paid", "payload": {"i": i}}))
            .collect()
    };
    let (s, v) = call("POST", "/v1/accounts/acme/events/batch")
        .json(json!({"events": events(100)}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10100 deliveries"),
        "{v}"
    );
    let (_, listed) = call("GET", "/v1/accounts/acme/events").send(&api).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 0);
    let (s, v) = call("POST", "/v1/accounts/acme/events/batch")
        .json(json!({"events": events(99)}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
}

/// The task API runs only tenant kinds: a kind the service reserves (an
/// erasure) is refused to an account key and to the admin alike; the one
/// service kind tenants use (a delayed publish) is taken.
#[tokio::test]
async fn the_task_api_refuses_the_kinds_the_service_reserves() {
    let api = api().await;
    let (_, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    let token = key["key"].as_str().unwrap().to_string();
    for who in [Some(token.as_str()), Some(ADMIN)] {
        for kind in ["control-plane.erase", "control-plane.recover"] {
            let (s, v) = call("POST", "/v1/accounts/acme/tasks")
                .token(who)
                .json(json!({"kind": kind, "delay_seconds": 25}))
                .send(&api)
                .await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{kind}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("reserved"));
        }
    }
    let (s, v) = call("POST", "/v1/accounts/acme/tasks")
        .token(Some(&token))
        .json(json!({"kind": "control-plane.publish", "payload": {"type": "t", "payload": {}}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, pending) = call("GET", "/v1/accounts/acme/tasks?state=pending")
        .send(&api)
        .await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 1, "{pending}");
}

/// An anonymous request is answered before its body is read: a client
/// that sends a head and then trickles (or never sends) its body gets its
/// `401` at once, and holds no body in the server's memory.
#[tokio::test]
async fn an_anonymous_body_is_never_read() {
    use tower::ServiceExt;
    let api = api().await;
    for token in [None, Some("Bearer cpk_junk")] {
        let chunk = futures::stream::once(async {
            Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{\"url\":"))
        });
        let never_ends = futures::StreamExt::chain(chunk, futures::stream::pending());
        let mut b = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/accounts/acme/endpoints")
            .header("content-type", "application/json")
            .header("idempotency-key", "slow");
        if let Some(t) = token {
            b = b.header("authorization", t);
        }
        let req = b.body(axum::body::Body::from_stream(never_ends)).unwrap();
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            api.app.clone().oneshot(req),
        )
        .await
        .expect("answered without waiting for the body")
        .unwrap();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{token:?}");
    }
}

/// A batch publish names the event that fails its type's schema as
/// `events[i]`, as it names every other invalid event, and stores none.
#[tokio::test]
async fn a_batch_names_the_event_that_fails_its_schema() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    let schema = json!({"type": "object", "required": ["id"]});
    let (s, v) = call("PUT", "/v1/accounts/acme/event-types/order.paid")
        .json(json!({"description": "d", "schema": schema}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call("POST", "/v1/accounts/acme/events/batch")
        .json(json!({"events": [
            {"type": "order.paid", "payload": {"id": 1}},
            {"type": "order.paid", "payload": {"no": 2}},
        ]}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("events[1]: "), "{message}");
    let (_, events) = call("GET", "/v1/accounts/acme/events").send(&api).await;
    assert_eq!(events["items"].as_array().unwrap().len(), 0);
}

/// Creates that race at the quota's edge cannot pass it together: 64
/// concurrent creates with room for one make exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_that_race_at_the_quota_make_no_more_than_it() {
    let api =
        std::sync::Arc::new(api_configured(axum::Router::new(), |c| c.quotas.endpoints = 5).await);
    for _ in 0..4 {
        create_endpoint(&api, "acme").await;
    }
    let racing: Vec<_> = (0..64)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move {
                call("POST", "/v1/accounts/acme/endpoints")
                    .json(json!({"url": "https://example.com/hook"}))
                    .send(&api)
                    .await
                    .0
            })
        })
        .collect();
    let mut created = 0;
    for r in racing {
        if r.await.unwrap() == StatusCode::CREATED {
            created += 1;
        }
    }
    assert_eq!(created, 1, "room for one");
    let (_, v) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 5);
}

/// A framework rejection (a body of the wrong type) under an
/// `Idempotency-Key` keeps the API's error shape when replayed: the answer
/// is stored as the client saw it (schemathesis found a plain-text replay
/// under `content-type: application/json`).
#[tokio::test]
async fn a_replayed_rejection_keeps_the_error_shape() {
    let api = api().await;
    let endpoint = create_endpoint(&api, "acme").await;
    let path = format!(
        "/v1/accounts/acme/endpoints/{}/disable",
        endpoint["id"].as_str().unwrap()
    );
    for round in 0..2 {
        let ((s, v), h) = call("POST", path.as_str())
            .header("idempotency-key", "rejected")
            .raw("null", "application/json")
            .send_full(&api)
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "round {round}: {v}");
        assert_error(&v, "invalid_input");
        assert_eq!(h.get("idempotent-replayed").is_some(), round == 1);
    }
}
