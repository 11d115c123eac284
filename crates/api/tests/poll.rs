//! Poll endpoints over HTTP (ADR 0051): created without a URL, read by
//! their consumer with its account's key, in order, with a cursor; each
//! read acknowledges what it returns.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use axum::http::StatusCode;
use serde_json::{json, Value};

mod support;
use support::*;

async fn key_of(api: &Api, account: &str) -> String {
    let (s, key) = call("POST", format!("/v1/accounts/{account}/keys"))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    key["key"].as_str().unwrap().to_string()
}

async fn publish(api: &Api, n: i64) -> Value {
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": "order.paid", "payload": {"n": n}}))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    v
}

fn event_ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_consumer_reads_its_poll_endpoint_in_order_with_its_own_key() {
    let api = api_with(axum::Router::new()).await;
    let key = key_of(&api, "acme").await;
    let (s, e) = call("POST", "/v1/accounts/acme/endpoints")
        .token(Some(&key))
        .json(json!({"kind": "poll", "event_types": ["order.*"]}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    assert_eq!(
        (e["kind"].as_str(), e["url"].is_null()),
        (Some("poll"), true)
    );
    let id = e["id"].as_str().unwrap().to_string();
    let path = format!("/v1/accounts/acme/endpoints/{id}/poll");
    let published: Vec<String> = {
        let mut v = Vec::new();
        for n in 0..3 {
            v.push(publish(&api, n).await["id"].as_str().unwrap().to_string());
        }
        v
    };
    let (s, first) = call("GET", format!("{path}?limit=2"))
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(event_ids(&first), published[..2]);
    assert_eq!(first["done"], json!(false));
    assert_eq!(first["data"][0]["payload"]["data"], json!({"n": 0}));
    assert_eq!(first["data"][0]["event_type"], json!("order.paid"));
    let delivery = first["data"][0]["id"].as_str().unwrap();
    let (_, d) = call("GET", format!("/v1/accounts/acme/deliveries/{delivery}"))
        .send(&api)
        .await;
    assert_eq!(d["state"], json!("delivered"), "{d}");
    let cursor = first["cursor"].as_str().unwrap();
    let (_, rest) = call("GET", format!("{path}?cursor={cursor}"))
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(event_ids(&rest), published[2..]);
    assert_eq!(rest["done"], json!(true));
    // The same cursor again: the same events, nothing delivered twice.
    let (_, again) = call("GET", format!("{path}?cursor={cursor}"))
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(event_ids(&again), published[2..]);

    let bad = [
        (format!("{path}?cursor=-1"), StatusCode::BAD_REQUEST),
        (format!("{path}?cursor=abc"), StatusCode::BAD_REQUEST),
        (format!("{path}?limit=0"), StatusCode::BAD_REQUEST),
        (format!("{path}?limit=1001"), StatusCode::BAD_REQUEST),
    ];
    for (p, want) in bad {
        let (s, v) = call("GET", p.clone()).token(Some(&key)).send(&api).await;
        assert_eq!(s, want, "{p}: {v}");
    }
    // Another account's key, a revoked key and no key are told nothing
    // of it and take nothing: the next event waits for its consumer.
    let waiting = publish(&api, 3).await["id"].as_str().unwrap().to_string();
    let theirs = key_of(&api, "other").await;
    let (s, _) = call("GET", path.clone())
        .token(Some(&theirs))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = call("GET", path.clone()).token(None).send(&api).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let cursor = rest["cursor"].as_str().unwrap();
    let (_, next) = call("GET", format!("{path}?cursor={cursor}"))
        .token(Some(&key))
        .send(&api)
        .await;
    assert_eq!(event_ids(&next), [waiting]);
}

#[tokio::test]
async fn a_poll_endpoint_takes_no_url_and_a_pushed_one_cannot_be_polled() {
    let api = api_with(axum::Router::new()).await;
    let refused = [
        json!({"kind": "poll", "url": "https://example.com/hook"}),
        json!({"kind": "push"}),
        json!({}),
        json!({"url": ""}),
        json!({"kind": "poll", "headers": {"x-key": "v"}}),
        json!({"kind": "poll", "ordered": true}),
        json!({"kind": "poll", "transform": ".data"}),
        json!({"kind": "poll", "max_in_flight": 2}),
    ];
    for body in refused {
        let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
            .json(body.clone())
            .send(&api)
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
    }
    let (_, listed) = call("GET", "/v1/accounts/acme/endpoints").send(&api).await;
    assert_eq!(listed["items"], json!([]), "nothing was created: {listed}");
    let (s, poll) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"kind": "poll"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{poll}");
    let id = poll["id"].as_str().unwrap();
    let (s, v) = call("PATCH", format!("/v1/accounts/acme/endpoints/{id}"))
        .json(json!({"url": "https://example.com/hook"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let pushed = create_endpoint(&api, "acme").await;
    assert_eq!(pushed["kind"], json!("push"));
    let pushed_id = pushed["id"].as_str().unwrap();
    let (s, v) = call(
        "GET",
        format!("/v1/accounts/acme/endpoints/{pushed_id}/poll"),
    )
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
}
