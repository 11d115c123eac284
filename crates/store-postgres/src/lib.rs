#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attempt;
mod config;
mod delivery;
mod endpoint;
mod error;
mod notify;
mod ops;
mod store;
mod util;
mod workflow;

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::*;

pub use config::PostgresConfig;
pub use delivery::claim_statement;
pub use error::classify;
use store::in_tx;
pub use store::PostgresStore;

impl PostgresStore {
    /// The outbox: publishes inside the caller's own transaction, so the
    /// event and its deliveries commit or roll back with the caller's
    /// business write. The caller's connection must reach this store's
    /// schema (its `search_path`, as [`PostgresStore::schema`] names).
    ///
    /// # Errors
    /// As [`DeliveryStore::event_publish_batch`]; an error leaves the caller's
    /// transaction to be rolled back.
    pub async fn publish_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        reqs: Vec<PublishRequest>,
    ) -> StoreResult<Vec<Published>> {
        delivery::publish(tx, self.now(), &self.options, reqs).await
    }

    /// Wakes workers on every replica; call it after committing a
    /// transaction that used [`PostgresStore::publish_in`].
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached (workers still poll).
    pub async fn notify_committed(&self) -> StoreResult<()> {
        self.wakeup.notify();
        let client = self.pool.get().await.map_err(error::map_pool)?;
        client
            .execute("SELECT pg_notify($1, '')", &[&self.channel])
            .await
            .map_err(error::map)?;
        Ok(())
    }
}

#[async_trait]
impl EndpointStore for PostgresStore {
    async fn endpoint_create(&self, req: EndpointCreateRequest) -> StoreResult<Endpoint> {
        in_tx!(self, |tx| endpoint::create(&tx, self.now(), req))
    }

    async fn endpoint_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
        in_tx!(self, |tx| endpoint::get(&tx, account, id))
    }

    async fn endpoint_list(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        in_tx!(self, |tx| endpoint::list(&tx, account))
    }

    async fn endpoint_update(
        &self,
        account: &AccountId,
        id: EndpointId,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint> {
        in_tx!(self, |tx| endpoint::update(
            &tx,
            self.now(),
            account,
            id,
            req
        ))
    }

    async fn endpoint_rotate_secret(
        &self,
        account: &AccountId,
        id: EndpointId,
        secret: Secret,
        grace: Duration,
    ) -> StoreResult<Endpoint> {
        in_tx!(self, |tx| endpoint::rotate_secret(
            &tx,
            self.now(),
            account,
            id,
            secret,
            grace
        ))
    }

    async fn endpoint_set_enabled(
        &self,
        account: &AccountId,
        id: EndpointId,
        enablement: Enablement,
    ) -> StoreResult<Endpoint> {
        let (enabled, reason) = enablement.into_row();
        in_tx!(self, notify, |tx| endpoint::set_enabled(
            &tx,
            self.now(),
            account,
            id,
            enabled,
            reason
        ))
    }

    async fn endpoint_delete(&self, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
        in_tx!(self, |tx| endpoint::delete(&tx, self.now(), account, id))
    }
}

#[async_trait]
impl DeliveryStore for PostgresStore {
    async fn event_publish(&self, req: PublishRequest) -> StoreResult<Published> {
        let mut v = self.event_publish_batch(vec![req]).await?;
        v.pop()
            .ok_or_else(|| StoreError::Backend("publish returned no event".into()))
    }

    async fn event_publish_batch(&self, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
        in_tx!(self, notify, |tx| delivery::publish(
            &tx,
            self.now(),
            &self.options,
            reqs
        ))
    }

    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event> {
        in_tx!(self, |tx| delivery::event_get(&tx, account, id))
    }

    async fn delivery_enqueue(
        &self,
        account: &AccountId,
        endpoint: EndpointId,
        event: EventId,
    ) -> StoreResult<Enqueued> {
        in_tx!(self, notify, |tx| delivery::enqueue(
            &tx,
            self.now(),
            &self.options,
            account,
            endpoint,
            event
        ))
    }

    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
        let now = self.now();
        let housekeeping = self.housekeeping.due(now);
        in_tx!(self, |tx| delivery::claim(
            &tx,
            now,
            &self.options,
            req,
            housekeeping
        ))
    }

    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
        in_tx!(self, |tx| delivery::extend(
            &tx,
            self.now(),
            lease,
            lease_for
        ))
    }

    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()> {
        in_tx!(self, notify, |tx| delivery::release(&tx, self.now(), lease))
    }

    async fn delivery_record_outcome(
        &self,
        lease: &Lease,
        outcome: DeliveryOutcome,
    ) -> StoreResult<OutcomeRecorded> {
        if let DeliveryOutcome::Delivered(report) = &outcome {
            let client = self.pool.get().await.map_err(error::map_pool)?;
            let done =
                delivery::record_delivered_fast_batch(&client, self.now(), &[(lease, report)])
                    .await?;
            if !done.is_empty() {
                return Ok(OutcomeRecorded {
                    state: DeliveryState::Delivered,
                    duplicate: false,
                });
            }
        }
        in_tx!(self, |tx| delivery::record_outcome(
            &tx,
            self.now(),
            &self.options,
            lease,
            outcome
        ))
    }

    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
        let now = self.now();
        let mut seen = std::collections::HashMap::new();
        for (lease, _) in &batch {
            *seen.entry(lease.delivery_id).or_insert(0u32) += 1;
        }
        // Successes of deliveries named once in the batch go in one statement.
        let fast: Vec<(&Lease, &AttemptReport)> = batch
            .iter()
            .filter(|(l, _)| seen.get(&l.delivery_id) == Some(&1))
            .filter_map(|(l, o)| match o {
                DeliveryOutcome::Delivered(r) => Some((l, r)),
                _ => None,
            })
            .collect();
        let mut client = self.pool.get().await.map_err(error::map_pool)?;
        // One autocommitted statement; the common batch is done with it.
        let done: std::collections::HashSet<DeliveryId> =
            delivery::record_delivered_fast_batch(&client, now, &fast)
                .await?
                .into_iter()
                .collect();
        if done.len() == batch.len() {
            return Ok(batch
                .iter()
                .map(|_| {
                    Ok(OutcomeRecorded {
                        state: DeliveryState::Delivered,
                        duplicate: false,
                    })
                })
                .collect());
        }
        let tx = client.transaction().await.map_err(error::map)?;
        let mut out = Vec::with_capacity(batch.len());
        for (lease, outcome) in batch {
            if done.contains(&lease.delivery_id) {
                out.push(Ok(OutcomeRecorded {
                    state: DeliveryState::Delivered,
                    duplicate: false,
                }));
                continue;
            }
            // Contract answers come from checks, not from failed statements,
            // so the transaction stays usable after them.
            match delivery::record_outcome(&tx, now, &self.options, &lease, outcome).await {
                Err(e) if !e.is_contract_answer() => return Err(e),
                r => out.push(r),
            }
        }
        tx.commit().await.map_err(error::map)?;
        Ok(out)
    }

    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        in_tx!(self, notify, |tx| delivery::replay(
            &tx,
            self.now(),
            &self.options,
            account,
            id
        ))
    }

    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        in_tx!(self, |tx| delivery::get(&tx, account, id))
    }

    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
        in_tx!(self, |tx| delivery::list(&tx, req))
    }

    fn delivery_wakeups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.wakeup.subscribe()
    }

    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        in_tx!(self, |tx| delivery::count_by_state(&tx))
    }
}

#[async_trait]
impl AttemptLogStore for PostgresStore {
    async fn attempt_list_for_delivery(
        &self,
        account: &AccountId,
        id: DeliveryId,
    ) -> StoreResult<Vec<AttemptRecord>> {
        in_tx!(self, |tx| attempt::list_for_delivery(&tx, account, id))
    }

    async fn attempt_list_for_endpoint(
        &self,
        account: &AccountId,
        id: EndpointId,
        page: PageRequest,
    ) -> StoreResult<Page<AttemptRecord>> {
        in_tx!(self, |tx| attempt::list_for_endpoint(
            &tx, account, id, page
        ))
    }
}

#[async_trait]
impl CircuitStore for PostgresStore {
    async fn circuit_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Circuit> {
        in_tx!(self, |tx| endpoint::circuit_of(&tx, account, id))
    }

    async fn circuit_count_open(&self) -> StoreResult<u64> {
        let client = self.pool.get().await.map_err(error::map_pool)?;
        let row = client
            .query_one(
                "SELECT count(*) FROM circuits c JOIN endpoints e ON e.id = c.endpoint_id \
                 WHERE c.mode <> 'closed' AND e.deleted_at IS NULL",
                &[],
            )
            .await
            .map_err(error::map)?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}

#[async_trait]
impl WorkflowStore for PostgresStore {
    async fn workflow_enqueue(&self, req: TaskEnqueueRequest) -> StoreResult<TaskEnqueued> {
        in_tx!(self, |tx| workflow::enqueue(
            &tx,
            self.now(),
            &self.options,
            req
        ))
    }

    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
        in_tx!(self, |tx| workflow::claim(&tx, self.now(), req))
    }

    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        lease_for: Duration,
    ) -> StoreResult<TaskLease> {
        in_tx!(self, |tx| workflow::heartbeat(
            &tx,
            self.now(),
            lease,
            lease_for
        ))
    }

    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()> {
        in_tx!(self, |tx| workflow::stage(&tx, self.now(), lease, result))
    }

    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task> {
        in_tx!(self, |tx| workflow::complete(
            &tx,
            self.now(),
            lease,
            result
        ))
    }

    async fn workflow_fail(
        &self,
        lease: &TaskLease,
        error: String,
        failure: TaskFailure,
    ) -> StoreResult<Task> {
        in_tx!(self, |tx| workflow::fail(
            &tx,
            self.now(),
            &self.options,
            lease,
            error,
            failure
        ))
    }

    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()> {
        in_tx!(self, |tx| workflow::release(&tx, self.now(), lease))
    }

    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        in_tx!(self, |tx| workflow::get(&tx, account, id))
    }

    async fn workflow_list_dead(
        &self,
        account: &AccountId,
        page: PageRequest,
    ) -> StoreResult<Page<Task>> {
        in_tx!(self, |tx| workflow::list_dead(&tx, account, page))
    }

    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        in_tx!(self, |tx| workflow::retry_dead(
            &tx,
            self.now(),
            &self.options,
            account,
            id
        ))
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        ttl: Duration,
    ) -> StoreResult<IdempotencyBegin> {
        in_tx!(self, |tx| ops::idempotency_begin(
            &tx,
            self.now(),
            scope,
            key,
            request_hash,
            ttl
        ))
    }

    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()> {
        in_tx!(self, |tx| ops::idempotency_complete(&tx, token, response))
    }

    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()> {
        in_tx!(self, |tx| ops::idempotency_abandon(&tx, token))
    }
}

#[async_trait]
impl TickStore for PostgresStore {
    async fn tick_claim(
        &self,
        name: &str,
        lease_for: Duration,
        every: Duration,
    ) -> StoreResult<Option<TickLease>> {
        in_tx!(self, |tx| ops::tick_claim(
            &tx,
            self.now(),
            name,
            lease_for,
            every
        ))
    }

    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()> {
        in_tx!(self, |tx| ops::tick_complete(&tx, self.now(), lease, state))
    }
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn usage_record(&self, batch: UsageBatch) -> StoreResult<bool> {
        in_tx!(self, |tx| ops::usage_record(&tx, self.now(), batch))
    }

    async fn usage_query(
        &self,
        account: &AccountId,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<Vec<UsageRow>> {
        in_tx!(self, |tx| ops::usage_query(&tx, account, from, to))
    }
}

#[async_trait]
impl AlertStore for PostgresStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        in_tx!(self, |tx| ops::alert_list(&tx, account, page))
    }
}

#[async_trait]
impl AccountKeyStore for PostgresStore {
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &str,
    ) -> StoreResult<AccountKey> {
        in_tx!(self, |tx| ops::account_key_create(
            &tx,
            self.now(),
            account,
            key_hash
        ))
    }

    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>> {
        in_tx!(self, |tx| ops::account_key_find(&tx, key_hash))
    }

    async fn account_key_revoke(&self, account: &AccountId, id: KeyId) -> StoreResult<()> {
        in_tx!(self, |tx| ops::account_key_revoke(&tx, account, id))
    }
}

#[async_trait]
impl MaintenanceStore for PostgresStore {
    async fn maintenance_purge(&self, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
        let client = self.pool.get().await.map_err(error::map_pool)?;
        ops::purge(&client, self.now(), retention, batch).await
    }
}

#[async_trait]
impl ControlPlaneStore for PostgresStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        let client = self.pool.get().await.map_err(error::map_pool)?;
        client.simple_query("SELECT 1").await.map_err(error::map)?;
        Ok(())
    }
}
