//! The only place that knows the adapters: profile to store.

use std::sync::Arc;

use std::time::Duration;

use control_plane_core::maintenance::run_maintenance;
use control_plane_core::{Config, DynControlPlaneStore, StoreOptions, StoreProfile, SystemClock};
use dispatcher::{Dispatcher, DispatcherConfig, RetryPolicy};
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

/// The delivery worker the config describes.
pub fn dispatcher(store: DynControlPlaneStore, config: &Config) -> Result<Dispatcher, String> {
    let cfg = DispatcherConfig {
        worker: format!("control-plane-{}", std::process::id()),
        concurrency: config.concurrency as usize,
        lease: config.lease,
        request_timeout: config.lease.mul_f64(0.5).min(Duration::from_secs(15)),
        retry: RetryPolicy {
            schedule: config.retry_schedule.clone(),
            ..RetryPolicy::default()
        },
        allowed_targets: config.allowed_targets.clone(),
        ..DispatcherConfig::default()
    };
    Dispatcher::new(store, cfg)
}

/// Runs maintenance on its tick every minute (a single replica does the
/// work): delivered deliveries and attempts older than 30 days, expired
/// idempotency records.
pub async fn maintenance_loop(
    store: DynControlPlaneStore,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let every = Duration::from_secs(60);
    while !*stop.borrow() {
        if let Err(e) =
            run_maintenance(store.as_ref(), Duration::from_secs(30 * 86_400), 500, every).await
        {
            eprintln!("control-plane: maintenance failed: {e}");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => {}
        }
    }
}
