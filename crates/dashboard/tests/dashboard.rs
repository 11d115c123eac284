//! The dashboard beside the API in process over the embedded store:
//! sessions, CSRF, isolation, and what each page shows and does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane_core::{
    AttemptReport, ClaimRequest, DeliveryOutcome, TaskClaimRequest, TaskHeartbeat,
};
use serde_json::json;
use tower::ServiceExt;

#[path = "../../api/tests/support/mod.rs"]
mod support;
use support::*;

async fn api() -> Api {
    api_with(dashboard::router()).await
}

/// Leases every queued endpoint recovery, as a task runner would.
async fn claim_recoveries(api: &Api) -> Vec<control_plane_core::ClaimedTask> {
    let kinds = vec![control_plane_core::RECOVER_TASK.to_string()];
    let req = TaskClaimRequest::new("w", kinds, 10, std::time::Duration::from_secs(30)).unwrap();
    api.store.workflow_claim(req).await.unwrap()
}

#[tokio::test]
async fn endpoint_filters_are_checked_shown_and_applied() {
    let api = api().await;
    // A malformed filter is refused, naming where, and creates nothing.
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/hook", "filter": {"data.amount": {"$gtx": 1}}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "invalid_input");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("data.amount.$gtx"),
        "{v}"
    );
    let (_, list) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert_eq!(list["items"], json!([]));

    let filter = json!({"data.amount": {"$gte": 100}});
    let (s, e) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/hook", "filter": filter}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    assert_eq!(e["filter"], filter);
    let path = format!("/v1/accounts/acme/endpoints/{}", e["id"].as_str().unwrap());
    let publish = |amount: i64| {
        call("POST", "/v1/accounts/acme/events")
            .json(json!({"type": "order.paid", "payload": {"amount": amount}}))
    };
    let (_, small) = publish(5).send(&api).await;
    assert_eq!(small["deliveries"], json!([]), "{small}");
    let (_, big) = publish(500).send(&api).await;
    assert_eq!(big["deliveries"].as_array().map(Vec::len), Some(1), "{big}");

    // A bad change is refused and changes nothing; null removes the filter.
    let (s, v) = call("PATCH", &path)
        .json(json!({"filter": {"$or": []}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (_, now) = call("GET", &path).send(&api).await;
    assert_eq!(now["filter"], filter, "{now}");
    let (s, v) = call("PATCH", &path)
        .json(json!({"filter": null}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["filter"].is_null(), "{v}");
    let (_, small) = publish(5).send(&api).await;
    assert_eq!(
        small["deliveries"].as_array().map(Vec::len),
        Some(1),
        "{small}"
    );

    // The dashboard shows a filter, escaped.
    let (s, _) = call("PATCH", &path)
        .json(json!({"filter": {"data.note": "<script>"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    let cookie = sign_in(&api, ADMIN).await;
    let (s, _, page) = ui(&api, "GET", "/ui/a/acme/endpoints", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("filter: <code>{&quot;data.note&quot;:&quot;&lt;script&gt;&quot;}</code>"),
        "{page}"
    );
    assert!(!page.contains("<script>"), "{page}");
}

/// Custom headers are write-only: the answers list their names, never a
/// value; bad ones are 422 and change nothing; PATCH replaces them.
#[tokio::test]
async fn custom_headers_are_write_only_and_checked() {
    let api = api().await;
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/hook", "headers": {"Host": "evil"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "invalid_input");
    let (s, e) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/hook",
                     "headers": {"X-Api-Key": "value-never-shown", "authorization": "Bearer t0k"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    assert_eq!(e["header_names"], json!(["authorization", "x-api-key"]));
    let path = format!("/v1/accounts/acme/endpoints/{}", e["id"].as_str().unwrap());
    for (_, v) in [
        call("GET", &path).send(&api).await,
        call("GET", "/v1/accounts/acme/endpoints").send(&api).await,
    ] {
        let text = v.to_string();
        assert!(
            !text.contains("value-never-shown") && !text.contains("t0k"),
            "{text}"
        );
    }
    let cookie = sign_in(&api, ADMIN).await;
    let (_, _, page) = ui(&api, "GET", "/ui/a/acme/endpoints", Some(&cookie), None).await;
    assert!(page.contains("headers: authorization, x-api-key"), "{page}");
    assert!(
        !page.contains("value-never-shown") && !page.contains("t0k"),
        "{page}"
    );
    let (s, _) = call("PATCH", &path)
        .json(json!({"headers": {"webhook-signature": "x"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, v) = call("PATCH", &path)
        .json(json!({"headers": {"X-Tenant": "t-9"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["header_names"], json!(["x-tenant"]));
    let (_, v) = call("PATCH", &path)
        .json(json!({"headers": {}}))
        .send(&api)
        .await;
    assert_eq!(v["header_names"], json!([]));
}

/// A client certificate (mTLS, ADR 0048) is write-only: the answers and
/// the dashboard show its subject, issuer, expiry and fingerprint, never
/// the key; a key that is not the certificate's, a certificate that is not
/// PEM or an `http://` endpoint is 422 and stores nothing; another
/// account's key reads nothing of it; PATCH `null` removes it.
#[tokio::test]
async fn client_certificates_are_write_only_checked_and_shown() {
    let api = api().await;
    let cert = include_str!("../../../testdata/mtls/client.pem");
    let key = include_str!("../../../testdata/mtls/client.key");
    let other_key = include_str!("../../../testdata/mtls/other.key");
    let key_line = key.lines().nth(1).unwrap();
    let create = |url: &str, certificate: &str, key: &str| {
        call("POST", "/v1/accounts/acme/endpoints")
            .json(json!({"url": url, "client_tls": {"certificate": certificate, "key": key}}))
    };
    for (url, certificate, k, says) in [
        (
            "https://example.com/hook",
            cert,
            other_key,
            "not the key of the certificate",
        ),
        (
            "https://example.com/hook",
            "junk",
            key,
            "client_tls.certificate",
        ),
        (
            "http://example.com/hook",
            cert,
            key,
            "https:// endpoints only",
        ),
    ] {
        let (s, v) = create(url, certificate, k).send(&api).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_error(&v, "invalid_input");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{v}"
        );
        assert!(!v.to_string().contains(key_line), "{v}");
    }
    let (_, list) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert_eq!(list["items"], json!([]), "nothing stored");

    let (s, e) = create("https://example.com/hook", cert, key)
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let subject = e["client_tls"]["subject"].as_str().unwrap().to_string();
    assert!(subject.contains("CN=control-plane mTLS test client"), "{e}");
    assert!(
        e["client_tls"]["issuer"]
            .as_str()
            .unwrap()
            .contains("test CA"),
        "{e}"
    );
    assert!(
        e["client_tls"]["not_after"]
            .as_str()
            .unwrap()
            .starts_with("21"),
        "{e}"
    );
    assert_eq!(
        e["client_tls"]["fingerprint_sha256"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    let path = format!("/v1/accounts/acme/endpoints/{}", e["id"].as_str().unwrap());
    for (s, v) in [
        (StatusCode::CREATED, e.clone()),
        call("GET", &path).send(&api).await,
        call("GET", "/v1/accounts/acme/endpoints").send(&api).await,
    ] {
        assert!(s.is_success(), "{v}");
        let text = v.to_string();
        assert!(
            !text.contains(key_line) && !text.contains("PRIVATE KEY"),
            "{text}"
        );
        assert!(text.contains(&subject), "{text}");
    }
    let cookie = sign_in(&api, ADMIN).await;
    let (_, _, page) = ui(&api, "GET", "/ui/a/acme/endpoints", Some(&cookie), None).await;
    assert!(
        page.contains("client certificate: CN=control-plane mTLS test client"),
        "{page}"
    );
    assert!(page.contains("expires 21"), "{page}");
    assert!(
        !page.contains(key_line) && !page.contains("PRIVATE KEY"),
        "{page}"
    );

    // Another tenant's key reaches nothing of it.
    let (_, other) = call("POST", "/v1/accounts/globex/keys").send(&api).await;
    let other = other["key"].as_str().unwrap().to_string();
    let foreign = path.replace("/acme/", "/globex/");
    for p in [path.as_str(), foreign.as_str()] {
        let (s, v) = call("GET", p).token(Some(&other)).send(&api).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{p}: {v}");
        assert!(!v.to_string().contains(&subject), "{v}");
    }

    let (s, v) = call("PATCH", &path)
        .json(json!({"client_tls": {"certificate": cert, "key": other_key}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, v) = call("PATCH", &path)
        .json(json!({"client_tls": null}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["client_tls"], json!(null));
}

/// A delivered delivery is resent through the API and the dashboard: 409
/// while it is pending, 200 and pending again once delivered.
#[tokio::test]
async fn delivered_deliveries_are_resent_by_api_and_dashboard() {
    let api = api().await;
    create_endpoint(&api, "acme").await;
    let (_, published) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.paid", "payload": {}}))
        .send(&api)
        .await;
    let id = published["deliveries"][0].as_str().unwrap().to_string();
    let resend = format!("/v1/accounts/acme/deliveries/{id}/resend");
    let (s, v) = call("POST", &resend).send(&api).await;
    assert_eq!(s, StatusCode::CONFLICT, "pending is not resent: {v}");
    assert_error(&v, "conflict");
    let deliver = || async {
        let c = api
            .store
            .delivery_claim(ClaimRequest::new("w", 1, std::time::Duration::from_secs(30)).unwrap())
            .await
            .unwrap();
        assert_eq!(c.len(), 1);
        let ok = DeliveryOutcome::Delivered(AttemptReport {
            status_code: Some(200),
            error: None,
            latency_ms: 1,
            response_body: Some("<b>thanks</b>".into()),
        });
        api.store
            .delivery_record_outcome(&c[0].lease, ok)
            .await
            .unwrap();
    };
    deliver().await;
    let (s, v) = call("POST", &resend).send(&api).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["state"], "pending");
    deliver().await;

    let cookie = sign_in(&api, ADMIN).await;
    let page_path = format!("/ui/a/acme/deliveries/{id}");
    let (_, _, page) = ui(&api, "GET", &page_path, Some(&cookie), None).await;
    assert!(
        page.contains("id=\"resend\""),
        "a delivered one has the button: {page}"
    );
    assert!(
        page.contains("&lt;b&gt;thanks&lt;/b&gt;"),
        "the answer, escaped: {page}"
    );
    assert!(!page.contains("<b>thanks"), "{page}");
    let (_, d) = call("GET", format!("/v1/accounts/acme/deliveries/{id}"))
        .send(&api)
        .await;
    assert_eq!(d["attempt_log"][0]["response_body"], "<b>thanks</b>", "{d}");
    let form = format!("csrf={}", csrf_of(&page));
    let (s, h, _) = ui(
        &api,
        "POST",
        &format!("{page_path}/resend"),
        Some(&cookie),
        Some(form),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(h["location"].to_str().unwrap().ends_with("?resent=1"));
    let (_, _, page) = ui(&api, "GET", &page_path, Some(&cookie), None).await;
    assert!(
        page.contains("<dd id=\"fact-state\"><span class=\"st st-wait\">pending</span>"),
        "{page}"
    );
    assert!(
        !page.contains("id=\"resend\""),
        "no button while pending: {page}"
    );
}

/// The catalogue: a registered type's schema refuses a bad publish with
/// 422 naming the path and storing nothing; the example is sent to one
/// endpoint by the API and by the dashboard, whose page shows the schema
/// escaped.
#[tokio::test]
async fn the_event_type_catalogue_checks_publishes_and_sends_examples() {
    let api = api().await;
    let schema = json!({
        "type": "object",
        "required": ["id"],
        "properties": {"id": {"type": "string"}, "note": {"type": "string", "description": "<i>"}}
    });
    let path = "/v1/accounts/acme/event-types/order.created";
    let (s, v) = call("PUT", path)
        .json(json!({"description": "An order", "schema": schema, "example": {"id": 5}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("example"),
        "{v}"
    );
    let (s, v) = call("PUT", path)
        .json(json!({"description": "An order", "schema": schema, "example": {"id": "o-1"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["name"], "order.created");
    assert_eq!(v["schema"], schema);
    let (s, v) = call("GET", "/v1/accounts/acme/event-types")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["items"][0]["example"], json!({"id": "o-1"}), "{v}");
    let (s, _) = call("GET", "/v1/accounts/acme/event-types/nope")
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let endpoint = create_endpoint(&api, "acme").await;
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.created", "payload": {"id": 7}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("at /id"),
        "{v}"
    );
    let (_, events) = call("GET", "/v1/accounts/acme/events").send(&api).await;
    assert_eq!(events["items"], json!([]), "nothing stored");
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.created", "payload": {"id": "o-2"}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");

    let send = format!(
        "/v1/accounts/acme/endpoints/{}/send-example",
        endpoint["id"].as_str().unwrap()
    );
    let (s, v) = call("POST", &send)
        .json(json!({"type": "order.created"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let delivery = v["deliveries"][0].as_str().unwrap().to_string();
    let (_, event) = call(
        "GET",
        format!("/v1/accounts/acme/events/{}", v["id"].as_str().unwrap()),
    )
    .send(&api)
    .await;
    assert!(
        event["body"].as_str().unwrap().contains("\"o-1\""),
        "{event}"
    );
    let (s, _) = call("POST", &send)
        .json(json!({"type": "no.such"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let cookie = sign_in(&api, ADMIN).await;
    let (s, _, page) = ui(&api, "GET", "/ui/a/acme/event-types", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("&quot;&lt;i&gt;&quot;"),
        "the schema, escaped: {page}"
    );
    assert!(!page.contains("<i>"), "{page}");
    assert!(page.contains("id=\"send-example-order.created\""), "{page}");
    let form = format!(
        "csrf={}&endpoint={}",
        csrf_of(&page),
        endpoint["id"].as_str().unwrap()
    );
    let (s, h, _) = ui(
        &api,
        "POST",
        "/ui/a/acme/event-types/order.created/send-example",
        Some(&cookie),
        Some(form),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let to = h["location"].to_str().unwrap();
    assert!(to.starts_with("/ui/a/acme/deliveries/"), "{to}");
    assert!(!to.ends_with(&delivery), "a new delivery each time: {to}");

    let (s, _) = call("DELETE", path).send(&api).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.created", "payload": {"id": 7}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "unchecked once removed");
}

/// Recovering an endpoint queues its task, which the task API shows; a
/// window the wrong way round is 422 and an unknown endpoint 404, queuing
/// nothing.
#[tokio::test]
async fn an_endpoint_recovery_is_queued_as_a_task() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let path = format!(
        "/v1/accounts/acme/endpoints/{}/recover",
        e["id"].as_str().unwrap()
    );
    let (s, v) = call("POST", &path)
        .json(json!({"since": 200, "until": 100}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "invalid_input");
    let unknown = "/v1/accounts/acme/endpoints/0b8e9c1e-5f7a-4c1e-9a59-1f0d2f3a4b5c/recover";
    let (s, v) = call("POST", unknown)
        .json(json!({"since": 0}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, task) = call("POST", &path)
        .json(json!({"since": 0}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{task}");
    assert_eq!(task["kind"], "control-plane.recover");
    assert_eq!(task["state"], "pending");
    assert_eq!(task["payload"]["endpoint_id"], e["id"]);
    assert_eq!(task["payload"]["since_ms"], 0);
    assert_eq!(
        task["payload"]["include_delivered"], false,
        "by default what failed goes again, not what was delivered"
    );
    let (s, whole) = call("POST", &path)
        .json(json!({"since": 0, "include_delivered": true}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{whole}");
    assert_eq!(whole["payload"]["include_delivered"], true);
    let id = task["id"].as_str().unwrap();
    let (s, again) = call("GET", format!("/v1/accounts/acme/tasks/{id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["id"], task["id"]);

    // The dashboard's form queues the same task and leads to it.
    let cookie = sign_in(&api, ADMIN).await;
    let (_, _, page) = ui(&api, "GET", "/ui/a/acme/endpoints", Some(&cookie), None).await;
    let endpoint = e["id"].as_str().unwrap();
    assert!(
        page.contains(&format!("id=\"recover-{endpoint}\"")),
        "{page}"
    );
    let action = format!("/ui/a/acme/endpoints/{endpoint}/recover");
    let form = |hours: u32| Some(format!("csrf={}&hours={hours}", csrf_of(&page)));
    let (s, _, _) = ui(&api, "POST", &action, Some(&cookie), form(5)).await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "only the offered windows"
    );
    let (s, h, _) = ui(&api, "POST", &action, Some(&cookie), form(24)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let to = h["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/ui/a/acme/tasks?id=recover-"), "{to}");
    let (s, _, page) = ui(&api, "GET", &to, Some(&cookie), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("control-plane.recover"), "{page}");
    // Its window is shown as times, its endpoint as a link.
    let summary = page
        .split("id=\"task-summary\">")
        .nth(1)
        .unwrap_or_default();
    assert!(
        summary.starts_with("Recovers endpoint <a href=\"/ui/a/acme/endpoints/")
            && summary.contains("Z to ")
            && summary.contains("what failed or never went"),
        "{page}"
    );

    // While a worker runs the recovery, its progress shows in the API and
    // on the dashboard (escaped).
    let claimed = claim_recoveries(&api).await;
    let running = claimed.iter().find(|c| c.task.id.as_str() == id).unwrap();
    let progress = json!({"events": 200, "matched": 3, "created": 1, "resent": 2, "in_queue": 0, "after": 17, "note": "<b>"});
    api.store
        .workflow_heartbeat(
            &running.lease,
            TaskHeartbeat::with_progress(std::time::Duration::from_secs(30), progress.clone())
                .unwrap(),
        )
        .await
        .unwrap();
    let (_, seen) = call("GET", format!("/v1/accounts/acme/tasks/{id}"))
        .send(&api)
        .await;
    assert_eq!(seen["state"], "leased");
    assert_eq!(seen["progress"], progress);
    let (_, _, page) = ui(
        &api,
        "GET",
        &format!("/ui/a/acme/tasks?id={id}"),
        Some(&cookie),
        None,
    )
    .await;
    assert!(page.contains("id=\"task-progress\""), "{page}");
    assert!(
        page.contains("&quot;events&quot;:200") && page.contains("&lt;b&gt;"),
        "{page}"
    );
    assert!(!page.contains("<b>"), "{page}");
}

/// A session used after a while gets its idle expiry moved an hour ahead
/// (here one stored to end in two minutes).
#[tokio::test]
async fn using_a_session_moves_its_idle_expiry() {
    let api = api().await;
    let id = "ab".repeat(32);
    let req = control_plane_core::SessionCreateRequest::new(
        api::hash_token(&id),
        api::hash_token(ADMIN),
        "cd".repeat(32),
        std::time::Duration::from_secs(120),
    )
    .unwrap();
    let before = api.store.session_create(req).await.unwrap();
    let (s, _, _) = ui(
        &api,
        "GET",
        "/ui/a/acme",
        Some(&format!("cp_session={id}")),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let after = api
        .store
        .session_get(&api::hash_token(&id))
        .await
        .unwrap()
        .unwrap();
    assert!(
        after.expires_at.as_millis() >= before.created_at.as_millis() + 3_500_000,
        "{before:?} -> {after:?}"
    );
}

/// The admin lists the live dashboard sessions and ends one: its cookie
/// opens nothing any more, on any replica; an account key sees no such route.
#[tokio::test]
async fn the_admin_lists_and_ends_dashboard_sessions() {
    let api = api().await;
    let cookie = sign_in(&api, ADMIN).await;
    let (s, v) = call("GET", "/v1/sessions").send(&api).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!(items[0]["signed_in_as"], "admin");
    let id = items[0]["id"].as_str().unwrap().to_string();
    let session_id = cookie.strip_prefix("cp_session=").unwrap();
    assert_ne!(id, session_id, "the listed id is not the cookie");
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED);
    let key = key["key"].as_str().unwrap().to_string();
    let (s, _) = call("GET", "/v1/sessions")
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "admin only");
    let (s, _) = call("DELETE", format!("/v1/sessions/{id}"))
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "admin only");
    let (s, _, _) = ui(&api, "GET", "/ui/a/acme", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::OK, "still signed in");
    let (s, _) = call("DELETE", format!("/v1/sessions/{id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = ui(&api, "GET", "/ui/a/acme", Some(&cookie), None).await;
    assert!(s.is_redirection(), "the ended session opens nothing: {s}");
    let (s, _) = call("DELETE", format!("/v1/sessions/{id}"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "already ended");
    let (_, v) = call("GET", "/v1/sessions").send(&api).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn dashboard_sessions_live_on_the_server_and_end_at_sign_out_or_revocation() {
    let api = api().await;
    let cookie = sign_in(&api, ADMIN).await;
    let id = cookie.strip_prefix("cp_session=").unwrap();
    let token_hex: String = ADMIN.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(
        id.len() == 64 && !id.contains(&token_hex) && !id.contains(ADMIN),
        "the cookie must hold a session id, not the token: {id}"
    );
    assert!(
        ui(
            &api,
            "GET",
            "/ui/a/acme",
            Some(&format!("cp_session={token_hex}")),
            None
        )
        .await
        .0
        .is_redirection(),
        "a cookie made from the token opens nothing"
    );
    let (s, _, page) = ui(&api, "GET", "/ui/a/acme/dead", Some(&cookie), None).await;
    assert_eq!(s, StatusCode::OK);
    let csrf = csrf_of(&page);
    assert_ne!(
        csrf,
        csrf_of(
            &ui(
                &api,
                "GET",
                "/ui/a/acme/dead",
                Some(&sign_in(&api, ADMIN).await),
                None
            )
            .await
            .2
        ),
        "two sessions share a CSRF token"
    );
    // A complete form with another CSRF token is refused as such (403), not
    // for a missing field.
    let (s, _, body) = ui(
        &api,
        "POST",
        "/ui/a/acme/dead/replay",
        Some(&cookie),
        Some(format!(
            "csrf={}&endpoint_id=&within_hours=",
            "0".repeat(64)
        )),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let (s, _, body) = ui(
        &api,
        "POST",
        "/ui/a/acme/dead/replay",
        Some(&cookie),
        Some(format!("csrf={csrf}&endpoint_id=&within_hours=")),
    )
    .await;
    assert!(s.is_redirection() || s == StatusCode::OK, "{s}: {body}");

    // Signing out ends the session on the server: the old cookie, replayed,
    // opens nothing.
    let (s, _, _) = ui(
        &api,
        "POST",
        "/ui/logout",
        Some(&cookie),
        Some(format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (s, h, _) = ui(&api, "GET", "/ui/a/acme", Some(&cookie), None).await;
    assert_eq!(
        (s, h["location"].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/ui/login"),
        "a signed-out session still works"
    );

    // A session of an account key ends when the key is revoked.
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let keyed = sign_in(&api, key["key"].as_str().unwrap()).await;
    assert_eq!(
        ui(&api, "GET", "/ui/a/acme", Some(&keyed), None).await.0,
        StatusCode::OK
    );
    let (s, _) = call(
        "DELETE",
        format!("/v1/accounts/acme/keys/{}", key["id"].as_str().unwrap()),
    )
    .send(&api)
    .await;
    assert!(s.is_success(), "{s}");
    assert_eq!(
        ui(&api, "GET", "/ui/a/acme", Some(&keyed), None).await.0,
        StatusCode::SEE_OTHER,
        "a revoked key's session still works"
    );
}

/// Past 10 failed sign-ins in a minute, an address's invalid tokens are
/// answered `429`; its valid ones (the admin's and an account key, as
/// behind a proxy or a NAT that others share) still sign in, the API's
/// bearer tokens are not affected, and another address is not limited.
#[tokio::test]
async fn failed_sign_ins_are_limited_valid_ones_are_not() {
    let api = api().await;
    let (s, key) = call("POST", "/v1/accounts/acme/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let key = key["key"].as_str().unwrap().to_string();
    for i in 0..10 {
        let (s, _, _) = ui(
            &api,
            "POST",
            "/ui/login",
            None,
            Some(format!("token=wrong{i}")),
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "failure {i}");
    }
    let unknown_key = api::generate_token("cpk_");
    for token in ["wrong", unknown_key.as_str()] {
        let (s, h, _) = ui(
            &api,
            "POST",
            "/ui/login",
            None,
            Some(format!("token={token}")),
        )
        .await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{token}");
        let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=61).contains(&wait), "{wait}");
    }
    // `sign_in` asserts the redirect into the dashboard and its cookie.
    sign_in(&api, ADMIN).await;
    sign_in(&api, &key).await;
    // The API's bearer tokens still work.
    let (s, _) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert_eq!(s, StatusCode::OK);
    // Another address is not limited: a wrong token there is just wrong.
    let other: std::net::SocketAddr = "192.0.2.9:1".parse().unwrap();
    let req = Request::builder()
        .method("POST")
        .uri("/ui/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .extension(axum::extract::ConnectInfo(other))
        .body(Body::from("token=wrong"))
        .unwrap();
    let resp = api.app.clone().oneshot(req).await.unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::UNAUTHORIZED,
        "another address is not limited"
    );
}

/// Every action of an account's pages passes one check before it runs: a
/// post with another CSRF token is refused (403), and a key of another
/// account, with its own session's valid token, gets 404 (as the API
/// answers); nothing is changed either way.
#[tokio::test]
async fn every_action_checks_its_form_token_and_the_accounts_reach() {
    let api = api().await;
    let endpoint = create_endpoint(&api, "acme").await;
    let endpoint = endpoint["id"].as_str().unwrap();
    let (s, key) = call("POST", "/v1/accounts/other/keys").send(&api).await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let other = sign_in(&api, key["key"].as_str().unwrap()).await;
    let (_, _, page) = ui(&api, "GET", "/ui/a/other", Some(&other), None).await;
    let other_csrf = csrf_of(&page);
    let admin = sign_in(&api, ADMIN).await;
    let id = "0190b7c4-6a4e-7c1e-9b0a-5f1e2d3c4b5a";
    let actions = [
        format!("/ui/a/acme/deliveries/{id}/replay"),
        format!("/ui/a/acme/deliveries/{id}/resend"),
        "/ui/a/acme/dead/replay".to_string(),
        format!("/ui/a/acme/endpoints/{endpoint}/recover"),
        "/ui/a/acme/event-types/order.paid/send-example".to_string(),
        "/ui/a/acme/tasks/nightly/retry".to_string(),
        format!("/ui/a/acme/endpoints/{endpoint}/enable"),
        format!("/ui/a/acme/endpoints/{endpoint}/disable"),
        format!("/ui/a/acme/endpoints/{endpoint}/rotate-secret"),
        format!("/ui/a/acme/endpoints/{endpoint}/send-example"),
    ];
    // Every field any of the forms reads, so only the token can be wrong.
    let form = |csrf: &str| {
        Some(format!(
            "csrf={csrf}&endpoint_id=&within_hours=&hours=1&endpoint={endpoint}&type=order.paid&reason=x"
        ))
    };
    for path in &actions {
        let (s, _, body) = ui(&api, "POST", path, Some(&admin), form("not-the-token")).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(body.contains("id=\"error\""), "{path}: {body}");
        let (s, _, body) = ui(&api, "POST", path, Some(&other), form(&other_csrf)).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let queued = claim_recoveries(&api).await;
    assert!(queued.is_empty(), "no recovery was queued");
    let (s, v) = call("GET", "/v1/accounts/acme/deliveries").send(&api).await;
    assert_eq!(
        (s, &v["items"]),
        (StatusCode::OK, &json!([])),
        "nothing was sent"
    );
}

/// The attempts page lists the account's attempts newest first, filtered
/// by endpoint, result and status code; the tasks page lists tasks by state.
#[tokio::test]
async fn attempts_and_tasks_by_state_are_shown() {
    let api = api().await;
    let e = create_endpoint(&api, "acme").await;
    let endpoint = e["id"].as_str().unwrap();
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.paid", "payload": {}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let delivery = v["deliveries"][0].as_str().unwrap().to_string();
    let c = api
        .store
        .delivery_claim(ClaimRequest::new("w", 1, std::time::Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    api.store
        .delivery_record_outcome(
            &c[0].lease,
            DeliveryOutcome::GiveUp(AttemptReport {
                status_code: Some(418),
                error: Some("HTTP 418".into()),
                latency_ms: 7,
                response_body: None,
            }),
        )
        .await
        .unwrap();
    let cookie = sign_in(&api, ADMIN).await;
    let get = |path: String| {
        let (api, cookie) = (&api, cookie.clone());
        async move { ui(api, "GET", &path, Some(&cookie), None).await }
    };
    let (s, _, page) = get("/ui/a/acme/attempts".into()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains(&delivery) && page.contains("418"), "{page}");
    let (_, _, page) = get(format!(
        "/ui/a/acme/attempts?endpoint={endpoint}&status_code=418"
    ))
    .await;
    assert!(page.contains(&delivery), "{page}");
    let (_, _, page) = get("/ui/a/acme/attempts?result=delivered".into()).await;
    assert!(
        page.contains("No attempt.") && !page.contains(&delivery),
        "{page}"
    );
    let (s, _, _) = get("/ui/a/acme/attempts?status_code=abc".into()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (s, v) = call("POST", "/v1/accounts/acme/tasks")
        .json(json!({"id": "nightly-report", "kind": "report", "payload": {}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _, page) = get("/ui/a/acme/tasks?state=pending".into()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("id=\"pending-tasks\"") && page.contains("nightly-report"),
        "{page}"
    );
    assert!(
        !page.contains("retry-nightly-report"),
        "only dead tasks are retried"
    );
    let (_, _, page) = get("/ui/a/acme/tasks?state=running".into()).await;
    assert!(page.contains("No running task."), "{page}");
    let (s, _, _) = get("/ui/a/acme/tasks?state=bogus".into()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}
