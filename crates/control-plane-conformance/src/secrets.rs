//! Endpoint secrets at rest (ADR 0022): one scenario every adapter runs
//! from its own `tests/secrets.rs`, since it reopens one store with other
//! keys and reads the stored values raw, which the port cannot.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::{
    custom_header_pairs, AccountId, Check, ClaimRequest, ClaimedDelivery, ClientCredentials,
    ClientTls, DynControlPlaneStore, Endpoint, EndpointCreateRequest, EndpointId, EndpointKey,
    PublishRequest, Secret, SecretRotation, SigningSecrets, StoreResult,
};
use control_plane_store_kit::sealing::{key_id_of, SEALED_PREFIX};
use control_plane_store_kit::{SecretKey, SecretKeys};

use crate::contracts::client_tls;

/// One store's location, opened again as the service opens it after a
/// restart, and read raw.
#[async_trait]
pub trait Reopen: Send + Sync {
    /// Opens the store (the same one at every call) with `keys`. The caller
    /// drops the previous handle first.
    async fn open(&self, keys: SecretKeys) -> StoreResult<DynControlPlaneStore>;

    /// Every stored `secret`, `previous_secret`, `headers`, `oauth2` and
    /// `client_tls` value, as stored, with no handle open.
    async fn stored_secrets(&self) -> Vec<String>;

    /// Copies the stored `secret` of endpoint `from` onto endpoint `to`, as
    /// someone with write access to the database could, with no handle open.
    async fn copy_secret(&self, from: EndpointId, to: EndpointId);
}

/// A custom header's value, sealed like the secrets.
const HEADER: &str = "hdr-value-7";
/// An OAuth2 client secret, sealed like the secrets.
const CLIENT_SECRET: &str = "oauth-client-secret-9";

fn client_credentials() -> ClientCredentials {
    ClientCredentials {
        token_url: "https://auth.example.com/token".into(),
        client_id: "hooks".into(),
        client_secret: CLIENT_SECRET.into(),
        scope: None,
        audience: None,
    }
}

fn secret(n: u8) -> Secret {
    Secret::new(format!("whsec_{}", format!("c2VjcmV0{n}").repeat(4)))
}

async fn endpoint(store: &DynControlPlaneStore, s: Secret) -> Endpoint {
    let acct = AccountId::new("sealed").unwrap();
    store
        .endpoint_create(
            EndpointCreateRequest::new(acct, "https://example.com/hook", s)
                .checked()
                .unwrap(),
        )
        .await
        .unwrap()
}

async fn read(store: &DynControlPlaneStore, id: EndpointId) -> SigningSecrets {
    let acct = AccountId::new("sealed").unwrap();
    store.endpoint_get(&acct, id).await.unwrap().secrets
}

/// Publishes one event of the test account and claims what it fanned out to.
async fn publish_and_claim(store: &DynControlPlaneStore) -> Vec<ClaimedDelivery> {
    let acct = AccountId::new("sealed").unwrap();
    store
        .event_publish(
            PublishRequest::new(acct, "a.b", serde_json::json!({}))
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    store
        .delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(30)).unwrap())
        .await
        .unwrap()
}

/// Plain text written before keys existed still reads; every write under
/// a key is sealed and shows nothing of the secret (or of custom headers,
/// OAuth2 credentials, a client certificate or its key); a store holding values
/// sealed under a key it is not given refuses to open, naming the key; a
/// rotation (new key current, old one previous, `endpoint_reseal_secrets`
/// in batches) leaves every value under the new key, readable with it
/// alone, and a claim hands the sender the opened secrets.
pub async fn secrets_are_sealed_at_rest_and_rotate(r: &impl Reopen) {
    let old = SecretKey::generate();
    let new = SecretKey::generate();

    // Before keys: plain text.
    let store = r.open(SecretKeys::default()).await.unwrap();
    let plain = endpoint(&store, secret(1)).await;
    drop(store);
    assert!(r
        .stored_secrets()
        .await
        .contains(&secret(1).expose().to_string()));

    // Under the old key: the plain value reads, new writes are sealed.
    let store = r.open(SecretKeys::new(old.clone(), vec![])).await.unwrap();
    assert_eq!(read(&store, plain.id).await.current, secret(1));
    let sealed = {
        let mut req = EndpointCreateRequest::new(
            AccountId::new("sealed").unwrap(),
            "https://example.com/hook",
            secret(2),
        );
        req.headers = [("X-Api-Key".to_string(), HEADER.to_string())].into();
        req.oauth2 = Some(client_credentials());
        req.client_tls = Some(client_tls("client"));
        store.endpoint_create(req.checked().unwrap()).await.unwrap()
    };
    store
        .endpoint_rotate_secret(
            EndpointKey::new(&sealed.account, sealed.id),
            SecretRotation {
                secret: secret(3),
                grace: Duration::from_secs(3600),
            },
        )
        .await
        .unwrap();
    drop(store);
    let raw = r.stored_secrets().await;
    assert_eq!(
        raw.len(),
        6,
        "three secrets, one set of headers, one of OAuth2 credentials, one client certificate: {raw:?}"
    );
    for s in [secret(2), secret(3)] {
        let body = s.expose().trim_start_matches("whsec_").to_string();
        assert!(!raw.iter().any(|v| v.contains(&body)), "{raw:?}");
    }
    assert!(!raw.iter().any(|v| v.contains(HEADER)), "{raw:?}");
    assert!(!raw.iter().any(|v| v.contains(CLIENT_SECRET)), "{raw:?}");
    // Neither the private key nor the certificate is readable at rest: a
    // reader of the store or its backups sees neither.
    let pair = client_tls("client");
    for line in [pair.key.lines().nth(1), pair.certificate.lines().nth(1)] {
        let line = line.unwrap();
        assert!(!raw.iter().any(|v| v.contains(line)), "{raw:?}");
    }
    let under_old = raw
        .iter()
        .filter(|v| key_id_of(v) == Some(old.id()))
        .count();
    assert_eq!(under_old, 5, "{raw:?}");

    // Without the old key the store refuses to start, naming it.
    for keys in [SecretKeys::default(), SecretKeys::new(new.clone(), vec![])] {
        let e = r
            .open(keys)
            .await
            .err()
            .expect("a store with unknown keys opens");
        assert!(e.to_string().contains(old.id()), "{e}");
    }

    // Rotation: new key current, old previous; reseal in batches of one.
    let store = r
        .open(SecretKeys::new(new.clone(), vec![old.clone()]))
        .await
        .unwrap();
    let mut resealed = 0;
    loop {
        let n = store.endpoint_reseal_secrets(1).await.unwrap();
        if n == 0 {
            break;
        }
        assert_eq!(n, 1, "a batch of one");
        resealed += n;
    }
    assert_eq!(resealed, 2, "both endpoints, the plain one included");
    drop(store);
    let raw = r.stored_secrets().await;
    assert!(
        raw.iter()
            .all(|v| v.starts_with(SEALED_PREFIX) && key_id_of(v) == Some(new.id())),
        "{raw:?}"
    );

    // The new key alone reads every value, and a claim opens them for the sender.
    let store = r.open(SecretKeys::new(new.clone(), vec![])).await.unwrap();
    assert_eq!(read(&store, plain.id).await.current, secret(1));
    let rotated = read(&store, sealed.id).await;
    assert_eq!(
        (rotated.current, rotated.previous),
        (secret(3), Some(secret(2)))
    );
    let claimed = publish_and_claim(&store).await;
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        let want = if c.delivery.endpoint_id == plain.id {
            secret(1)
        } else {
            secret(3)
        };
        assert_eq!(c.secrets.current, want);
        if c.delivery.endpoint_id == sealed.id {
            let headers = custom_header_pairs(c.headers.as_ref().unwrap()).unwrap();
            assert_eq!(headers, vec![("x-api-key".to_string(), HEADER.to_string())]);
            let oauth2 = ClientCredentials::from_text(c.oauth2.as_ref().unwrap()).unwrap();
            assert_eq!(oauth2, client_credentials());
            let tls = ClientTls::from_text(c.client_tls.as_ref().unwrap()).unwrap();
            assert_eq!(tls, client_tls("client"));
        } else {
            assert_eq!((&c.headers, &c.oauth2), (&None, &None));
            assert_eq!(c.client_tls, None);
        }
    }
    // Nothing left to rotate.
    assert_eq!(store.endpoint_reseal_secrets(10).await.unwrap(), 0);
    drop(store);

    // A sealed value copied onto another endpoint does not open there, and
    // it stops that endpoint's deliveries only: a claim still hands out the
    // others.
    r.copy_secret(sealed.id, plain.id).await;
    let store = r.open(SecretKeys::new(new.clone(), vec![])).await.unwrap();
    let acct = AccountId::new("sealed").unwrap();
    assert!(store.endpoint_get(&acct, plain.id).await.is_err());
    let claimed = publish_and_claim(&store).await;
    let to: Vec<EndpointId> = claimed.iter().map(|c| c.delivery.endpoint_id).collect();
    assert_eq!(to, vec![sealed.id], "the intact endpoint's delivery only");
}
