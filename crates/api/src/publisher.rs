//! Group commit for publishes: concurrent single-event publishes (without an
//! `Idempotency-Key`) that are waiting at the same moment are written in one
//! transaction (`event_publish_batch`), on either adapter.
//!
//! A publish is answered only after the transaction holding it commits, so
//! an answer still means the event is durable. Nothing waits for company: a
//! publish that finds no other waiting is written alone at once, and a group
//! only takes what is already queued. Requests arrive checked ([`Checked`]);
//! if a group's transaction is still refused (one caller's payload fails its
//! type's schema, and the whole batch stores nothing), each of its publishes
//! is written alone, so only the refused one fails; any other error is every
//! caller's answer, never retried here.

use std::sync::OnceLock;

use control_plane_core::{
    Checked, DynControlPlaneStore, PublishRequest, Published, StoreError, StoreResult,
};
use control_plane_runtime::{GroupCommit, Linger};

/// Most publishes written in one transaction. As many groups are in flight
/// at once as the store's `write_concurrency` (each on its own connection
/// on postgres; one on the embedded store's one writer).
const MAX_GROUP: usize = 128;

/// Publishes waiting at most; past it a publish waits for room.
const QUEUE: usize = 8192;

/// The gate every API publish without an idempotency key goes through.
pub(crate) struct Publisher {
    store: DynControlPlaneStore,
    /// Started on the first publish (inside the runtime that serves it).
    group: OnceLock<GroupCommit<Checked<PublishRequest>, Published>>,
}

impl Publisher {
    /// A publisher over `store`; its writers start with the first publish
    /// and stop when it is dropped.
    pub(crate) fn new(store: DynControlPlaneStore) -> Publisher {
        Publisher {
            store,
            group: OnceLock::new(),
        }
    }

    /// Publishes `req`, in a group when others are waiting.
    pub(crate) async fn publish(&self, req: Checked<PublishRequest>) -> StoreResult<Published> {
        let group = self.group.get_or_init(|| {
            let store = self.store.clone();
            let writers = store.write_concurrency();
            let sizes = (QUEUE, MAX_GROUP);
            GroupCommit::start("publisher", writers, sizes, Linger::NONE, move |reqs| {
                let store = store.clone();
                async move { write(&store, reqs).await }
            })
            .0
        });
        group.submit(req).await
    }
}

/// Writes a group: in one transaction when it holds more than one publish;
/// one by one when that transaction was refused for bad input.
async fn write(
    store: &DynControlPlaneStore,
    reqs: Vec<Checked<PublishRequest>>,
) -> Vec<StoreResult<Published>> {
    if reqs.len() > 1 {
        match store.event_publish_batch(reqs.clone()).await {
            Ok(published) => return published.into_iter().map(Ok).collect(),
            // A refused payload fails the whole batch and stores nothing:
            // write each alone, so only the refused one fails.
            Err(StoreError::InvalidInput(_)) => {}
            // Anything else is every caller's answer (none is retried here:
            // a batch that failed after its commit must not be written twice).
            Err(e) => return reqs.iter().map(|_| Err(e.clone())).collect(),
        }
    }
    let mut out = Vec::with_capacity(reqs.len());
    for req in reqs {
        out.push(store.event_publish(req).await);
    }
    out
}
