#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod account_key;
mod alert;
mod attempt;
mod catalogue;
mod config;
mod delivery;
mod endpoint;
mod erasure;
mod error;
mod idempotency;
mod maintenance;
mod notify;
mod session;
mod store;
mod tick;
mod usage;
mod util;
mod workflow;

use async_trait::async_trait;
use control_plane_core::*;

pub use config::PostgresConfig;
pub use delivery::{claim_statement, LEASED, RECORD_DELIVERED};
pub use error::classify;
pub use store::{PostgresStore, CLAIM_SETTINGS, GENERIC_PLANS};

#[async_trait]
impl ControlPlaneStore for PostgresStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// Four: enough groups in flight to keep a commit's disk wait busy
    /// (ADR 0015), few enough to leave the pool to the workers.
    fn write_concurrency(&self) -> usize {
        4
    }

    async fn ping(&self) -> StoreResult<()> {
        let client = self.pool.get().await.map_err(crate::error::map_pool)?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(crate::error::map)?;
        Ok(())
    }
}
