//! Endpoint secrets at rest in the DuckDB file (ADR 0022).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::secrets::{secrets_are_sealed_at_rest_and_rotate, Reopen};
use control_plane_core::{DynControlPlaneStore, EndpointId, StoreResult, SystemClock};
use control_plane_store_kit::SecretKeys;
use store_embedded::{EmbeddedConfig, EmbeddedStore};

struct File(PathBuf);

#[async_trait]
impl Reopen for File {
    async fn open(&self, keys: SecretKeys) -> StoreResult<DynControlPlaneStore> {
        let mut config = EmbeddedConfig::new(&self.0);
        config.keys = keys;
        Ok(Arc::new(
            EmbeddedStore::open(config, Arc::new(SystemClock)).await?,
        ))
    }

    async fn stored_secrets(&self) -> Vec<String> {
        let conn = duckdb::Connection::open(&self.0).unwrap();
        let mut st = conn
            .prepare(
                "SELECT secret FROM endpoints UNION ALL \
                 SELECT previous_secret FROM endpoints WHERE previous_secret IS NOT NULL UNION ALL \
                 SELECT headers FROM endpoints WHERE headers IS NOT NULL UNION ALL \
                 SELECT oauth2 FROM endpoints WHERE oauth2 IS NOT NULL UNION ALL \
                 SELECT client_tls FROM endpoints WHERE client_tls IS NOT NULL",
            )
            .unwrap();
        let rows = st.query_map([], |r| r.get::<_, String>(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    async fn copy_secret(&self, from: EndpointId, to: EndpointId) {
        let conn = duckdb::Connection::open(&self.0).unwrap();
        conn.execute(
            "UPDATE endpoints SET secret = (SELECT secret FROM endpoints WHERE id = $1) WHERE id = $2",
            duckdb::params![from.to_string(), to.to_string()],
        )
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_at_rest_and_rotate_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    secrets_are_sealed_at_rest_and_rotate(&File(dir.path().join("s.duckdb"))).await;
}
