//! Endpoint secrets at rest in PostgreSQL (ADR 0022).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use control_plane_conformance::secrets::{secrets_are_sealed_at_rest_and_rotate, Reopen};
use control_plane_core::{DynControlPlaneStore, EndpointId, StoreResult, SystemClock};
use control_plane_store_kit::SecretKeys;
use store_postgres::{PostgresConfig, PostgresStore};

struct Schema(common::SchemaGuard);

#[async_trait]
impl Reopen for Schema {
    async fn open(&self, keys: SecretKeys) -> StoreResult<DynControlPlaneStore> {
        let mut config = PostgresConfig::new(common::database_url());
        config.schema = Some(self.0 .0.clone());
        config.pool_size = 2;
        config.keys = keys;
        Ok(Arc::new(
            PostgresStore::open(config, Arc::new(SystemClock)).await?,
        ))
    }

    async fn stored_secrets(&self) -> Vec<String> {
        let client = self.client().await;
        let rows = client
            .query(
                &format!(
                    "SELECT secret FROM {0}.endpoints UNION ALL \
                     SELECT previous_secret FROM {0}.endpoints WHERE previous_secret IS NOT NULL UNION ALL \
                 SELECT headers FROM {0}.endpoints WHERE headers IS NOT NULL UNION ALL \
                 SELECT oauth2 FROM {0}.endpoints WHERE oauth2 IS NOT NULL UNION ALL \
                 SELECT client_tls FROM {0}.endpoints WHERE client_tls IS NOT NULL",
                    self.0 .0
                ),
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    async fn copy_secret(&self, from: EndpointId, to: EndpointId) {
        let client = self.client().await;
        client
            .execute(
                &format!(
                    "UPDATE {0}.endpoints SET secret = (SELECT secret FROM {0}.endpoints WHERE id = $1) \
                     WHERE id = $2",
                    self.0 .0
                ),
                &[&from.0, &to.0],
            )
            .await
            .unwrap();
    }
}

impl Schema {
    async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) =
            tokio_postgres::connect(common::database_url().expose(), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(conn);
        client
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_at_rest_and_rotate_in_the_database() {
    let schema = Schema(common::SchemaGuard(common::fresh_schema()));
    secrets_are_sealed_at_rest_and_rotate(&schema).await;
}
