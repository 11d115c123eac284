//! The port: one narrow trait per area, united in [`ControlPlaneStore`].
//!
//! Every `# Behavior` bullet names the conformance test (in
//! `control-plane-conformance`) that holds it. A time-dependent decision reads
//! the store's injected [`crate::Clock`].

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::StoreResult;

mod deliveries;
mod endpoints;
mod operations;
mod workflows;

pub use deliveries::{
    AttemptLogStore, CatalogueStore, CircuitStore, DeliveryStore, EventStore, PollStore, Wakeups,
};
pub use endpoints::EndpointStore;
pub use operations::{
    AccountKeyStore, AlertStore, ErasureStore, MaintenanceStore, PortalStore, SessionStore,
    UsageStore, MAX_SESSIONS_LISTED,
};
pub use workflows::{IdempotencyStore, TickStore, WorkflowStore};

/// The whole port. Object-safe; used as [`DynControlPlaneStore`].
#[async_trait]
pub trait ControlPlaneStore:
    EndpointStore
    + EventStore
    + CatalogueStore
    + DeliveryStore
    + AttemptLogStore
    + CircuitStore
    + WorkflowStore
    + IdempotencyStore
    + TickStore
    + UsageStore
    + AlertStore
    + AccountKeyStore
    + SessionStore
    + PortalStore
    + PollStore
    + MaintenanceStore
    + ErasureStore
{
    /// The adapter's name (`embedded`, `postgres`).
    fn backend_name(&self) -> &'static str;

    /// How many write transactions the store usefully runs at once: a
    /// caller that groups writes (the API's publisher, ADR 0015) keeps this
    /// many groups in flight. More only splits groups that would have
    /// shared a commit (ADR 0023).
    fn write_concurrency(&self) -> usize;

    /// Checks that the backend answers (readiness).
    ///
    /// # Errors
    /// `Unavailable` when it does not.
    async fn ping(&self) -> StoreResult<()>;
}

/// The port as a shared trait object.
pub type DynControlPlaneStore = Arc<dyn ControlPlaneStore>;
