//! The event-type catalogue: registration, schema checks at publish,
//! "send example", and wildcard subscriptions.

use crate::contracts::fixtures::{
    acct, claim, create_endpoint, endpoint, endpoint_for, get, ids, invalid, open, publish_ok,
    publish_req, put_type,
};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    Check, Clock, EndpointCreateRequest, EndpointId, EndpointKey, EventFilter, EventListRequest,
    EventTypePut, PageRequest, PublishRequest, Recovery, Secret, StoreError, Timestamp,
};
use control_plane_runtime::recover;
use serde_json::json;
use std::time::Duration;

fn order_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["id", "items"],
        "properties": {
            "id": {"type": "string"},
            "items": {"type": "array", "items": {
                "type": "object",
                "required": ["sku"],
                "properties": {"sku": {"type": "string"}}
            }}
        }
    })
}

fn order_type(account: &str) -> EventTypePut {
    EventTypePut {
        schema: Some(order_schema()),
        example: Some(json!({"id": "o-1", "items": [{"sku": "s-1"}]})),
        ..EventTypePut::new(acct(account), "order.created", "An order was placed")
    }
}

async fn events_of(h: &Harness, account: &str) -> usize {
    let req = EventListRequest {
        account: acct(account),
        event_type: None,
        since: None,
        until: None,
        page: PageRequest::new(1000, None).unwrap(),
    };
    h.store.event_list(req).await.unwrap().items.len()
}

pub async fn event_types_are_registered_replaced_and_deleted(f: &dyn StoreFactory) {
    let h = open(f).await;
    let first = put_type(&h, order_type("a")).await;
    assert_eq!(first.name, "order.created");
    assert_eq!(first.schema, Some(order_schema()));
    assert_eq!(first.created_at, first.updated_at);
    assert_eq!(
        h.store
            .event_type_get(&acct("a"), "order.created")
            .await
            .unwrap(),
        first
    );
    put_type(&h, EventTypePut::new(acct("a"), "invoice.paid", "Paid")).await;

    h.clock.advance(Duration::from_secs(5));
    let replaced = put_type(&h, EventTypePut::new(acct("a"), "order.created", "Placed")).await;
    assert_eq!(replaced.description, "Placed");
    assert_eq!(replaced.schema, None, "a registration replaces every field");
    assert_eq!(replaced.example, None);
    assert_eq!(replaced.created_at, first.created_at);
    assert!(replaced.updated_at > first.updated_at);
    let names: Vec<String> = h
        .store
        .event_type_list(&acct("a"))
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["invoice.paid", "order.created"], "listed by name");
    assert!(h
        .store
        .event_type_list(&acct("b"))
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        h.store.event_type_get(&acct("b"), "order.created").await,
        Err(StoreError::NotFound { .. })
    ));

    let bad_schema = EventTypePut {
        schema: Some(json!({"type": 5})),
        ..EventTypePut::new(acct("a"), "bad.schema", "")
    };
    invalid(bad_schema.checked(), "schema");
    let bad_example = EventTypePut {
        example: Some(json!({"id": 7, "items": []})),
        ..order_type("a")
    };
    invalid(bad_example.checked(), "/id");
    invalid(EventTypePut::new(acct("a"), "order.*", "").checked(), "'*'");
    assert_eq!(
        h.store
            .event_type_get(&acct("a"), "order.created")
            .await
            .unwrap(),
        replaced,
        "a refused registration changes nothing"
    );

    assert!(matches!(
        h.store.event_type_delete(&acct("b"), "order.created").await,
        Err(StoreError::NotFound { .. })
    ));
    h.store
        .event_type_delete(&acct("a"), "order.created")
        .await
        .unwrap();
    assert!(matches!(
        h.store.event_type_get(&acct("a"), "order.created").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(h.store.event_type_list(&acct("a")).await.unwrap().len(), 1);
}

pub async fn a_publish_of_a_registered_type_is_checked_against_its_schema(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    // Published before it is registered: not checked; registered since:
    // checked at once (an adapter that remembers schemas forgets on put).
    let early = PublishRequest::new(acct("a"), "order.created", json!({"id": 1}));
    publish_ok(&h, early.clone()).await;
    put_type(&h, order_type("a")).await;
    invalid(
        h.store.event_publish(early.checked().unwrap()).await,
        "order.created",
    );
    let good = || {
        PublishRequest::new(
            acct("a"),
            "order.created",
            json!({"id": "o-2", "items": [{"sku": "x"}]}),
        )
    };
    let bad = || {
        PublishRequest::new(
            acct("a"),
            "order.created",
            json!({"id": "o-3", "items": [{"sku": "x"}, {"sku": 9}]}),
        )
    };
    let published = publish_ok(&h, good()).await;
    assert_eq!(published.deliveries.len(), 1);
    invalid(
        h.store.event_publish(bad().checked().unwrap()).await,
        "/items/1/sku",
    );
    let mut keyed = bad();
    keyed.idempotency_key = Some("k-1".into());
    invalid(
        h.store.event_publish(keyed.checked().unwrap()).await,
        "/items/1/sku",
    );
    invalid(
        h.store
            .event_publish_batch(
                control_plane_core::Checked::all(vec![
                    good(),
                    publish_req("a", "invoice.paid"),
                    bad(),
                ])
                .unwrap(),
            )
            .await,
        "order.created",
    );
    assert_eq!(
        events_of(&h, "a").await,
        2,
        "the early one and the good one: a refused batch stores nothing"
    );

    // A key published before its type had a schema repeats, not refused.
    let mut early = PublishRequest::new(acct("a"), "order.later", json!({"any": 1}));
    early.idempotency_key = Some("k-early".into());
    let first = publish_ok(&h, early.clone()).await;
    put_type(
        &h,
        EventTypePut {
            schema: Some(json!({"required": ["id"]})),
            ..EventTypePut::new(acct("a"), "order.later", "later")
        },
    )
    .await;
    let again = publish_ok(&h, early).await;
    assert!(!again.created && again.event.id == first.event.id);
    h.store
        .event_type_delete(&acct("a"), "order.later")
        .await
        .unwrap();

    // Unregistered types, and the same name in another account, are free.
    publish_ok(&h, publish_req("a", "order.shipped")).await;
    publish_ok(&h, publish_req("b", "order.created")).await;
    // Without a schema, or once removed, the type is free again.
    put_type(
        &h,
        EventTypePut::new(acct("a"), "order.created", "no schema"),
    )
    .await;
    publish_ok(&h, bad()).await;
    put_type(&h, order_type("a")).await;
    invalid(
        h.store.event_publish(bad().checked().unwrap()).await,
        "/items/1/sku",
    );
    h.store
        .event_type_delete(&acct("a"), "order.created")
        .await
        .unwrap();
    publish_ok(&h, bad()).await;
    assert_eq!(events_of(&h, "a").await, 6);
}

pub async fn an_example_is_sent_to_one_endpoint(f: &dyn StoreFactory) {
    let h = open(f).await;
    put_type(&h, order_type("a")).await;
    let bystander = endpoint(&h, "a", false).await;
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/other",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.event_types = vec!["invoice.paid".into()];
    req.filter = Some(EventFilter::parse(json!({"data.amount": {"$gt": 0}})).unwrap());
    let target = create_endpoint(&h, req).await;

    let sent = h
        .store
        .event_type_send_example(EndpointKey::new(&acct("a"), target.id), "order.created")
        .await
        .unwrap();
    assert_eq!(
        sent.deliveries.len(),
        1,
        "one delivery, to the target alone"
    );
    let d = get(&h, "a", sent.deliveries[0]).await;
    assert_eq!(d.endpoint_id, target.id);
    assert_eq!(sent.event.event_type, "order.created");
    let body: serde_json::Value = serde_json::from_str(&sent.event.body).unwrap();
    assert_eq!(
        body["data"],
        json!({"id": "o-1", "items": [{"sku": "s-1"}]})
    );
    let claimed = claim(&h, 10).await;
    assert_eq!(ids(&claimed), sent.deliveries);
    assert!(claimed
        .iter()
        .all(|c| c.delivery.endpoint_id != bystander.id));
    // The event is marked as an example, and a recovery of another endpoint
    // subscribed to its type passes over it.
    assert!(sent.event.example);
    let stored = h.store.event_get(&acct("a"), sent.event.id).await.unwrap();
    assert!(stored.example, "the mark is stored");
    let plain = publish_ok(&h, publish_req("a", "invoice.paid")).await;
    assert!(!plain.event.example);
    let mut req = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/orders",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.event_types = vec!["order.created".into()];
    let subscriber = create_endpoint(&h, req).await;
    h.clock.advance(Duration::from_secs(1));
    let window = Recovery::new(subscriber.id, Timestamp::from_millis(0), h.clock.now()).unwrap();
    let r = recover(h.store.as_ref(), &acct("a"), &window, None, |_| {})
        .await
        .unwrap();
    assert_eq!((r.matched, r.created), (0, 0), "{r:?}");
    assert!(
        claim(&h, 10)
            .await
            .iter()
            .all(|c| c.delivery.endpoint_id != subscriber.id),
        "the example reached an endpoint it was not sent to"
    );

    assert!(matches!(
        h.store
            .event_type_send_example(EndpointKey::new(&acct("a"), target.id), "no.such.type")
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store
            .event_type_send_example(
                EndpointKey::new(&acct("a"), EndpointId::new()),
                "order.created"
            )
            .await,
        Err(StoreError::NotFound { .. })
    ));
    let other = endpoint(&h, "b", false).await;
    assert!(matches!(
        h.store
            .event_type_send_example(EndpointKey::new(&acct("a"), other.id), "order.created")
            .await,
        Err(StoreError::NotFound { .. })
    ));
    put_type(&h, EventTypePut::new(acct("a"), "plain", "no example")).await;
    invalid(
        h.store
            .event_type_send_example(EndpointKey::new(&acct("a"), target.id), "plain")
            .await,
        "no example",
    );
    assert_eq!(
        events_of(&h, "a").await,
        2,
        "the example and the plain event: the refusals stored none"
    );
}

pub async fn wildcard_subscriptions_take_every_type_under_their_prefix(f: &dyn StoreFactory) {
    let h = open(f).await;
    let orders = endpoint_for(&h, "a", &["order.*"]).await;
    let everything = endpoint_for(&h, "a", &["*"]).await;
    for (ty, to) in [
        ("order.created", vec![orders.id, everything.id]),
        ("order.item.added", vec![orders.id, everything.id]),
        ("order", vec![everything.id]),
        ("orders.created", vec![everything.id]),
    ] {
        let p = publish_ok(&h, publish_req("a", ty)).await;
        let mut reached = Vec::new();
        for id in &p.deliveries {
            reached.push(get(&h, "a", *id).await.endpoint_id);
        }
        let mut to = to;
        to.sort();
        reached.sort();
        assert_eq!(reached, to, "{ty}");
    }
    invalid(publish_req("a", "order.*").checked(), "'*'");
    let mut bad = EndpointCreateRequest::new(
        acct("a"),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    bad.event_types = vec!["order*".into()];
    invalid(bad.checked(), "'*'");
    // The subscriptions are stored as given, not widened or rewritten.
    let kept = h.store.endpoint_get(&acct("a"), orders.id).await.unwrap();
    assert_eq!(kept.event_types, ["order.*"]);
}
