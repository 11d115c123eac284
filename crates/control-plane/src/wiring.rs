//! The only place that knows the adapters: profile to store.

use std::sync::Arc;

use std::time::Duration;

use control_plane_core::maintenance::run_maintenance;
use control_plane_core::{
    Clock, Config, DynControlPlaneStore, PublishRequest, StoreOptions, StoreProfile, SystemClock,
    Telemetry, UsageMeter,
};
use dispatcher::{
    Dispatcher, DispatcherConfig, RetryPolicy, TaskError, TaskRunner, TaskRunnerConfig,
};
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

/// The store's policy: one attempt, then one per delay of the retry schedule.
fn store_options(config: &Config) -> StoreOptions {
    StoreOptions {
        max_attempts: u32::try_from(config.retry_schedule.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        endpoint_concurrency: config.endpoint_concurrency,
        ..StoreOptions::default()
    }
}

/// Opens the store the profile names.
pub async fn open_store(config: &Config) -> Result<DynControlPlaneStore, String> {
    match &config.store {
        StoreProfile::Embedded { path } => {
            let cfg = EmbeddedConfig {
                path: path.clone(),
                options: store_options(config),
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
            cfg.options = store_options(config);
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

/// The task kind the service runs itself: publish an event later. The
/// payload is `{"type", "payload"}`; the task id is the idempotency key, so a
/// rerun after a crash never publishes twice.
pub const PUBLISH_TASK: &str = "control-plane.publish";

/// The workflow runner with the service's own handlers.
pub fn task_runner(store: DynControlPlaneStore) -> TaskRunner {
    let mut runner = TaskRunner::new(
        store.clone(),
        TaskRunnerConfig {
            worker: format!("control-plane-{}", std::process::id()),
            ..TaskRunnerConfig::default()
        },
    );
    runner.register(PUBLISH_TASK, move |task| {
        let store = store.clone();
        async move {
            let event_type = task.payload["type"]
                .as_str()
                .ok_or_else(|| TaskError::fatal("the payload needs a string \"type\""))?
                .to_string();
            let req = PublishRequest {
                account: task.account.clone(),
                event_type,
                payload: task.payload["payload"].clone(),
                idempotency_key: Some(format!("task:{}", task.id.as_str())),
            };
            match store.event_publish(req).await {
                Ok(p) => Ok(serde_json::json!({
                    "event_id": p.event.id,
                    "deliveries": p.deliveries.len(),
                })),
                Err(e) if e.is_retryable() => Err(TaskError::retry(e.to_string())),
                Err(e) => Err(TaskError::fatal(e.to_string())),
            }
        }
    });
    runner
}

/// Writes metered usage every second until `stop`, then once more.
pub async fn usage_loop(
    store: DynControlPlaneStore,
    usage: Arc<UsageMeter>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let stopping = *stop.borrow();
        if let Err(e) = usage.flush(store.as_ref(), SystemClock.now()).await {
            eprintln!("control-plane: usage not recorded yet (kept for the next try): {e}");
        }
        if stopping {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// The admin token: the configured one, or for `serve` a fresh one printed
/// once. `api` alone refuses to start without one, since replicas must agree.
fn admin_token(command: &str, config: &Config) -> Result<String, String> {
    if let Some(t) = &config.admin_token {
        return Ok(t.expose().to_string());
    }
    if command == "api" {
        return Err("the api role needs CONTROLPLANE_ADMIN_TOKEN (every replica must accept the same token)".into());
    }
    let token = api::generate_token("cpa_");
    println!("admin token (shown once; set CONTROLPLANE_ADMIN_TOKEN to keep a token across restarts): {token}");
    Ok(token)
}

/// The meters every component of one process shares.
#[derive(Clone, Default)]
struct Meters {
    telemetry: Arc<Telemetry>,
    usage: Arc<UsageMeter>,
}

/// The components of one process; each ends with a line saying what it did.
type Components = tokio::task::JoinSet<String>;

/// Binds the API's listener and starts serving; returns its address.
async fn spawn_api(
    components: &mut Components,
    command: &str,
    config: &Config,
    store: &DynControlPlaneStore,
    meters: &Meters,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<std::net::SocketAddr, String> {
    let token = admin_token(command, config)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {} (CONTROLPLANE_LISTEN): {e}",
                config.listen
            )
        })?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let router = api::router(
        store.clone(),
        &api::ApiConfig::new(token),
        meters.telemetry.clone(),
        meters.usage.clone(),
    );
    components.spawn(async move {
        match api::serve(listener, router, stopped).await {
            Ok(()) => "api".to_string(),
            Err(e) => format!("api (failed: {e})"),
        }
    });
    Ok(addr)
}

/// Starts the delivery dispatcher, the workflow task runner and maintenance.
fn spawn_workers(
    components: &mut Components,
    config: &Config,
    store: &DynControlPlaneStore,
    meters: &Meters,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let dispatcher = dispatcher(store.clone(), config)?
        .with_meters(meters.telemetry.clone(), meters.usage.clone());
    let s = stopped.clone();
    components.spawn(async move {
        let r = dispatcher.run(s).await;
        format!(
            "dispatcher: {} delivered, {} failed attempts, {} leases released",
            r.delivered, r.failed, r.released
        )
    });
    let runner = task_runner(store.clone());
    let s = stopped.clone();
    components.spawn(async move {
        let r = runner.run(s).await;
        format!(
            "tasks: {} completed, {} failed, {} released",
            r.completed, r.failed, r.released
        )
    });
    let (s, st) = (stopped.clone(), store.clone());
    components.spawn(async move {
        maintenance_loop(st, s).await;
        "maintenance".to_string()
    });
    Ok(())
}

/// Runs `serve`, `api` or `worker` until a signal; a second signal exits at
/// once. A component that ends before any signal stops the others: the
/// process then drains and fails, naming it, instead of running half alive.
pub async fn run_service(
    command: &str,
    config: &Config,
    store: DynControlPlaneStore,
) -> Result<(), String> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let meters = Meters::default();
    let mut components = Components::new();
    let api_addr = if command != "worker" {
        Some(
            spawn_api(
                &mut components,
                command,
                config,
                &store,
                &meters,
                stopped.clone(),
            )
            .await?,
        )
    } else {
        None
    };
    if command != "api" {
        spawn_workers(&mut components, config, &store, &meters, &stopped)?;
    }
    let (s, st, usage) = (stopped.clone(), store.clone(), meters.usage.clone());
    components.spawn(async move {
        usage_loop(st, usage, s).await;
        "usage".to_string()
    });
    eprintln!(
        "control-plane: {command} ready on the {} store ({:?}){}",
        store.backend_name(),
        config.store,
        api_addr
            .map(|a| format!(", API on http://{a}"))
            .unwrap_or_default()
    );
    let early = tokio::select! {
        _ = shutdown_signal() => {
            eprintln!("control-plane: shutting down (a second signal exits at once)");
            None
        }
        done = components.join_next() => {
            let what = ended(done);
            eprintln!("control-plane: {what} stopped before any signal; stopping the others");
            Some(what)
        }
    };
    let _ = stop.send(true);
    drain(&mut components).await;
    match early {
        None => Ok(()),
        Some(what) => Err(format!(
            "{what} stopped unexpectedly; the service shut down"
        )),
    }
}

/// What a finished component reported.
fn ended(done: Option<Result<String, tokio::task::JoinError>>) -> String {
    match done {
        Some(Ok(what)) => what,
        Some(Err(e)) => format!("a component (panicked or was cancelled: {e})"),
        None => "every component".to_string(),
    }
}

/// Waits for every component to finish its drain; a second signal exits at once.
async fn drain(components: &mut Components) {
    loop {
        tokio::select! {
            done = components.join_next() => match done {
                None => break,
                done => eprintln!("control-plane: stopped {}", ended(done)),
            },
            _ = shutdown_signal() => {
                eprintln!("control-plane: second signal, exiting now");
                std::process::exit(130);
            }
        }
    }
}
