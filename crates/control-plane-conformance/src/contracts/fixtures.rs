//! What the contracts build on: stores, endpoints, publishes, claims and
//! outcomes in one line each, for every area of the suite.

use crate::{Harness, StoreFactory};
use control_plane_core::{
    AccountId, AttemptRecord, AttemptReport, BreakerPolicy, Check, ClaimRequest, ClaimedDelivery,
    ClaimedTask, Clock, Delivery, DeliveryId, DeliveryOutcome, DeliveryState, DynControlPlaneStore,
    Endpoint, EndpointCreateRequest, EndpointId, EndpointKey, EventType, EventTypePut, KeyHash,
    OutcomeRecorded, PublishRequest, Published, PurgeBatch, PurgeReport, Secret, SecretRotation,
    StoreError, StoreOptions, StoreResult, TaskClaimRequest, TaskEnqueueRequest, TaskEnqueued,
    TaskId, TickClaimRequest, TickLease, TimeRange, Timestamp, UsageRow, WorkflowPolicy,
};
use serde_json::json;
use std::time::Duration;

pub(super) const LEASE: Duration = Duration::from_secs(30);

pub(super) fn acct(s: &str) -> AccountId {
    AccountId::new(s).unwrap()
}

/// A purge batch of `n` rows per table.
pub(super) fn rows(n: u32) -> PurgeBatch {
    PurgeBatch::new(n).unwrap()
}

pub(super) fn key_hash(s: &str) -> KeyHash {
    KeyHash::new(s).unwrap()
}

pub(super) async fn open(f: &dyn StoreFactory) -> Harness {
    f.open(StoreOptions::default()).await
}

pub(super) fn with_attempts(n: u32) -> StoreOptions {
    StoreOptions {
        max_attempts: n,
        ..StoreOptions::default()
    }
}

pub(super) fn with_breaker(threshold: u32, cooldown_s: u64, max_s: u64) -> StoreOptions {
    StoreOptions {
        breaker: BreakerPolicy {
            failure_threshold: threshold,
            cooldown: Duration::from_secs(cooldown_s),
            max_cooldown: Duration::from_secs(max_s),
        },
        ..StoreOptions::default()
    }
}

pub(super) fn with_endpoint_concurrency(n: u32) -> StoreOptions {
    StoreOptions {
        endpoint_concurrency: n,
        ..StoreOptions::default()
    }
}

pub(super) async fn endpoint(h: &Harness, account: &str, ordered: bool) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.ordered = ordered;
    create_endpoint(h, req).await
}

pub(super) async fn endpoint_for(h: &Harness, account: &str, types: &[&str]) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.event_types = types.iter().map(|s| s.to_string()).collect();
    create_endpoint(h, req).await
}

pub(super) fn publish_req(account: &str, ty: &str) -> PublishRequest {
    PublishRequest::new(acct(account), ty.to_string(), json!({"n": 1}))
}

pub(super) async fn publish(h: &Harness, account: &str) -> Published {
    publish_ok(h, publish_req(account, "invoice.paid")).await
}

pub(super) async fn claim(h: &Harness, limit: u32) -> Vec<ClaimedDelivery> {
    claim_for(h, limit, LEASE).await
}

pub(super) async fn claim_for(
    h: &Harness,
    limit: u32,
    lease_for: Duration,
) -> Vec<ClaimedDelivery> {
    h.store
        .delivery_claim(ClaimRequest::new("w", limit, lease_for).unwrap())
        .await
        .unwrap()
}

pub(super) fn ids(c: &[ClaimedDelivery]) -> Vec<DeliveryId> {
    c.iter().map(|c| c.delivery.id).collect()
}

pub(super) fn ok() -> DeliveryOutcome {
    DeliveryOutcome::Delivered(AttemptReport {
        status_code: Some(200),
        error: None,
        latency_ms: 12,
        response_body: None,
    })
}

pub(super) fn fail_at(at: Timestamp) -> DeliveryOutcome {
    DeliveryOutcome::Retry {
        at,
        report: AttemptReport {
            status_code: Some(500),
            error: None,
            latency_ms: 7,
            response_body: None,
        },
    }
}

pub(super) async fn record(
    h: &Harness,
    c: &ClaimedDelivery,
    o: DeliveryOutcome,
) -> OutcomeRecorded {
    h.store.delivery_record_outcome(&c.lease, o).await.unwrap()
}

pub(super) async fn get(h: &Harness, account: &str, id: DeliveryId) -> Delivery {
    h.store.delivery_get(&acct(account), id).await.unwrap()
}

/// The attempt log of delivery `id` of `account`.
pub(super) async fn attempts(h: &Harness, account: &str, id: DeliveryId) -> Vec<AttemptRecord> {
    h.store
        .attempt_list_for_delivery(&acct(account), id)
        .await
        .unwrap()
}

/// Claims every due delivery and fails it for good (one attempt each);
/// returns (delivery, endpoint) pairs.
pub(super) async fn kill_all(h: &Harness) -> Vec<(DeliveryId, EndpointId)> {
    let mut dead = Vec::new();
    for c in claim(h, 10).await {
        let state = record(h, &c, fail_at(h.clock.now())).await.state;
        assert_eq!(state, DeliveryState::Dead);
        dead.push((c.delivery.id, c.delivery.endpoint_id));
    }
    dead
}

pub(super) async fn open_circuit(h: &Harness, e: &Endpoint, failures: u32) {
    for _ in 0..failures {
        publish(h, "a").await;
        let c = claim(h, 1).await;
        assert_eq!(c.len(), 1, "circuit still closed");
        assert_eq!(c[0].delivery.endpoint_id, e.id);
        record(
            h,
            &c[0],
            fail_at(h.clock.now().plus(Duration::from_secs(3600))),
        )
        .await;
    }
}

/// An endpoint receiving only `ty`, with the given flow limits.
pub(super) async fn limited_endpoint(
    h: &Harness,
    account: &str,
    ty: &str,
    max_in_flight: Option<u32>,
    rate_limit_per_s: Option<u32>,
) -> Endpoint {
    let mut req = EndpointCreateRequest::new(
        acct(account),
        "https://example.com/hook",
        Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
    );
    req.event_types = vec![ty.to_string()];
    req.max_in_flight = max_in_flight;
    req.rate_limit_per_s = rate_limit_per_s;
    create_endpoint(h, req).await
}

pub(super) async fn publish_n(h: &Harness, account: &str, ty: &str, n: usize) {
    let reqs: Vec<_> = (0..n).map(|_| publish_req(account, ty)).collect();
    h.store
        .event_publish_batch(control_plane_core::Checked::all(reqs).unwrap())
        .await
        .unwrap();
}

/// Runs `workers` concurrent claimers, each calling `claim_once(store,
/// worker)` until it gets nothing; returns everything they got.
pub(super) async fn drain_concurrently<T, F, Fut>(
    h: &Harness,
    workers: usize,
    claim_once: F,
) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(DynControlPlaneStore, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Vec<T>> + Send,
{
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (s, claim_once) = (h.store.clone(), claim_once.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = claim_once(s.clone(), w).await;
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// Claims with `workers` concurrent claimers, `limit` each, until every one
/// gets nothing; returns everything claimed.
pub(super) async fn claim_until_empty(
    h: &Harness,
    workers: usize,
    limit: u32,
) -> Vec<ClaimedDelivery> {
    drain_concurrently(h, workers, move |s, w| async move {
        s.delivery_claim(ClaimRequest::new(format!("w{w}"), limit, LEASE).unwrap())
            .await
            .unwrap()
    })
    .await
}

pub(super) fn count_for(c: &[ClaimedDelivery], e: &Endpoint) -> usize {
    c.iter().filter(|c| c.delivery.endpoint_id == e.id).count()
}

pub(super) fn tid(s: &str) -> TaskId {
    TaskId::new(s).unwrap()
}

pub(super) fn task(id: &str, account: &str, kind: &str) -> TaskEnqueueRequest {
    TaskEnqueueRequest {
        id: tid(id),
        account: acct(account),
        kind: kind.into(),
        payload: json!({"id": id}),
        run_at: None,
    }
}

pub(super) fn with_workflow(max_attempts: u32) -> StoreOptions {
    StoreOptions {
        workflow: WorkflowPolicy {
            max_attempts,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
        },
        ..StoreOptions::default()
    }
}

pub(super) async fn claim_kinds(h: &Harness, kinds: &[&str], limit: u32) -> Vec<ClaimedTask> {
    h.store
        .workflow_claim(
            TaskClaimRequest::new(
                "w",
                kinds.iter().map(|k| k.to_string()).collect(),
                limit,
                LEASE,
            )
            .unwrap(),
        )
        .await
        .unwrap()
}

/// Purges with `retention` until a batch removes nothing; the sum.
pub(super) async fn purge_all(h: &Harness, retention: Duration) -> PurgeReport {
    let mut total = PurgeReport::default();
    loop {
        let r = h.store.maintenance_purge(retention, rows(2)).await.unwrap();
        if r.total() == 0 {
            return total;
        }
        total.add(&r);
    }
}

pub(super) fn event(account: &str, n: i64) -> PublishRequest {
    PublishRequest::new(acct(account), "t", json!(n))
}

/// `r` is `InvalidInput` with a message that holds `needle`.
pub(super) fn invalid(r: StoreResult<impl std::fmt::Debug>, needle: &str) {
    match r {
        Err(StoreError::InvalidInput(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected InvalidInput about {needle:?}, got {other:?}"),
    }
}

/// Endpoint `e` as the store has it now, read under its own account.
pub(super) async fn reread(h: &Harness, e: &Endpoint) -> Endpoint {
    h.store.endpoint_get(&e.account, e.id).await.unwrap()
}

/// Claims, and checks that the one delivery claimed is `first`'s again:
/// its second attempt, in its place (the sequence number of `first`).
pub(super) async fn claim_second_attempt(h: &Harness, first: &ClaimedDelivery) -> ClaimedDelivery {
    let again = claim(h, 10).await;
    assert_eq!(ids(&again), vec![first.delivery.id]);
    assert_eq!(
        (again[0].lease.attempt, again[0].delivery.seq),
        (2, first.delivery.seq)
    );
    again.into_iter().next().unwrap()
}

/// Account `a`'s usage rows of windows from `from` to `to`.
pub(super) async fn usage_of_a(h: &Harness, from: Timestamp, to: Timestamp) -> Vec<UsageRow> {
    h.store
        .usage_query(&acct("a"), TimeRange { from, to })
        .await
        .unwrap()
}

/// `r` is `InvalidInput`, whatever its message.
pub(super) fn is_invalid(r: StoreResult<impl std::fmt::Debug>) {
    invalid(r, "");
}

/// Enqueues [`task`]`(id, account, kind)`.
pub(super) async fn enqueue(h: &Harness, id: &str, account: &str, kind: &str) -> TaskEnqueued {
    h.store
        .workflow_enqueue(task(id, account, kind).checked().unwrap())
        .await
        .unwrap()
}

/// Publishes `req`, which must pass its checks.
pub(super) async fn publish_ok(h: &Harness, req: PublishRequest) -> Published {
    h.store.event_publish(req.checked().unwrap()).await.unwrap()
}

/// Registers `req`, which must pass its checks.
pub(super) async fn put_type(h: &Harness, req: EventTypePut) -> EventType {
    h.store
        .event_type_put(req.checked().unwrap())
        .await
        .unwrap()
}

/// Creates the endpoint `req` asks for, which must pass its checks.
pub(super) async fn create_endpoint(h: &Harness, req: EndpointCreateRequest) -> Endpoint {
    h.store
        .endpoint_create(req.checked().unwrap())
        .await
        .unwrap()
}

/// Rotates `e`'s secret to `whsec_bmV3`, the old one kept for `grace`.
pub(super) async fn rotate(h: &Harness, account: &str, e: &Endpoint, grace: Duration) -> Endpoint {
    h.store
        .endpoint_rotate_secret(
            EndpointKey::new(&acct(account), e.id),
            SecretRotation {
                secret: Secret::new("whsec_bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3"),
                grace,
            },
        )
        .await
        .unwrap()
}

/// Claims the tick `name` with `lease`, due every `every`.
pub(super) async fn tick(
    h: &Harness,
    name: &str,
    lease: Duration,
    every: Duration,
) -> Option<TickLease> {
    h.store
        .tick_claim(&TickClaimRequest::new(name, lease, every).unwrap())
        .await
        .unwrap()
}

/// A client certificate and its key (testdata/mtls, made by its `make.sh`;
/// they guard nothing): `other` is a second pair, so `(client, other)` is a
/// key that is not the certificate's.
pub(crate) fn client_tls(which: &str) -> control_plane_core::ClientTls {
    let (certificate, key) = match which {
        "client" => (
            include_str!("../../../../testdata/mtls/client.pem"),
            include_str!("../../../../testdata/mtls/client.key"),
        ),
        "other" => (
            include_str!("../../../../testdata/mtls/other.pem"),
            include_str!("../../../../testdata/mtls/other.key"),
        ),
        _ => (
            include_str!("../../../../testdata/mtls/client.pem"),
            include_str!("../../../../testdata/mtls/other.key"),
        ),
    };
    control_plane_core::ClientTls {
        certificate: certificate.into(),
        key: key.into(),
    }
}
