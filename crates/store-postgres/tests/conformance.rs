//! The postgres adapter runs the whole conformance suite, each test in its own schema.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::{conformance_suite, Harness, StoreFactory};
use control_plane_core::{ManualClock, StoreOptions};

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
}

conformance_suite!(Postgres);
