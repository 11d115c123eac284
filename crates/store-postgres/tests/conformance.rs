//! The postgres adapter runs the whole conformance suite, each test in its own schema.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::{conformance_suite, Harness, StoreFactory};
use control_plane_core::{DynControlPlaneStore, ManualClock, StoreOptions};

struct Postgres;

#[async_trait]
impl StoreFactory for Postgres {
    async fn open(&self, options: StoreOptions) -> Harness {
        let schema = common::fresh_schema();
        let clock = Arc::new(ManualClock::default());
        let store = common::open_in(&schema, options, clock.clone(), 4).await;
        Harness {
            store: Arc::new(store),
            clock,
            guard: Box::new(common::SchemaGuard(schema)),
        }
    }

    async fn replica(&self, h: &Harness, options: StoreOptions) -> DynControlPlaneStore {
        let schema = h
            .guard
            .downcast_ref::<common::SchemaGuard>()
            .expect("a postgres harness guards its schema");
        Arc::new(common::open_in(&schema.0, options, h.clock.clone(), 2).await)
    }
}

conformance_suite!(Postgres);
