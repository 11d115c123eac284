//! Events, fan-out and the delivery queue, by stage: `publish`, `claim`,
//! `outcome` (with `transition`, what every change of a live delivery
//! writes) and `read`. The postgres adapter's `delivery` has the same files
//! and function names.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::{
    AccountId, Checked, ClaimRequest, ClaimedDelivery, Delivery, DeliveryId, DeliveryListRequest,
    DeliveryOutcome, DeliveryState, DeliveryStore, EndpointKey, Enqueued, Event, EventId,
    EventListRequest, EventStore, Lease, OutcomeRecorded, Page, PublishRequest, Published,
    ReplayFilter, Requeue, StoreResult, Wakeups,
};

use crate::delivery::claim::claim;
use crate::delivery::publish::publish;
use crate::delivery::read::list;
use crate::store::EmbeddedStore;

mod claim;
pub(crate) mod dead_letters;
mod outcome;
mod publish;
mod read;
mod transition;

use crate::delivery::outcome::{extend, record_outcomes, release, replay_dead, requeue};
use crate::delivery::publish::enqueue;
use crate::delivery::read::{
    count_by_account_and_state, count_by_state, event_by_key, event_get, event_list, get,
};

pub(crate) use outcome::deliver_polled;
pub(crate) use publish::publish_example_to;

#[async_trait]
impl EventStore for EmbeddedStore {
    async fn event_publish_batch(
        &self,
        reqs: Vec<Checked<PublishRequest>>,
    ) -> StoreResult<Vec<Published>> {
        let reqs = reqs.into_iter().map(Checked::into_inner).collect();
        let published = self.tx(move |t| publish(t, reqs)).await?;
        self.wakeup.notify();
        Ok(published)
    }

    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event> {
        let account = account.clone();
        self.tx(move |t| event_get(t, &account, id)).await
    }

    async fn event_find_by_key(
        &self,
        account: &AccountId,
        key: &str,
    ) -> StoreResult<Option<Event>> {
        let (account, key) = (account.clone(), key.to_string());
        self.tx(move |t| event_by_key(t, &account, &key)).await
    }

    async fn event_list(&self, req: EventListRequest) -> StoreResult<Page<Event>> {
        self.tx(move |t| event_list(t, &req)).await
    }
}

#[async_trait]
impl DeliveryStore for EmbeddedStore {
    async fn delivery_enqueue(
        &self,
        endpoint: EndpointKey<'_>,
        event: EventId,
    ) -> StoreResult<Enqueued> {
        let (account, endpoint) = (endpoint.account, endpoint.id);
        let account = account.clone();
        let e = self
            .tx(move |t| enqueue(t, &account, endpoint, event))
            .await?;
        if e.won {
            self.wakeup.notify();
        }
        Ok(e)
    }

    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
        self.work_tx(move |t| claim(t, req)).await
    }

    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
        let lease = lease.clone();
        self.work_tx(move |t| extend(t, &lease, lease_for)).await
    }

    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()> {
        let lease = lease.clone();
        self.work_tx(move |t| release(t, &lease)).await?;
        self.wakeup.notify();
        Ok(())
    }

    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
        self.work_tx(move |t| record_outcomes(t, batch)).await
    }

    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let account = account.clone();
        let d = self
            .tx(move |t| requeue(t, &account, id, Requeue::Replay))
            .await?;
        self.wakeup.notify();
        Ok(d)
    }

    async fn delivery_resend(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let account = account.clone();
        let d = self
            .tx(move |t| requeue(t, &account, id, Requeue::Resend))
            .await?;
        self.wakeup.notify();
        Ok(d)
    }

    async fn delivery_replay_dead(&self, filter: ReplayFilter) -> StoreResult<u64> {
        let n = self.tx(move |t| replay_dead(t, &filter)).await?;
        if n > 0 {
            self.wakeup.notify();
        }
        Ok(n)
    }

    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let account = account.clone();
        self.tx(move |t| get(t, &account, id)).await
    }

    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
        self.tx(move |t| list(t, req)).await
    }

    fn delivery_wakeups(&self) -> Box<dyn Wakeups> {
        self.wakeup.subscribe()
    }

    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        self.tx(count_by_state).await
    }

    async fn delivery_count_by_account_and_state(
        &self,
    ) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
        self.tx(count_by_account_and_state).await
    }
}
