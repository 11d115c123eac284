//! Shared by the postgres tests: the database to use, and a store in a fresh
//! schema that is dropped afterwards.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use control_plane_core::{Clock, StoreOptions};
use control_plane_store_kit::DatabaseUrl;
use control_plane_store_kit::{SecretKey, SecretKeys};
use store_postgres::{PostgresConfig, PostgresStore};

/// The test database. Fails (never skips) when none is configured: run the
/// tests through `cargo xtask test`, which provides one.
pub fn database_url() -> DatabaseUrl {
    match std::env::var("CONTROLPLANE_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => DatabaseUrl::new(u),
        _ => panic!(
            "CONTROLPLANE_TEST_DATABASE_URL is not set: the postgres tests need a database. \
             Run them through `cargo xtask test` (it starts a throwaway cluster), or set the variable \
             to a database you may create schemas in."
        ),
    }
}

/// A unique schema name for one test.
pub fn fresh_schema() -> String {
    format!("cp_test_{}", uuid::Uuid::new_v4().simple())
}

/// Opens a store on `schema` with its own pool.
pub async fn open_in(
    schema: &str,
    options: StoreOptions,
    clock: Arc<dyn Clock>,
    pool: u32,
) -> PostgresStore {
    let mut config = PostgresConfig::new(database_url());
    config.schema = Some(schema.to_string());
    config.pool_size = pool;
    config.options = options;
    config.keys = test_keys();
    PostgresStore::open(config, clock)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot open a postgres store at {}: {e}",
                database_url().redacted()
            )
        })
}

/// The key every store of this test process seals endpoint secrets with
/// (replicas of one schema must share it), as the service does.
pub fn test_keys() -> SecretKeys {
    static KEY: std::sync::OnceLock<SecretKey> = std::sync::OnceLock::new();
    SecretKeys::new(KEY.get_or_init(SecretKey::generate).clone(), vec![])
}

/// Drops a test schema when dropped.
pub struct SchemaGuard(pub String);

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        workspace_tests::drop_schema(&self.0);
    }
}
