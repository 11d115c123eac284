#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attempt;
mod config;
mod delivery;
mod endpoint;
mod error;
mod ops;
mod store;
mod util;
mod workflow;

use std::time::Duration;

use async_trait::async_trait;

use crate::error::DuckResultExt;
use control_plane_core::*;

pub use config::EmbeddedConfig;
pub use store::EmbeddedStore;

#[async_trait]
impl EndpointStore for EmbeddedStore {
    async fn endpoint_create(&self, req: EndpointCreateRequest) -> StoreResult<Endpoint> {
        self.tx(move |t| endpoint::create(t, req)).await
    }

    async fn endpoint_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
        let account = account.clone();
        self.tx(move |t| endpoint::get(t, &account, id)).await
    }

    async fn endpoint_list(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let account = account.clone();
        self.tx(move |t| endpoint::list(t, &account)).await
    }

    async fn endpoint_update(
        &self,
        account: &AccountId,
        id: EndpointId,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint> {
        let account = account.clone();
        self.tx(move |t| endpoint::update(t, &account, id, req))
            .await
    }

    async fn endpoint_rotate_secret(
        &self,
        account: &AccountId,
        id: EndpointId,
        secret: Secret,
        grace: Duration,
    ) -> StoreResult<Endpoint> {
        let account = account.clone();
        self.tx(move |t| endpoint::rotate_secret(t, &account, id, secret, grace))
            .await
    }

    async fn endpoint_set_enabled(
        &self,
        account: &AccountId,
        id: EndpointId,
        enablement: Enablement,
    ) -> StoreResult<Endpoint> {
        let (enabled, reason) = enablement.into_row();
        let account = account.clone();
        let e = self
            .tx(move |t| endpoint::set_enabled(t, &account, id, enabled, reason))
            .await?;
        if enabled {
            self.wakeup.notify();
        }
        Ok(e)
    }

    async fn endpoint_delete(&self, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
        let account = account.clone();
        self.tx(move |t| endpoint::delete(t, &account, id)).await
    }
}

#[async_trait]
impl DeliveryStore for EmbeddedStore {
    async fn event_publish(&self, req: PublishRequest) -> StoreResult<Published> {
        let mut v = self.event_publish_batch(vec![req]).await?;
        v.pop()
            .ok_or_else(|| StoreError::Backend("publish returned no event".into()))
    }

    async fn event_publish_batch(&self, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
        let published = self.tx(move |t| delivery::publish(t, reqs)).await?;
        self.wakeup.notify();
        Ok(published)
    }

    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event> {
        let account = account.clone();
        self.tx(move |t| delivery::event_get(t, &account, id)).await
    }

    async fn delivery_enqueue(
        &self,
        account: &AccountId,
        endpoint: EndpointId,
        event: EventId,
    ) -> StoreResult<Enqueued> {
        let account = account.clone();
        let e = self
            .tx(move |t| delivery::enqueue(t, &account, endpoint, event))
            .await?;
        if e.won {
            self.wakeup.notify();
        }
        Ok(e)
    }

    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
        self.tx(move |t| delivery::claim(t, req)).await
    }

    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
        let lease = lease.clone();
        self.tx(move |t| delivery::extend(t, &lease, lease_for))
            .await
    }

    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()> {
        let lease = lease.clone();
        self.tx(move |t| delivery::release(t, &lease)).await?;
        self.wakeup.notify();
        Ok(())
    }

    async fn delivery_record_outcome(
        &self,
        lease: &Lease,
        outcome: DeliveryOutcome,
    ) -> StoreResult<OutcomeRecorded> {
        let batch = vec![(lease.clone(), outcome)];
        self.tx(move |t| delivery::record_outcomes(t, batch))
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Backend("no outcome was recorded".into())))
    }

    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
        self.tx(move |t| delivery::record_outcomes(t, batch)).await
    }

    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let account = account.clone();
        let d = self.tx(move |t| delivery::replay(t, &account, id)).await?;
        self.wakeup.notify();
        Ok(d)
    }

    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let account = account.clone();
        self.tx(move |t| delivery::get(t, &account, id)).await
    }

    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
        self.tx(move |t| delivery::list(t, req)).await
    }

    fn delivery_wakeups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.wakeup.subscribe()
    }

    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        self.tx(|t| delivery::count_by_state(t)).await
    }
}

#[async_trait]
impl AttemptLogStore for EmbeddedStore {
    async fn attempt_list_for_delivery(
        &self,
        account: &AccountId,
        id: DeliveryId,
    ) -> StoreResult<Vec<AttemptRecord>> {
        let account = account.clone();
        self.tx(move |t| attempt::list_for_delivery(t, &account, id))
            .await
    }

    async fn attempt_list_for_endpoint(
        &self,
        account: &AccountId,
        id: EndpointId,
        page: PageRequest,
    ) -> StoreResult<Page<AttemptRecord>> {
        let account = account.clone();
        self.tx(move |t| attempt::list_for_endpoint(t, &account, id, page))
            .await
    }
}

#[async_trait]
impl CircuitStore for EmbeddedStore {
    async fn circuit_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Circuit> {
        let account = account.clone();
        self.tx(move |t| endpoint::circuit_of(t, &account, id))
            .await
    }

    async fn circuit_count_open(&self) -> StoreResult<u64> {
        self.tx(|t| {
            let n: i64 = t
                .query_row(
                    "SELECT count(*) FROM endpoints WHERE circuit_mode <> 'closed' AND deleted_at IS NULL",
                    [],
                    |r| r.get(0),
                )
                .db()?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }
}

#[async_trait]
impl WorkflowStore for EmbeddedStore {
    async fn workflow_enqueue(&self, req: TaskEnqueueRequest) -> StoreResult<TaskEnqueued> {
        self.tx(move |t| workflow::enqueue(t, req)).await
    }

    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
        self.tx(move |t| workflow::claim(t, req)).await
    }

    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        lease_for: Duration,
    ) -> StoreResult<TaskLease> {
        let lease = lease.clone();
        self.tx(move |t| workflow::heartbeat(t, &lease, lease_for))
            .await
    }

    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()> {
        let lease = lease.clone();
        self.tx(move |t| workflow::stage(t, &lease, result)).await
    }

    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task> {
        let lease = lease.clone();
        self.tx(move |t| workflow::complete(t, &lease, result))
            .await
    }

    async fn workflow_fail(
        &self,
        lease: &TaskLease,
        error: String,
        failure: TaskFailure,
    ) -> StoreResult<Task> {
        let lease = lease.clone();
        self.tx(move |t| workflow::fail(t, &lease, error, failure))
            .await
    }

    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()> {
        let lease = lease.clone();
        self.tx(move |t| workflow::release(t, &lease)).await
    }

    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        let (account, id) = (account.clone(), id.clone());
        self.tx(move |t| workflow::get(t, &account, &id)).await
    }

    async fn workflow_list_dead(
        &self,
        account: &AccountId,
        page: PageRequest,
    ) -> StoreResult<Page<Task>> {
        let account = account.clone();
        self.tx(move |t| workflow::list_dead(t, &account, page))
            .await
    }

    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        let (account, id) = (account.clone(), id.clone());
        self.tx(move |t| workflow::retry_dead(t, &account, &id))
            .await
    }
}

#[async_trait]
impl IdempotencyStore for EmbeddedStore {
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        ttl: Duration,
    ) -> StoreResult<IdempotencyBegin> {
        let (scope, key, hash) = (scope.to_string(), key.to_string(), request_hash.to_string());
        self.tx(move |t| ops::idempotency_begin(t, &scope, &key, &hash, ttl))
            .await
    }

    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()> {
        let token = token.clone();
        self.tx(move |t| ops::idempotency_complete(t, &token, response))
            .await
    }

    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()> {
        let token = token.clone();
        self.tx(move |t| ops::idempotency_abandon(t, &token)).await
    }
}

#[async_trait]
impl TickStore for EmbeddedStore {
    async fn tick_claim(
        &self,
        name: &str,
        lease_for: Duration,
        every: Duration,
    ) -> StoreResult<Option<TickLease>> {
        let name = name.to_string();
        self.tx(move |t| ops::tick_claim(t, &name, lease_for, every))
            .await
    }

    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()> {
        let lease = lease.clone();
        self.tx(move |t| ops::tick_complete(t, &lease, state)).await
    }
}

#[async_trait]
impl UsageStore for EmbeddedStore {
    async fn usage_record(&self, batch: UsageBatch) -> StoreResult<bool> {
        self.tx(move |t| ops::usage_record(t, batch)).await
    }

    async fn usage_query(
        &self,
        account: &AccountId,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<Vec<UsageRow>> {
        let account = account.clone();
        self.tx(move |t| ops::usage_query(t, &account, from, to))
            .await
    }
}

#[async_trait]
impl AlertStore for EmbeddedStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        let account = account.clone();
        self.tx(move |t| ops::alert_list(t, &account, page)).await
    }
}

#[async_trait]
impl AccountKeyStore for EmbeddedStore {
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &str,
    ) -> StoreResult<AccountKey> {
        let account = account.clone();
        let key_hash = key_hash.to_string();
        self.tx(move |t| ops::account_key_create(t, &account, &key_hash))
            .await
    }

    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>> {
        let key_hash = key_hash.to_string();
        self.tx(move |t| ops::account_key_find(t, &key_hash)).await
    }

    async fn account_key_revoke(&self, account: &AccountId, id: KeyId) -> StoreResult<()> {
        let account = account.clone();
        self.tx(move |t| ops::account_key_revoke(t, &account, id))
            .await
    }
}

#[async_trait]
impl MaintenanceStore for EmbeddedStore {
    async fn maintenance_purge(&self, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
        self.tx(move |t| ops::purge(t, retention, batch)).await
    }
}

#[async_trait]
impl ControlPlaneStore for EmbeddedStore {
    fn backend_name(&self) -> &'static str {
        "embedded"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.call(|_| Ok(())).await
    }
}
