//! The only place that knows the adapters: profile to store.

use std::sync::Arc;

use control_plane_core::{Config, DynControlPlaneStore, StoreOptions, StoreProfile, SystemClock};
use store_embedded::{EmbeddedConfig, EmbeddedStore};
use store_postgres::{PostgresConfig, PostgresStore};

/// Refuses role splits the profile cannot serve.
pub fn check_role(command: &str, config: &Config) -> Result<(), String> {
    if matches!(command, "api" | "worker") && matches!(config.store, StoreProfile::Embedded { .. })
    {
        return Err(format!(
            "the {command} role alone needs CONTROLPLANE_STORE=postgres: one embedded DuckDB file serves one process, so run `control-plane serve` for both roles"
        ));
    }
    Ok(())
}

/// Opens the store the profile names.
pub async fn open_store(config: &Config) -> Result<DynControlPlaneStore, String> {
    match &config.store {
        StoreProfile::Embedded { path } => {
            let cfg = EmbeddedConfig {
                path: path.clone(),
                options: StoreOptions::default(),
            };
            let store = EmbeddedStore::open(cfg, Arc::new(SystemClock))
                .await
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(store))
        }
        StoreProfile::Postgres {
            url,
            pool_size,
            schema,
        } => {
            let mut cfg = PostgresConfig::new(url.clone());
            cfg.pool_size = *pool_size;
            cfg.schema = Some(schema.clone());
            let store = PostgresStore::open(cfg, Arc::new(SystemClock))
                .await
                .map_err(|e| {
                    format!("cannot open the postgres store at {}: {e}", url.redacted())
                })?;
            Ok(Arc::new(store))
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
