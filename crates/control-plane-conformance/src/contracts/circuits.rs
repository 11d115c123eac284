//! Contracts of circuit breakers and the endpoints they disable.

use crate::contracts::fixtures::{
    acct, claim, endpoint, endpoint_for, fail_at, ids, ok, open, open_circuit, publish, publish_ok,
    publish_req, record, reread, with_breaker, LEASE,
};
use crate::StoreFactory;
use control_plane_core::{
    AttemptReport, Circuit, CircuitMode, ClaimRequest, Clock, DeliveryOutcome, DeliveryState,
    Enablement, EndpointId, EndpointKey, StoreOptions,
};
use std::collections::HashMap;
use std::time::Duration;

/// `DeliveryStore::delivery_record_outcome`: 410 disables the endpoint and holds the delivery.
pub async fn gone_disables_endpoint_and_holds_delivery(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    let c = claim(&h, 1).await.remove(0);
    let gone = DeliveryOutcome::Gone(AttemptReport {
        status_code: Some(410),
        error: None,
        latency_ms: 1,
        response_body: None,
    });
    assert_eq!(record(&h, &c, gone).await.state, DeliveryState::Pending);
    let ep = reread(&h, &e).await;
    assert!(!ep.enabled);
    assert!(ep.disabled_reason.unwrap_or_default().contains("410"));
    assert!(claim(&h, 1).await.is_empty());
    h.store
        .endpoint_set_enabled(EndpointKey::new(&acct("a"), e.id), Enablement::Enabled)
        .await
        .unwrap();
    let again = claim(&h, 1).await;
    assert_eq!(ids(&again), vec![id]);
    assert_eq!(again[0].lease.attempt, 2);
}

/// `DeliveryStore::delivery_record_outcome`: consecutive failures open the circuit at the threshold.
pub async fn circuit_opens_at_threshold(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(3, 30, 600)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 2).await;
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!((c.mode, c.consecutive_failures), (CircuitMode::Closed, 2));
    assert_eq!(h.store.circuit_count_open().await.unwrap(), 0);
    open_circuit(&h, &e, 1).await;
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(c.mode, CircuitMode::Open);
    assert_eq!(h.store.circuit_count_open().await.unwrap(), 1);
    assert_eq!(
        c.open_until,
        Some(h.clock.now().plus(Duration::from_secs(30)))
    );
    publish(&h, "a").await;
    assert!(claim(&h, 10).await.is_empty(), "an open circuit is skipped");
}

/// `DeliveryStore::delivery_claim`: after the cooldown exactly one claimer gets
/// one probe, the claimers being replicas (each with its own connections and
/// housekeeping, where the adapter has them).
pub async fn circuit_admits_exactly_one_probe_after_cooldown(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 600)).await;
    let mut replicas = Vec::new();
    for _ in 0..4 {
        replicas.push(f.replica(&h, with_breaker(1, 30, 600)).await);
    }
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    for _ in 0..5 {
        publish(&h, "a").await;
    }
    h.clock.advance(Duration::from_secs(29));
    assert!(claim(&h, 10).await.is_empty());
    h.clock.advance(Duration::from_secs(1));
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                s.delivery_claim(ClaimRequest::new("w", 10, LEASE).unwrap())
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.unwrap());
    }
    assert_eq!(got.len(), 1, "exactly one probe");
    assert!(got[0].probe);
    let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
    assert_eq!(c.mode, CircuitMode::HalfOpen);
    assert_eq!(c.probe, Some(got[0].delivery.id));
    assert!(
        claim(&h, 10).await.is_empty(),
        "nothing else while the probe is out"
    );
}

/// `DeliveryStore::delivery_record_outcome`: the probe's success closes the circuit.
pub async fn circuit_closes_on_probe_success(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 600)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    h.clock.advance(Duration::from_secs(30));
    let probe = claim(&h, 10).await.remove(0);
    record(&h, &probe, ok()).await;
    assert_eq!(
        h.store.circuit_get(&acct("a"), e.id).await.unwrap(),
        Circuit::closed()
    );
    let rest = claim(&h, 10).await;
    assert_eq!(rest.len(), 2);
    assert!(rest.iter().all(|c| !c.probe));
}

/// `DeliveryStore::delivery_record_outcome`: a failed probe re-opens with a longer cooldown.
pub async fn circuit_reopens_longer_after_failed_probe(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(1, 30, 100)).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    publish(&h, "a").await;
    publish(&h, "a").await;
    let mut expected = [60u64, 100, 100].into_iter();
    h.clock.advance(Duration::from_secs(30));
    for _ in 0..3 {
        let probe = claim(&h, 10).await;
        assert_eq!(probe.len(), 1);
        assert!(probe[0].probe);
        record(&h, &probe[0], fail_at(h.clock.now())).await;
        let cooldown = expected.next().unwrap();
        let c = h.store.circuit_get(&acct("a"), e.id).await.unwrap();
        assert_eq!(c.mode, CircuitMode::Open);
        assert_eq!(
            c.open_until,
            Some(h.clock.now().plus(Duration::from_secs(cooldown)))
        );
        h.clock.advance(Duration::from_secs(cooldown - 1));
        assert!(claim(&h, 10).await.is_empty());
        h.clock.advance(Duration::from_secs(1));
    }
}

/// `DeliveryStore::delivery_record_outcome`: failing without success for the window disables.
pub async fn endpoint_is_disabled_after_failing_for_the_window(f: &dyn StoreFactory) {
    let opts = StoreOptions {
        disable_after: Duration::from_secs(3600),
        ..with_breaker(1000, 30, 600)
    };
    let h = f.open(opts).await;
    let e = endpoint(&h, "a", false).await;
    open_circuit(&h, &e, 1).await;
    h.clock.advance(Duration::from_secs(1800));
    open_circuit(&h, &e, 1).await;
    assert!(reread(&h, &e).await.enabled);
    h.clock.advance(Duration::from_secs(1800));
    open_circuit(&h, &e, 1).await;
    let ep = reread(&h, &e).await;
    assert!(!ep.enabled);
    assert!(ep.disabled_reason.is_some());
}

/// `CircuitStore::circuit_list`: every live endpoint's circuit of the
/// account in one read, as `circuit_get` reads each.
pub async fn circuits_are_listed_as_each_is_read(f: &dyn StoreFactory) {
    let h = f.open(with_breaker(2, 30, 600)).await;
    let open = endpoint_for(&h, "a", &["to.open"]).await;
    let failing = endpoint_for(&h, "a", &["to.fail"]).await;
    let closed = endpoint_for(&h, "a", &["to.close"]).await;
    let deleted = endpoint_for(&h, "a", &["to.delete"]).await;
    endpoint(&h, "b", false).await;
    for (ty, failures) in [("to.open", 2), ("to.fail", 1)] {
        for _ in 0..failures {
            publish_ok(&h, publish_req("a", ty)).await;
            let c = claim(&h, 1).await;
            assert_eq!(c.len(), 1);
            let later = h.clock.now().plus(Duration::from_secs(3600));
            record(&h, &c[0], fail_at(later)).await;
        }
    }
    h.store
        .endpoint_delete(&acct("a"), deleted.id)
        .await
        .unwrap();
    let listed = h.store.circuit_list(&acct("a")).await.unwrap();
    let mut want = Vec::new();
    for e in h.store.endpoint_list(&acct("a")).await.unwrap() {
        want.push((e.id, h.store.circuit_get(&acct("a"), e.id).await.unwrap()));
    }
    assert_eq!(listed, want);
    let ids: Vec<EndpointId> = listed.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.contains(&closed.id) && !ids.contains(&deleted.id));
    let modes: HashMap<EndpointId, (CircuitMode, u32)> = listed
        .iter()
        .map(|(id, c)| (*id, (c.mode, c.consecutive_failures)))
        .collect();
    assert_eq!(modes[&open.id].0, CircuitMode::Open);
    assert_eq!(modes[&failing.id], (CircuitMode::Closed, 1));
}
