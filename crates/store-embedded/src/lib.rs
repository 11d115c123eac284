#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod account_key;
mod alert;
mod attempt;
mod cache;
mod catalogue;
mod config;
mod delivery;
mod endpoint;
mod erasure;
mod error;
mod finished;
mod idempotency;
mod live;
mod maintenance;
mod poll;
mod portal;
mod session;
mod store;
mod tick;
mod usage;
mod util;
mod workflow;

use async_trait::async_trait;

use control_plane_core::{ControlPlaneStore, StoreResult};

pub use config::{EmbeddedConfig, DEFAULT_LIVE_INDEX_LIMIT, DEFAULT_LIVE_WINDOW};
pub use store::EmbeddedStore;

#[async_trait]
impl ControlPlaneStore for EmbeddedStore {
    fn backend_name(&self) -> &'static str {
        "embedded"
    }

    /// One: every transaction runs on the one writer thread.
    fn write_concurrency(&self) -> usize {
        1
    }

    async fn ping(&self) -> StoreResult<()> {
        self.call(crate::store::Lane::Request, |_| Ok(())).await
    }
}
