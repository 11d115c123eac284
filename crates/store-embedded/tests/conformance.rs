//! The embedded adapter runs the whole conformance suite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::{conformance_suite, Harness, StoreFactory};
use control_plane_core::{ManualClock, SecretKey, SecretKeys, StoreOptions};
use store_embedded::{EmbeddedConfig, EmbeddedStore};

/// Each store gets a fresh file in its own temporary directory.
struct Embedded;

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
        };
        let store = EmbeddedStore::open(config, clock.clone()).await.unwrap();
        Harness {
            store: Arc::new(store),
            clock,
            guard: Box::new(dir),
        }
    }
}

conformance_suite!(Embedded);
