//! Group commit for publishes: concurrent single-event publishes (without an
//! `Idempotency-Key`) that are waiting at the same moment are written in one
//! transaction (`event_publish_batch`), on either adapter.
//!
//! A publish is answered only after the transaction holding it commits, so
//! an answer still means the event is durable. Nothing waits for company: a
//! publish that finds no other waiting is written alone at once, and a group
//! only takes what is already queued. If a group's transaction fails (one
//! caller's bad input fails the whole batch and stores nothing), each of
//! its publishes is written alone, so only the bad one fails; any other
//! error is every caller's answer, never retried here.

use std::sync::{Arc, OnceLock};

use control_plane_core::{
    DynControlPlaneStore, PublishRequest, Published, StoreError, StoreResult,
};
use tokio::sync::{mpsc, oneshot, Mutex};

/// Most publishes written in one transaction. As many groups are in flight
/// at once as the store's `write_concurrency` (each on its own connection
/// on postgres; one on the embedded store's one writer).
const MAX_GROUP: usize = 128;

type Reply = oneshot::Sender<StoreResult<Published>>;

/// The gate every API publish without an idempotency key goes through.
pub(crate) struct Publisher {
    store: DynControlPlaneStore,
    /// Started on the first publish (inside the runtime that serves it).
    queue: OnceLock<mpsc::UnboundedSender<(PublishRequest, Reply)>>,
}

impl Publisher {
    /// A publisher over `store`; its writers start with the first publish
    /// and stop when it is dropped.
    pub(crate) fn new(store: DynControlPlaneStore) -> Publisher {
        Publisher {
            store,
            queue: OnceLock::new(),
        }
    }

    /// Publishes `req`, in a group when others are waiting.
    pub(crate) async fn publish(&self, req: PublishRequest) -> StoreResult<Published> {
        let queue = self.queue.get_or_init(|| {
            let (queue, rx) = mpsc::unbounded_channel();
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..self.store.write_concurrency().max(1) {
                tokio::spawn(write_groups(self.store.clone(), rx.clone()));
            }
            queue
        });
        let (tx, rx) = oneshot::channel();
        queue
            .send((req, tx))
            .map_err(|_| StoreError::Unavailable("the publisher has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("the publisher has stopped".into()))?
    }
}

/// One writer: takes the next publish and whatever else is queued behind
/// it, and writes them.
async fn write_groups(
    store: DynControlPlaneStore,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<(PublishRequest, Reply)>>>,
) {
    loop {
        let mut group = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(first) => group.push(first),
                None => return,
            }
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(next) => group.push(next),
                    Err(_) => break,
                }
            }
        }
        write(&store, group).await;
    }
}

async fn write(store: &DynControlPlaneStore, group: Vec<(PublishRequest, Reply)>) {
    if group.len() > 1 {
        let reqs = group.iter().map(|(r, _)| r.clone()).collect();
        match store.event_publish_batch(reqs).await {
            Ok(published) => {
                let mut published = published.into_iter();
                for (_, reply) in group {
                    let _ = reply.send(published.next().ok_or_else(|| {
                        StoreError::Unavailable("the batch answered fewer events".into())
                    }));
                }
                return;
            }
            // A bad input fails the whole batch and stores nothing: write
            // each alone, so only the bad one fails.
            Err(StoreError::InvalidInput(_)) => {}
            // Anything else is every caller's answer (none is retried here:
            // a batch that failed after its commit must not be written twice).
            Err(e) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        }
    }
    for (req, reply) in group {
        let _ = reply.send(store.event_publish(req).await);
    }
}
