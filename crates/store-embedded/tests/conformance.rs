//! The embedded adapter runs the whole conformance suite twice: as it runs,
//! with the writer's live index (ADR 0028) and windows of two pending
//! deliveries per endpoint (a backlog past them stays in the table), and
//! with the index off, as it
//! runs past its limit (claims scan the table).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::{conformance_suite, Harness, StoreFactory};
use control_plane_core::{ManualClock, StoreOptions};
use control_plane_store_kit::{SecretKey, SecretKeys};
use store_embedded::{EmbeddedConfig, EmbeddedStore};

/// Each store gets a fresh file in its own temporary directory, and keeps
/// at most this many live deliveries in its index.
struct Embedded(usize);

#[async_trait]
impl StoreFactory for Embedded {
    async fn open(&self, options: StoreOptions) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::default());
        let config = EmbeddedConfig {
            path: dir.path().join("store.duckdb"),
            options,
            // The suite runs with endpoint secrets sealed, as the service does.
            keys: SecretKeys::new(SecretKey::generate(), vec![]),
            live_index_limit: self.0,
            // Windows of two pending deliveries per endpoint: most contracts
            // with a backlog then also run its overflow and its refills.
            live_window: 2,
            // Every contract also checks that what the writer keeps in
            // memory (live index, finished tally, caches) is in step with
            // the tables after each of its writes.
            check_against_table: true,
        };
        let store = EmbeddedStore::open(config, clock.clone()).await.unwrap();
        Harness {
            store: Arc::new(store),
            clock,
            guard: Box::new(dir),
        }
    }
}

conformance_suite!(Embedded(store_embedded::DEFAULT_LIVE_INDEX_LIMIT));

mod without_the_live_index {
    use super::*;

    conformance_suite!(Embedded(0));
}
