//! Payload transformations (issue 77, ADR 0050) through the real binary:
//! its `transform` command under the runner's limits, and `serve` sending a
//! rewritten, signed body, finishing a dropped delivery unsent, and failing
//! the attempt of a program that never ends while it keeps delivering.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::{Duration, Instant};

use control_plane_core::{
    AccountId, Check, DeliveryState, EndpointCreateRequest, EndpointKey, EventTypePut,
    PublishRequest, Secret, SystemClock, Transform, Transformed,
};
use control_plane_core::{
    AttemptLogStore, CatalogueStore, DeliveryStore, EndpointStore, EventStore,
};
use dispatcher::TransformRunner;
use tokio::io::AsyncWriteExt;

mod serving;
use serving::read_request;

const BIN: &str = env!("CARGO_BIN_EXE_control-plane");

fn runner() -> TransformRunner {
    TransformRunner::new(BIN, vec!["transform".into()], 4)
}

/// Runs `program` on [`BODY`] for account `acme` with 10 s to spare.
async fn run(r: &TransformRunner, program: &str) -> Result<Transformed, String> {
    let acme = AccountId::new("acme").unwrap();
    r.run(&acme, program, BODY, Duration::from_secs(10)).await
}

const BODY: &str =
    r#"{"type":"order.created","timestamp":"2026-12-07T00:00:00.000Z","data":{"id":7}}"#;

/// Every way a program can end is a body, a drop, or an error: the endless,
/// the stack-hungry and the memory-hungry program each end as an error
/// within the limits, and the service's environment never reaches one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transform_command_answers_every_program_within_its_limits() {
    let r = runner();
    assert_eq!(
        run(&r, "{id: .data.id, kind: .type}").await,
        Ok(Transformed::Body(
            r#"{"id":7,"kind":"order.created"}"#.into()
        ))
    );
    assert_eq!(run(&r, "null").await, Ok(Transformed::Dropped));
    let e = run(&r, "error(\"refused\")").await.unwrap_err();
    assert!(e.contains("refused"), "{e}");
    let e = run(&r, "env").await.unwrap_err();
    assert!(e.contains("env is not available"), "{e}");
    for (program, what) in [
        ("def f: f; f", "never ends"),
        ("def f: 1 + f; f", "exhausts its stack"),
        ("[range(1e10)]", "exhausts its memory"),
        ("reduce range(64) as $_ (\"x\"; . + .)", "doubles a string"),
    ] {
        let started = Instant::now();
        let e = run(&r, program).await.unwrap_err();
        assert!(e.starts_with("transformation:"), "{what}: {e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sends_the_transformed_body_signed_and_drops_on_null() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.duckdb");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let acct = AccountId::new("acme").unwrap();
    let config = store_embedded::EmbeddedConfig::new(&path);
    let (rewritten, dropped, endless, example) = {
        let store = store_embedded::EmbeddedStore::open(config, std::sync::Arc::new(SystemClock))
            .await
            .unwrap();
        let mut ids = Vec::new();
        for program in ["{id: .data.id, kind: .type}", "null", "def f: f; f"] {
            let mut req = EndpointCreateRequest::new(acct.clone(), url.clone(), secret.clone());
            req.transform = Some(Transform::parse(program).unwrap());
            ids.push(
                store
                    .endpoint_create(req.checked().unwrap())
                    .await
                    .unwrap()
                    .id,
            );
        }
        let p = store
            .event_publish(
                PublishRequest::new(acct.clone(), "order.created", serde_json::json!({"id": 7}))
                    .checked()
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(p.deliveries.len(), 3);
        let put = EventTypePut {
            example: Some(serde_json::json!({"id": 9})),
            ..EventTypePut::new(acct.clone(), "order.created", "an order")
        };
        store.event_type_put(put.checked().unwrap()).await.unwrap();
        let example = store
            .event_type_send_example(EndpointKey::new(&acct, ids[0]), "order.created")
            .await
            .unwrap()
            .deliveries[0];
        let d = store
            .delivery_list(control_plane_core::DeliveryListRequest::all(
                acct.clone(),
                control_plane_core::PageRequest::first(10),
            ))
            .await
            .unwrap()
            .items;
        let of = |e| {
            d.iter()
                .find(|d| d.endpoint_id == e && d.id != example)
                .unwrap()
                .id
        };
        (of(ids[0]), of(ids[1]), of(ids[2]), example)
    };
    let mut child = tokio::process::Command::new(BIN)
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CONTROLPLANE_LISTEN", "127.0.0.1:0")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .env("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8")
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The published event and the type's example, both through the program.
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let (mut sock, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the rewritten webhooks arrive")
            .unwrap();
        let (headers, body) = read_request(&mut sock).await;
        sock.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let ts: i64 = headers["webhook-timestamp"].parse().unwrap();
        assert!(
            dispatcher::signing::verify(
                &secret,
                &headers["webhook-signature"],
                &headers["webhook-id"],
                ts,
                body.as_bytes()
            ),
            "the signature covers the transformed body"
        );
        got.insert(headers["webhook-id"].clone(), body);
    }
    assert_eq!(
        got.get(&rewritten.to_string()).map(String::as_str),
        Some(r#"{"id":7,"kind":"order.created"}"#)
    );
    assert_eq!(
        got.get(&example.to_string()).map(String::as_str),
        Some(r#"{"id":9,"kind":"order.created"}"#),
        "send-example runs the program too"
    );
    // Nothing else arrives: the dropped one is not sent, the endless one
    // never gets to its request.
    let more = tokio::time::timeout(Duration::from_secs(4), listener.accept()).await;
    assert!(more.is_err(), "only the rewritten deliveries were sent");
    serving::stop(&mut child).await;

    let store = store_embedded::EmbeddedStore::open(
        store_embedded::EmbeddedConfig::new(&path),
        std::sync::Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let d = store.delivery_get(&acct, dropped).await.unwrap();
    assert_eq!(d.state, DeliveryState::Delivered);
    let log = store
        .attempt_list_for_delivery(&acct, dropped)
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].status_code, None);
    assert_eq!(log[0].error.as_deref(), Some(dispatcher::outcome::DROPPED));
    let d = store.delivery_get(&acct, endless).await.unwrap();
    assert_eq!(
        d.state,
        DeliveryState::Pending,
        "failed, backing off: {d:?}"
    );
    let log = store
        .attempt_list_for_delivery(&acct, endless)
        .await
        .unwrap();
    let error = log[0].error.clone().unwrap_or_default();
    assert!(error.starts_with("transformation:"), "{error}");
}

/// A program's error is cut to a bounded length; a program is stopped at
/// the budget its delivery's lease leaves; and one account's endless
/// programs hold at most half the turns, so another account's program runs
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformations_are_bounded_by_the_lease_and_shared_between_accounts() {
    let r = TransformRunner::new(BIN, vec!["transform".into()], 2);
    let e = run(&r, "error(\"x\" * 100000)").await.unwrap_err();
    assert!(
        e.len() <= dispatcher::transform::MAX_ERROR_BYTES + 32,
        "{}",
        e.len()
    );
    let acme = AccountId::new("acme").unwrap();
    let started = Instant::now();
    let e = r
        .run(&acme, "def f: f; f", BODY, Duration::from_millis(600))
        .await
        .unwrap_err();
    assert!(e.contains("stopped"), "{e}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    let hostile = AccountId::new("hostile").unwrap();
    let endless: Vec<_> = (0..3)
        .map(|_| {
            let (r, hostile) = (r.clone(), hostile.clone());
            tokio::spawn(async move {
                r.run(&hostile, "def f: f; f", BODY, Duration::from_secs(10))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    assert_eq!(
        run(&r, "{id: .data.id}").await,
        Ok(Transformed::Body(r#"{"id":7}"#.into()))
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "another account waited {:?}",
        started.elapsed()
    );
    // The hostile account's third program waited for its own turn and
    // still ended within its budget.
    for h in endless {
        assert!(h.await.unwrap().is_err());
    }
}
