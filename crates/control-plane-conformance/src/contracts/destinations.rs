//! Contracts of what a claim sends with: custom headers, OAuth2 client
//! credentials, client certificates, broker destinations, and the endpoint
//! as it is at the claim.

use crate::contracts::fixtures::{
    acct, claim, client_tls, create_endpoint, endpoint, invalid, is_invalid, ok, open, publish,
    reread, rotate,
};
use crate::StoreFactory;
use control_plane_core::{
    custom_header_pairs, Check, ClaimedDelivery, ClientCredentials, ClientTls, Enablement,
    Endpoint, EndpointCreateRequest, EndpointKey, EndpointUpdateRequest, Secret, StoreError,
    Transform,
};
use std::time::Duration;

/// `EndpointStore::endpoint_create`: custom headers are checked (reserved
/// and malformed names, bad values, the same name twice), stored with names
/// lower-cased, read back and handed to the sender with each claim;
/// an update replaces them all, and an empty set removes them.
pub async fn custom_headers_are_checked_replaced_and_claimed(f: &dyn StoreFactory) {
    let h = open(f).await;
    let with = |pairs: &[(&str, &str)]| {
        let mut req = EndpointCreateRequest::new(
            acct("a"),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.headers = pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        req
    };
    for bad in [
        vec![("Host", "x")],
        vec![("webhook-id", "x")],
        vec![("Content-Length", "1")],
        vec![("bad name", "x")],
        vec![("x-a", "line\nbreak")],
        vec![("x-a", "")],
        vec![("X-Dup", "1"), ("x-dup", "2")],
    ] {
        let r = with(&bad).checked();
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{bad:?}: {r:?}"
        );
    }
    let e = create_endpoint(
        &h,
        with(&[("X-Api-Key", "k-1"), ("authorization", "Bearer t")]),
    )
    .await;
    let pairs = |e: &Endpoint| e.headers.as_ref().map(|h| custom_header_pairs(h).unwrap());
    let want = vec![
        ("authorization".to_string(), "Bearer t".to_string()),
        ("x-api-key".to_string(), "k-1".to_string()),
    ];
    assert_eq!(pairs(&e), Some(want.clone()));
    let read = reread(&h, &e).await;
    assert_eq!(pairs(&read), Some(want.clone()));
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(
        c.headers.as_ref().map(|h| custom_header_pairs(h).unwrap()),
        Some(want)
    );
    let update = |headers: &[(&str, &str)]| EndpointUpdateRequest {
        headers: Some(
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        ),
        ..EndpointUpdateRequest::default()
    };
    let r = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
            update(&[("Connection", "close")]),
        )
        .await;
    is_invalid(r);
    let changed = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
            update(&[("x-tenant", "t-9")]),
        )
        .await
        .unwrap();
    assert_eq!(
        pairs(&changed),
        Some(vec![("x-tenant".to_string(), "t-9".to_string())])
    );
    // Headers never follow the endpoint to another origin unasked.
    let elsewhere = EndpointUpdateRequest {
        url: Some("http://127.0.0.1:9/hook".into()),
        ..EndpointUpdateRequest::default()
    };
    invalid(
        h.store
            .endpoint_update(EndpointKey::new(&acct("a"), e.id), elsewhere.clone())
            .await,
        "\"headers\"",
    );
    let moved = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
            EndpointUpdateRequest {
                headers: Some([("x-tenant".to_string(), "t-10".to_string())].into()),
                ..elsewhere
            },
        )
        .await
        .unwrap();
    assert_eq!(moved.url, "http://127.0.0.1:9/hook");
    let cleared = h
        .store
        .endpoint_update(EndpointKey::new(&acct("a"), e.id), update(&[]))
        .await
        .unwrap();
    assert_eq!(cleared.headers, None);
}

/// `DeliveryStore::delivery_claim`: each claim hands out the endpoint as it
/// is now, after every kind of change since the last claim: a rotated
/// secret (with the previous one), a new URL and headers, disabling and
/// enabling, removal. A store that keeps endpoints between claims must
/// forget them on every change.
pub async fn a_claim_sends_with_the_endpoint_as_it_is_now(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let store = &h.store;
    let finish = |c: ClaimedDelivery| async move {
        store.delivery_record_outcome(&c.lease, ok()).await.unwrap();
    };
    let next = || async {
        publish(&h, "a").await;
        let mut got = claim(&h, 10).await;
        assert_eq!(got.len(), 1, "one delivery published, one claimed");
        got.remove(0)
    };
    let c = next().await;
    assert_eq!(
        (c.url.as_str(), c.secrets.current.expose()),
        (
            "https://example.com/hook",
            "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"
        )
    );
    finish(c).await;

    rotate(&h, "a", &e, Duration::from_secs(60)).await;
    let c = next().await;
    assert_eq!(
        c.secrets.current.expose(),
        "whsec_bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3"
    );
    assert_eq!(
        c.secrets.previous.as_ref().map(Secret::expose),
        Some("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0")
    );
    finish(c).await;

    let update = EndpointUpdateRequest {
        url: Some("https://example.com/moved".into()),
        headers: Some([("x-tenant".to_string(), "t-2".to_string())].into()),
        ..EndpointUpdateRequest::default()
    };
    h.store
        .endpoint_update(EndpointKey::new(&acct("a"), e.id), update)
        .await
        .unwrap();
    let c = next().await;
    assert_eq!(c.url, "https://example.com/moved");
    assert_eq!(
        c.headers.as_ref().map(|h| custom_header_pairs(h).unwrap()),
        Some(vec![("x-tenant".to_string(), "t-2".to_string())])
    );
    finish(c).await;

    publish(&h, "a").await;
    h.store
        .endpoint_set_enabled(
            EndpointKey::new(&acct("a"), e.id),
            Enablement::Disabled {
                reason: Some("paused".into()),
            },
        )
        .await
        .unwrap();
    assert!(
        claim(&h, 10).await.is_empty(),
        "a disabled endpoint is skipped"
    );
    h.store
        .endpoint_set_enabled(EndpointKey::new(&acct("a"), e.id), Enablement::Enabled)
        .await
        .unwrap();
    let c = claim(&h, 10).await;
    assert_eq!(c.len(), 1, "enabled again, its delivery is claimed");
    finish(c.into_iter().next().unwrap()).await;

    publish(&h, "a").await;
    h.store.endpoint_delete(&acct("a"), e.id).await.unwrap();
    assert!(
        claim(&h, 10).await.is_empty(),
        "a removed endpoint is skipped"
    );
}

/// `EndpointStore::endpoint_update`: OAuth2 client credentials are checked
/// at create and update (nothing stored when refused), read back opened,
/// kept by an update that does not name them, replaced, handed to the
/// claimer with the delivery, and removed by `Some(None)`.
pub async fn oauth2_credentials_are_checked_replaced_removed_and_claimed(f: &dyn StoreFactory) {
    let h = open(f).await;
    let creds = |secret: &str| ClientCredentials {
        token_url: "https://auth.example.com/token".into(),
        client_id: "hooks".into(),
        client_secret: secret.into(),
        scope: Some("webhooks".into()),
        audience: None,
    };
    let with = |c: ClientCredentials| {
        let mut req = EndpointCreateRequest::new(
            acct("a"),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.oauth2 = Some(c);
        req
    };
    let bad = ClientCredentials {
        token_url: "not a url".into(),
        ..creds("s")
    };
    invalid(with(bad).checked(), "oauth2.token_url");
    invalid(with(creds("")).checked(), "oauth2.client_secret");
    assert!(h.store.endpoint_list(&acct("a")).await.unwrap().is_empty());
    let e = create_endpoint(&h, with(creds("s-1"))).await;
    assert_eq!(e.oauth2_client(), Some(creds("s-1")));
    let read = reread(&h, &e).await;
    assert_eq!(read.oauth2_client(), Some(creds("s-1")));
    let kept = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
            EndpointUpdateRequest {
                description: Some(Some("renamed".into())),
                ..EndpointUpdateRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(kept.oauth2_client(), Some(creds("s-1")));
    let set = |c: Option<ClientCredentials>| EndpointUpdateRequest {
        oauth2: Some(c),
        ..EndpointUpdateRequest::default()
    };
    invalid(
        h.store
            .endpoint_update(EndpointKey::new(&acct("a"), e.id), set(Some(creds("a\nb"))))
            .await,
        "oauth2.client_secret",
    );
    let changed = h
        .store
        .endpoint_update(EndpointKey::new(&acct("a"), e.id), set(Some(creds("s-2"))))
        .await
        .unwrap();
    assert_eq!(changed.oauth2_client(), Some(creds("s-2")));
    // Another origin only with the credentials given again: a caller never
    // told them cannot have them sent to a host of its choosing.
    let moved = |url: &str, oauth2: Option<Option<ClientCredentials>>| EndpointUpdateRequest {
        url: Some(url.into()),
        oauth2,
        ..EndpointUpdateRequest::default()
    };
    invalid(
        h.store
            .endpoint_update(
                EndpointKey::new(&acct("a"), e.id),
                moved("https://elsewhere.example/hook", None),
            )
            .await,
        "\"oauth2\"",
    );
    let same_origin = h
        .store
        .endpoint_update(
            EndpointKey::new(&acct("a"), e.id),
            moved("https://example.com/other", None),
        )
        .await
        .unwrap();
    assert_eq!(same_origin.oauth2_client(), Some(creds("s-2")));
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    let claimed = c
        .oauth2
        .as_ref()
        .map(|o| ClientCredentials::from_text(o).unwrap());
    assert_eq!(claimed, Some(creds("s-2")));
    let removed = h
        .store
        .endpoint_update(EndpointKey::new(&acct("a"), e.id), set(None))
        .await
        .unwrap();
    assert_eq!(removed.oauth2, None);
    let read = reread(&h, &e).await;
    assert_eq!(read.oauth2, None);
}

/// `EndpointStore::endpoint_create` and `endpoint_update`: a client
/// certificate and key (mTLS) are checked at create and update (a key that
/// is not the certificate's, text that is not PEM, an endpoint that is not
/// `https`; nothing stored when refused), read back opened, kept by an
/// update that does not name them, replaced, never moved to another origin
/// unasked, handed to the claimer with the delivery, and removed by
/// `Some(None)`; another account cannot read the endpoint that holds them.
pub async fn client_certificates_are_checked_replaced_removed_and_claimed(f: &dyn StoreFactory) {
    let h = open(f).await;
    let with = |url: &str, c: ClientTls| {
        let mut req = EndpointCreateRequest::new(
            acct("a"),
            url,
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.client_tls = Some(c);
        req
    };
    let hook = "https://example.com/hook";
    invalid(
        with(hook, client_tls("mismatched")).checked(),
        "not the key of the certificate",
    );
    let junk = ClientTls {
        certificate: "not a certificate".into(),
        ..client_tls("client")
    };
    invalid(with(hook, junk).checked(), "client_tls.certificate");
    invalid(
        with("http://example.com/hook", client_tls("client")).checked(),
        "https:// endpoints only",
    );
    assert!(h.store.endpoint_list(&acct("a")).await.unwrap().is_empty());
    let e = create_endpoint(&h, with(hook, client_tls("client"))).await;
    assert_eq!(e.client_tls(), Some(client_tls("client")));
    assert_eq!(
        reread(&h, &e).await.client_tls(),
        Some(client_tls("client"))
    );
    assert!(
        h.store.endpoint_get(&acct("b"), e.id).await.is_err(),
        "another account does not read it"
    );
    let a = acct("a");
    let update =
        |req: EndpointUpdateRequest| h.store.endpoint_update(EndpointKey::new(&a, e.id), req);
    let kept = update(EndpointUpdateRequest {
        description: Some(Some("renamed".into())),
        ..EndpointUpdateRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(kept.client_tls(), Some(client_tls("client")));
    let set = |c: Option<ClientTls>| EndpointUpdateRequest {
        client_tls: Some(c),
        ..EndpointUpdateRequest::default()
    };
    invalid(
        update(set(Some(client_tls("mismatched")))).await,
        "not the key of the certificate",
    );
    assert_eq!(
        reread(&h, &e).await.client_tls(),
        Some(client_tls("client"))
    );
    let changed = update(set(Some(client_tls("other")))).await.unwrap();
    assert_eq!(changed.client_tls(), Some(client_tls("other")));
    // Another origin (plain http included) only with the pair given again
    // or removed: a caller never told the key cannot have it presented to a
    // host of its choosing.
    let moved = |url: &str| EndpointUpdateRequest {
        url: Some(url.into()),
        ..EndpointUpdateRequest::default()
    };
    invalid(
        update(moved("https://elsewhere.example/hook")).await,
        "\"client_tls\"",
    );
    invalid(
        update(moved("http://example.com/hook")).await,
        "\"client_tls\"",
    );
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    let claimed = c
        .client_tls
        .as_ref()
        .map(|t| ClientTls::from_text(t).unwrap());
    assert_eq!(claimed, Some(client_tls("other")));
    let removed = update(set(None)).await.unwrap();
    assert_eq!(removed.client_tls, None);
    assert_eq!(reread(&h, &e).await.client_tls, None);
    let plain = update(moved("http://example.com/hook")).await.unwrap();
    assert_eq!(
        plain.url, "http://example.com/hook",
        "without a certificate it may move"
    );
}

/// `EndpointStore::endpoint_create` and `endpoint_update`: an endpoint's
/// jq program (ADR 0050) is checked when saved (one that does not compile
/// is refused with its error, and nothing is stored), read back as given,
/// kept by an update that does not name it, replaced, handed to the
/// claimer with the delivery, and removed by `Some(None)`.
pub async fn a_transform_is_checked_kept_replaced_removed_and_claimed(f: &dyn StoreFactory) {
    let h = open(f).await;
    let with = |program: &str| {
        let mut req = EndpointCreateRequest::new(
            acct("a"),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.transform = Some(Transform::parse(program).unwrap());
        req
    };
    let refused = Transform::parse("{id: .data.id").unwrap_err().to_string();
    assert!(
        refused.contains("transform:") && refused.contains("1:"),
        "{refused}"
    );
    assert!(Transform::parse("nosuchfilter").is_err());
    let first = "{id: .data.id, kind: .type}";
    let e = create_endpoint(&h, with(first)).await;
    assert_eq!(e.transform.as_ref().map(Transform::as_str), Some(first));
    assert_eq!(reread(&h, &e).await.transform, e.transform);
    let a = acct("a");
    let update =
        |req: EndpointUpdateRequest| h.store.endpoint_update(EndpointKey::new(&a, e.id), req);
    let kept = update(EndpointUpdateRequest {
        description: Some(Some("renamed".into())),
        ..EndpointUpdateRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(kept.transform, e.transform);
    let second = "if .data.n > 1 then . else null end";
    let changed = update(EndpointUpdateRequest {
        transform: Some(Some(Transform::parse(second).unwrap())),
        ..EndpointUpdateRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(
        changed.transform.as_ref().map(Transform::as_str),
        Some(second)
    );
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(c.transform.as_ref().map(Transform::as_str), Some(second));
    let removed = update(EndpointUpdateRequest {
        transform: Some(None),
        ..EndpointUpdateRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(removed.transform, None);
    assert_eq!(reread(&h, &e).await.transform, None);
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    assert_eq!(
        c.transform, None,
        "a claim sends with the endpoint as it is now"
    );
}

/// `EndpointStore::endpoint_create` and `endpoint_update`: a broker
/// destination (`amqp(s)`, `nats`, `redis(s)`; [`control_plane_core::Destination`])
/// is stored and claimed exactly as given, and a change of broker host
/// needs the endpoint's credentials given again, as for HTTP.
pub async fn a_broker_destination_is_stored_and_claimed_as_given(f: &dyn StoreFactory) {
    let h = open(f).await;
    let secret = Secret::new("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4");
    for (account, url) in [
        (
            "amqp",
            "amqp://rabbit.internal:5672/%2f?exchange=events&routing_key=orders.paid",
        ),
        ("nats", "nats://nats.internal:4222?subject=orders.paid"),
        (
            "redis",
            "rediss://cache.internal:6380/2?stream=orders&maxlen=5000",
        ),
    ] {
        let mut req = EndpointCreateRequest::new(acct(account), url, secret.clone());
        req.headers = [("x-tenant".to_string(), "t-1".to_string())].into();
        let e = h
            .store
            .endpoint_create(req.checked().unwrap())
            .await
            .unwrap();
        let read = h.store.endpoint_get(&acct(account), e.id).await.unwrap();
        assert_eq!(read.url, url);
        publish(&h, account).await;
        let c = claim(&h, 10).await;
        assert_eq!(c.len(), 1, "{account}");
        assert_eq!(c[0].url, url, "the claim carries the destination as stored");
        h.store
            .delivery_record_outcome(&c[0].lease, ok())
            .await
            .unwrap();
        let moved = EndpointUpdateRequest {
            url: Some(url.replace(".internal", ".elsewhere")),
            ..EndpointUpdateRequest::default()
        };
        let r = h
            .store
            .endpoint_update(EndpointKey::new(&acct(account), e.id), moved)
            .await;
        assert!(
            matches!(&r, Err(StoreError::InvalidInput(m)) if m.contains("another origin")),
            "{account}: {r:?}"
        );
        let with_oauth2 = EndpointUpdateRequest {
            oauth2: Some(Some(ClientCredentials {
                token_url: "https://auth.example.com/token".into(),
                client_id: "id".into(),
                client_secret: "s".into(),
                scope: None,
                audience: None,
            })),
            ..EndpointUpdateRequest::default()
        };
        let r = h
            .store
            .endpoint_update(EndpointKey::new(&acct(account), e.id), with_oauth2)
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidInput(_))),
            "{account}: {r:?}"
        );
        let kept = h.store.endpoint_get(&acct(account), e.id).await.unwrap();
        assert_eq!((kept.url.as_str(), kept.oauth2.is_none()), (url, true));
    }
}
