//! Contracts of portal links (ADR 0049).

use std::time::Duration;

use crate::contracts::fixtures::{acct, rows};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    Clock, EndpointId, PortalLink, PortalLinkCreateRequest, PortalLinkId, PortalRole, StoreError,
    StoreOptions,
};

const DAY: Duration = Duration::from_secs(86_400);

/// A token hash made of one repeated hex digit.
fn hash(c: char) -> String {
    c.to_string().repeat(64)
}

/// Creates a link of `account` whose token hashes to `hash(c)`.
async fn link(
    h: &Harness,
    account: &str,
    c: char,
    role: PortalRole,
    endpoints: Vec<EndpointId>,
    life: Duration,
) -> PortalLink {
    let req = PortalLinkCreateRequest::new(acct(account), hash(c), role, endpoints, life).unwrap();
    h.store.portal_link_create(req).await.unwrap()
}

/// `PortalStore::portal_link_create`, `portal_link_list` and
/// `portal_link_revoke`: links are listed with their account only, newest
/// first; revoking one of another account is `NotFound` and changes
/// nothing; a revoked link stays listed with its revocation until it
/// expires.
pub async fn portal_links_are_listed_and_revoked_per_account(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let e = EndpointId::new();
    let a1 = link(&h, "a", '1', PortalRole::Viewer, vec![e], DAY).await;
    assert_eq!(
        (a1.role, a1.endpoints.clone(), a1.created_at, a1.expires_at),
        (
            PortalRole::Viewer,
            vec![e],
            h.clock.now(),
            h.clock.now().plus(DAY)
        )
    );
    assert_eq!((a1.redeemed_at, a1.revoked_at), (None, None));
    h.clock.advance(Duration::from_secs(1));
    let a2 = link(&h, "a", '2', PortalRole::Manager, vec![], 2 * DAY).await;
    let b1 = link(&h, "b", '3', PortalRole::Manager, vec![], DAY).await;
    let again = PortalLinkCreateRequest::new(acct("b"), hash('1'), PortalRole::Viewer, vec![], DAY);
    assert!(matches!(
        h.store.portal_link_create(again.unwrap()).await,
        Err(StoreError::Conflict(_))
    ));
    let listed = h.store.portal_link_list(&acct("a")).await.unwrap();
    assert_eq!(
        listed,
        vec![a2.clone(), a1.clone()],
        "newest first, a's only"
    );
    assert!(matches!(
        h.store.portal_link_revoke(&acct("a"), b1.id).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        h.store
            .portal_link_revoke(&acct("a"), PortalLinkId::new())
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        h.store.portal_link_list(&acct("b")).await.unwrap(),
        vec![b1.clone()],
        "another account's link is untouched"
    );
    h.store.portal_link_revoke(&acct("a"), a1.id).await.unwrap();
    h.clock.advance(Duration::from_secs(1));
    h.store.portal_link_revoke(&acct("a"), a1.id).await.unwrap();
    let listed = h.store.portal_link_list(&acct("a")).await.unwrap();
    let revoked = listed.iter().find(|l| l.id == a1.id).unwrap();
    assert_eq!(
        revoked.revoked_at,
        Some(h.clock.now().minus(Duration::from_secs(1))),
        "revoked once, at its first revocation"
    );
    h.clock.advance(DAY);
    let listed: Vec<PortalLinkId> = h
        .store
        .portal_link_list(&acct("a"))
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(listed, vec![a2.id], "an expired link is listed no more");
    let purged = h
        .store
        .maintenance_purge(Duration::from_secs(30 * 86_400), rows(100))
        .await
        .unwrap();
    assert_eq!(purged.portal_links, 2, "the expired links go");
    assert_eq!(h.store.portal_link_list(&acct("a")).await.unwrap().len(), 1);
}

/// `PortalStore::portal_link_redeem`: of many concurrent redemptions of one
/// link exactly one gets it; every later one gets nothing, and the link is
/// still found (for the session it opened).
pub async fn a_portal_link_is_redeemed_once(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let created = link(&h, "a", 'a', PortalRole::Manager, vec![], DAY).await;
    let mut racers = Vec::new();
    for _ in 0..8 {
        let store = h.store.clone();
        racers.push(tokio::spawn(async move {
            store.portal_link_redeem(&hash('a')).await.unwrap()
        }));
    }
    let mut won = Vec::new();
    for r in racers {
        won.extend(r.await.unwrap());
    }
    assert_eq!(won.len(), 1, "exactly one redemption wins: {won:?}");
    assert_eq!(won[0].id, created.id);
    assert_eq!(won[0].redeemed_at, Some(h.clock.now()));
    assert_eq!(h.store.portal_link_redeem(&hash('a')).await.unwrap(), None);
    assert_eq!(
        h.store.portal_link_find(&hash('a')).await.unwrap(),
        Some(won[0].clone()),
        "a redeemed link still holds for its session"
    );
    assert_eq!(h.store.portal_link_redeem(&hash('9')).await.unwrap(), None);
}

/// `PortalStore::portal_link_find` and `portal_link_redeem`: a link is
/// found until it is revoked or expires, then never again; a revoked or
/// expired link is not redeemed.
pub async fn a_portal_link_is_found_until_revoked_or_expired(f: &dyn StoreFactory) {
    let h = f.open(StoreOptions::default()).await;
    let hour = Duration::from_secs(3600);
    let short = link(&h, "a", 'b', PortalRole::Viewer, vec![], hour).await;
    let revoked = link(&h, "a", 'c', PortalRole::Viewer, vec![], DAY).await;
    assert_eq!(
        h.store.portal_link_find(&hash('b')).await.unwrap(),
        Some(short.clone())
    );
    h.store
        .portal_link_revoke(&acct("a"), revoked.id)
        .await
        .unwrap();
    assert_eq!(h.store.portal_link_find(&hash('c')).await.unwrap(), None);
    assert_eq!(h.store.portal_link_redeem(&hash('c')).await.unwrap(), None);
    h.clock.advance(hour - Duration::from_millis(1));
    assert!(h
        .store
        .portal_link_find(&hash('b'))
        .await
        .unwrap()
        .is_some());
    h.clock.advance(Duration::from_millis(1));
    assert_eq!(
        h.store.portal_link_find(&hash('b')).await.unwrap(),
        None,
        "expired at its end"
    );
    assert_eq!(h.store.portal_link_redeem(&hash('b')).await.unwrap(), None);
    assert_eq!(h.store.portal_link_find(&hash('0')).await.unwrap(), None);
}
