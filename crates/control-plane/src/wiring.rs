//! The only place that knows the adapters: profile to store, and the
//! supervision of one process's components.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, SecretKeyFiles, StoreProfile};
use control_plane_core::migration::Migrations;
use control_plane_core::{
    DynControlPlaneStore, SecretKey, SecretKeys, StoreOptions, SystemClock, UsageMeter,
};
use dispatcher::{DeliveryMetrics, Dispatcher, DispatcherConfig, RetryPolicy};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::Role;

/// Refuses, before anything starts, a profile this binary was built without
/// (cargo features `embedded` and `postgres`).
pub fn check_compiled(config: &Config) -> Result<(), String> {
    let (feature, compiled) = match config.store {
        StoreProfile::Embedded { .. } => ("embedded", cfg!(feature = "embedded")),
        StoreProfile::Postgres { .. } => ("postgres", cfg!(feature = "postgres")),
    };
    if compiled {
        return Ok(());
    }
    Err(format!(
        "CONTROLPLANE_STORE={feature}, but this control-plane was built without the `{feature}` cargo feature; \
         build it with `--features {feature}` (both profiles are default features) or choose another store"
    ))
}

/// Refuses what the role cannot run with, before anything is opened: a role
/// split on a profile that cannot serve it, `api` without a shared token.
pub fn check_role(role: Role, config: &Config) -> Result<(), String> {
    if matches!(role, Role::Api | Role::Worker)
        && matches!(config.store, StoreProfile::Embedded { .. })
    {
        return Err(format!(
            "the {} role alone needs CONTROLPLANE_STORE=postgres: one embedded DuckDB file serves one process, so run `control-plane serve` for both roles",
            role.name()
        ));
    }
    if role == Role::Api && config.admin_token.is_none() {
        return Err(API_NEEDS_TOKEN.into());
    }
    Ok(())
}

const API_NEEDS_TOKEN: &str =
    "the api role needs CONTROLPLANE_ADMIN_TOKEN (every replica must accept the same token)";

/// The store's policy: one attempt, then one per delay of the retry schedule;
/// `migrate` always applies the migrations, whatever `CONTROLPLANE_AUTO_MIGRATE` says.
fn store_options(role: Role, config: &Config) -> StoreOptions {
    StoreOptions {
        max_attempts: u32::try_from(config.retry_schedule.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        endpoint_concurrency: config.endpoint_concurrency,
        migrations: match role {
            Role::Migrate => Migrations::Apply,
            _ => config.migrations,
        },
        ..StoreOptions::default()
    }
}

/// Opens the store the profile names.
pub async fn open_store(role: Role, config: &Config) -> Result<DynControlPlaneStore, String> {
    let options = store_options(role, config);
    let (keys, created) = load_keys(&config.secret_keys)?;
    let opened = match &config.store {
        StoreProfile::Embedded { path } => open_embedded(path, options, keys).await,
        StoreProfile::Postgres {
            url,
            pool_size,
            schema,
        } => open_postgres(url, *pool_size, schema, options, keys).await,
    };
    // A key made for a store that then did not open (it holds values under
    // another key, or its file is held) would stand where the right key
    // file has to be restored: it goes again.
    if opened.is_err() && created {
        let _ = std::fs::remove_file(&config.secret_keys.current);
    }
    opened
}

/// The keys that seal endpoint secrets (ADR 0022), read from their files;
/// the embedded default's file is created with a new key when missing (the
/// `bool` says so).
fn load_keys(files: &SecretKeyFiles) -> Result<(SecretKeys, bool), String> {
    let created = files.create_if_missing && !files.current.exists();
    let current = if created {
        let key = SecretKey::generate();
        write_private(&files.current, &format!("{}\n", key.to_text()), false).map_err(|e| {
            format!(
                "cannot create the secret key file {}: {e}; set CONTROLPLANE_SECRET_KEY_FILE",
                files.current.display()
            )
        })?;
        tracing::info!(
            path = %files.current.display(),
            key_id = key.id(),
            "created the key that seals endpoint secrets; keep it, and back it up apart from the store"
        );
        key
    } else {
        read_key(&files.current)?
    };
    let previous = files
        .previous
        .iter()
        .map(|p| read_key(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((SecretKeys::new(current, previous), created))
}

fn read_key(path: &std::path::Path) -> Result<SecretKey, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the secret key file {shown}: {e}"))?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %shown, "the secret key file is readable by other users; chmod 600 it");
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the secret key file {shown}: {e}"))?;
    SecretKey::parse(&text).map_err(|e| format!("the secret key file {shown}: {e}"))
}

#[cfg(feature = "embedded")]
async fn open_embedded(
    path: &std::path::Path,
    options: StoreOptions,
    keys: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    let cfg = store_embedded::EmbeddedConfig {
        options,
        keys,
        ..store_embedded::EmbeddedConfig::new(path)
    };
    let store = store_embedded::EmbeddedStore::open(cfg, Arc::new(SystemClock))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "embedded"))]
async fn open_embedded(
    _: &std::path::Path,
    _: StoreOptions,
    _: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    Err("built without the `embedded` feature".into())
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    url: &control_plane_core::DatabaseUrl,
    pool_size: u32,
    schema: &str,
    options: StoreOptions,
    keys: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    let mut cfg = store_postgres::PostgresConfig::new(url.clone());
    cfg.pool_size = pool_size;
    cfg.schema = Some(schema.to_string());
    cfg.options = options;
    cfg.keys = keys;
    let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
        .await
        .map_err(|e| format!("cannot open the postgres store at {}: {e}", url.redacted()))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(
    _: &control_plane_core::DatabaseUrl,
    _: u32,
    _: &str,
    _: StoreOptions,
    _: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    Err("built without the `postgres` feature".into())
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
    Dispatcher::new(store, dispatcher_config(config))
}

/// The settings of [`dispatcher()`], from the service's config.
fn dispatcher_config(config: &Config) -> DispatcherConfig {
    DispatcherConfig {
        worker: format!("control-plane-{}", std::process::id()),
        concurrency: config.concurrency as usize,
        lease: config.lease,
        request_timeout: config.lease.mul_f64(0.5).min(Duration::from_secs(15)),
        retry: RetryPolicy {
            schedule: config.retry_schedule.clone(),
            ..RetryPolicy::default()
        },
        allowed_targets: config.allowed_targets.clone(),
        slow_answer: config.slow_answer,
        response_body_bytes: usize::try_from(config.response_body_bytes).unwrap_or(4096),
        ..DispatcherConfig::default()
    }
}

/// The admin token: the configured one, or for `serve` a fresh one printed
/// once. `api` alone refuses to start without one, since replicas must agree.
/// The admin token: `CONTROLPLANE_ADMIN_TOKEN`, or for `serve` a fresh one
/// written to [`token_file`] (readable by this user only), whose path comes
/// back to be logged. The token itself never goes to stdout or a log, where
/// collectors would keep it.
fn admin_token(
    role: Role,
    config: &Config,
) -> Result<(String, Option<std::path::PathBuf>), String> {
    if let Some(t) = &config.admin_token {
        return Ok((t.expose().to_string(), None));
    }
    if role == Role::Api {
        return Err(API_NEEDS_TOKEN.into());
    }
    let token = api::generate_token("cpa_");
    let path = token_file(config);
    write_private(&path, &format!("{token}\n"), true).map_err(|e| {
        format!(
            "CONTROLPLANE_ADMIN_TOKEN is not set and the generated token cannot be written to {}: {e}; \
             set CONTROLPLANE_ADMIN_TOKEN",
            path.display()
        )
    })?;
    Ok((token, Some(path)))
}

/// Where a generated admin token goes: beside the embedded store's file, or
/// in the working directory.
fn token_file(config: &Config) -> std::path::PathBuf {
    const NAME: &str = "control-plane.admin-token";
    match &config.store {
        StoreProfile::Embedded { path } => path.with_file_name(NAME),
        _ => std::path::PathBuf::from(NAME),
    }
}

/// Writes `text` to `path`, readable and writable by this user only (mode
/// 0600, also when the file existed); an existing file is replaced when
/// `replace`, refused otherwise.
fn write_private(path: &std::path::Path, text: &str, replace: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(replace)
        .create_new(!replace)
        .truncate(replace)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// The meters every component of one process shares: the dispatcher's
/// attempt metrics live in the registry the API renders.
struct Meters {
    deliveries: Arc<DeliveryMetrics>,
    metrics: Arc<api::Metrics>,
    usage: Arc<UsageMeter>,
}

impl Default for Meters {
    fn default() -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        let deliveries = Arc::new(DeliveryMetrics::register(&mut registry));
        Meters {
            deliveries,
            metrics: Arc::new(api::Metrics::new(registry)),
            usage: Arc::default(),
        }
    }
}

/// The components of one process under one cancellation token: when any of
/// them ends before the token is cancelled, the process stops them all and
/// fails, naming it. Each component ends with a line saying what it did.
pub struct Supervisor {
    stop: CancellationToken,
    tracker: TaskTracker,
    ended: tokio::sync::mpsc::UnboundedSender<String>,
    reports: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Default for Supervisor {
    fn default() -> Self {
        let (ended, reports) = tokio::sync::mpsc::unbounded_channel();
        Supervisor {
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            ended,
            reports,
        }
    }
}

impl Supervisor {
    /// The token every component watches.
    pub fn token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `work` as the component `name`; a panic is reported like an end.
    pub fn spawn<F>(&self, name: &'static str, work: F)
    where
        F: Future<Output = String> + Send + 'static,
    {
        let ended = self.ended.clone();
        let inner = tokio::spawn(work);
        self.tracker.spawn(async move {
            let what = match inner.await {
                Ok(what) => what,
                Err(e) => format!("{name} (panicked: {e})"),
            };
            let _ = ended.send(what);
        });
    }

    /// Waits for `signal` or for a component to end, then cancels the token
    /// and drains every component (a second `signal` exits at once).
    ///
    /// # Errors
    /// When a component ended before `signal`: the error names it.
    pub async fn run<S, Fut>(mut self, signal: S) -> Result<(), String>
    where
        S: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        drop(self.ended);
        self.tracker.close();
        let early = tokio::select! {
            () = signal() => {
                tracing::info!("shutting down (a second signal exits at once)");
                None
            }
            what = self.reports.recv() => {
                let what = what.unwrap_or_else(|| "every component".into());
                tracing::error!(component = %what, "a component stopped before any signal; stopping the others");
                Some(what)
            }
        };
        self.stop.cancel();
        loop {
            tokio::select! {
                what = self.reports.recv() => match what {
                    Some(what) => tracing::info!("stopped {what}"),
                    None => break,
                },
                () = signal() => {
                    tracing::warn!("second signal, exiting now");
                    std::process::exit(130);
                }
            }
        }
        self.tracker.wait().await;
        match early {
            None => Ok(()),
            Some(what) => Err(format!(
                "{what} stopped unexpectedly; the service shut down"
            )),
        }
    }
}

/// Binds the API's listener and starts serving; returns its address.
async fn spawn_api(
    supervisor: &Supervisor,
    role: Role,
    config: &Config,
    store: &DynControlPlaneStore,
    meters: &Meters,
) -> Result<(std::net::SocketAddr, Option<std::path::PathBuf>), String> {
    let (token, token_file) = admin_token(role, config)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {} (CONTROLPLANE_LISTEN): {e}",
                config.listen
            )
        })?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let api_config = api::ApiConfig {
        endpoint_concurrency: config.endpoint_concurrency,
        ..api::ApiConfig::new(token)
    };
    let router = api::router(
        store.clone(),
        &api_config,
        meters.metrics.clone(),
        meters.usage.clone(),
        dashboard::router(),
    );
    let stop = supervisor.token();
    supervisor.spawn("api", async move {
        match api::serve(listener, router, stop).await {
            Ok(()) => "api".to_string(),
            Err(e) => format!("api (failed: {e})"),
        }
    });
    Ok((addr, token_file))
}

/// Starts the delivery dispatcher, the workflow task runner and maintenance.
fn spawn_workers(
    supervisor: &Supervisor,
    config: &Config,
    store: &DynControlPlaneStore,
    meters: &Meters,
) -> Result<(), String> {
    let dispatcher = dispatcher(store.clone(), config)?
        .with_meters(meters.deliveries.clone(), meters.usage.clone());
    let stop = supervisor.token();
    supervisor.spawn("dispatcher", async move {
        let r = dispatcher.run(stop).await;
        format!(
            "dispatcher: {} delivered, {} failed attempts, {} leases released",
            r.delivered, r.failed, r.released
        )
    });
    let runner = crate::tasks::task_runner(store.clone(), meters.usage.clone());
    let stop = supervisor.token();
    supervisor.spawn("tasks", async move {
        let r = runner.run(stop).await;
        format!(
            "tasks: {} completed, {} failed, {} released",
            r.completed, r.failed, r.released
        )
    });
    let (stop, st, retention) = (supervisor.token(), store.clone(), config.retention);
    supervisor.spawn("maintenance", async move {
        crate::loops::maintenance_loop(st, retention, stop).await;
        "maintenance".to_string()
    });
    Ok(())
}

/// Runs `serve`, `api` or `worker` until a signal; a second signal exits at
/// once. A component that ends before any signal stops the others: the
/// process then drains and fails, naming it, instead of running half alive.
pub async fn run_service(
    role: Role,
    config: &Config,
    store: DynControlPlaneStore,
) -> Result<(), String> {
    let supervisor = Supervisor::default();
    let meters = Meters::default();
    let (api_addr, token_file) = if role == Role::Worker {
        (None, None)
    } else {
        let (addr, file) = spawn_api(&supervisor, role, config, &store, &meters).await?;
        (Some(addr), file)
    };
    if role != Role::Api {
        spawn_workers(&supervisor, config, &store, &meters)?;
    }
    let (stop, st, usage) = (supervisor.token(), store.clone(), meters.usage.clone());
    supervisor.spawn("usage", async move {
        crate::loops::usage_loop(st, usage, stop).await;
        "usage".to_string()
    });
    tracing::info!(
        "{} ready on the {} store ({:?}){}",
        role.name(),
        store.backend_name(),
        config.store,
        api_addr
            .map(|a| format!(", API on http://{a}"))
            .unwrap_or_default()
    );
    if let Some(path) = token_file {
        tracing::warn!(
            "CONTROLPLANE_ADMIN_TOKEN is not set: a new admin token was written to {} \
             (readable by this user only; a new one at every start)",
            path.display()
        );
    }
    supervisor.run(shutdown_signal).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn no_signal() -> std::future::Pending<()> {
        std::future::pending()
    }

    /// A component that runs until the token is cancelled, then notes that
    /// it drained.
    fn patient(supervisor: &Supervisor, drained: &Arc<AtomicBool>) {
        let (stop, drained) = (supervisor.token(), drained.clone());
        supervisor.spawn("patient", async move {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            drained.store(true, Ordering::SeqCst);
            "patient".to_string()
        });
    }

    /// Every worker setting of the environment reaches the dispatcher that
    /// `serve` and `worker` start.
    #[test]
    fn the_dispatcher_gets_the_worker_settings() {
        let config = Config::from_vars([
            ("CONTROLPLANE_RESPONSE_BODY_BYTES", "7"),
            ("CONTROLPLANE_CONCURRENCY", "3"),
            ("CONTROLPLANE_LEASE", "40s"),
            ("CONTROLPLANE_RETRY_SCHEDULE", "1s,2s"),
        ])
        .unwrap();
        let d = dispatcher_config(&config);
        assert_eq!(d.response_body_bytes, 7);
        assert_eq!(d.concurrency, 3);
        assert_eq!(d.lease, Duration::from_secs(40));
        assert_eq!(d.request_timeout, Duration::from_secs(15));
        assert_eq!(
            d.retry.schedule,
            vec![Duration::from_secs(1), Duration::from_secs(2)]
        );
        assert_eq!(
            dispatcher_config(&Config::from_vars(Vec::<(String, String)>::new()).unwrap())
                .response_body_bytes,
            4096
        );
    }

    #[tokio::test]
    async fn a_component_that_ends_early_stops_the_others_and_fails_naming_it() {
        let supervisor = Supervisor::default();
        let drained = Arc::new(AtomicBool::new(false));
        patient(&supervisor, &drained);
        supervisor.spawn("api", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            "api (failed: listener closed)".to_string()
        });
        let r = tokio::time::timeout(Duration::from_secs(5), supervisor.run(no_signal))
            .await
            .expect("the supervisor stops within seconds");
        let e = r.unwrap_err();
        assert!(e.contains("api (failed: listener closed)"), "{e}");
        assert!(drained.load(Ordering::SeqCst), "the others drained first");
    }

    #[tokio::test]
    async fn a_panicking_component_is_reported_by_name() {
        let supervisor = Supervisor::default();
        let drained = Arc::new(AtomicBool::new(false));
        patient(&supervisor, &drained);
        supervisor.spawn("tasks", async { panic!("boom") });
        let e = supervisor.run(no_signal).await.unwrap_err();
        assert!(e.contains("tasks (panicked"), "{e}");
        assert!(drained.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_signal_drains_every_component_and_succeeds() {
        let supervisor = Supervisor::default();
        let drained = Arc::new(AtomicBool::new(false));
        patient(&supervisor, &drained);
        // One signal only: a second would exit the process at once.
        let sent = Arc::new(AtomicBool::new(false));
        let signal = || {
            let first = !sent.swap(true, Ordering::SeqCst);
            async move {
                if first {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                } else {
                    std::future::pending::<()>().await;
                }
            }
        };
        supervisor.run(signal).await.unwrap();
        assert!(drained.load(Ordering::SeqCst));
    }

    /// An embedded store in `dir`, on the system clock.
    #[cfg(feature = "embedded")]
    pub(crate) async fn embedded_store(dir: &std::path::Path) -> DynControlPlaneStore {
        Arc::new(
            store_embedded::EmbeddedStore::open(
                store_embedded::EmbeddedConfig::new(dir.join("s.duckdb")),
                Arc::new(SystemClock),
            )
            .await
            .unwrap(),
        )
    }

    /// The dispatcher holds a lease on a send that never answers; another
    /// component fails; the dispatcher releases the lease as it drains, so
    /// the delivery is pending again at once, not after the lease expires.
    #[cfg(feature = "embedded")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_component_makes_the_dispatcher_release_its_leases() {
        use control_plane_core::{
            AccountId, DeliveryState, EndpointCreateRequest, PublishRequest, Secret,
        };
        let dir = tempfile::tempdir().unwrap();
        let store = embedded_store(dir.path()).await;
        // Accepts connections and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", silent.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((sock, _)) = silent.accept().await {
                open.push(sock);
            }
        });
        let account = AccountId::new("a").unwrap();
        store
            .endpoint_create(EndpointCreateRequest::new(
                account.clone(),
                &url,
                Secret::new("whsec_dGVzdA=="),
            ))
            .await
            .unwrap();
        let published = store
            .event_publish(PublishRequest::new(
                account.clone(),
                "t",
                serde_json::json!({}),
            ))
            .await
            .unwrap();
        let id = published.deliveries[0];
        let dispatcher = Dispatcher::new(
            store.clone(),
            DispatcherConfig {
                lease: Duration::from_secs(60),
                request_timeout: Duration::from_secs(30),
                grace: Duration::from_millis(100),
                allowed_targets: vec![dispatcher::Cidr::parse("127.0.0.0/8").unwrap()],
                ..DispatcherConfig::default()
            },
        )
        .unwrap();
        let supervisor = Supervisor::default();
        let stop = supervisor.token();
        supervisor.spawn("dispatcher", async move {
            let r = dispatcher.run(stop).await;
            format!("dispatcher: {} leases released", r.released)
        });
        let watched = store.clone();
        supervisor.spawn("maintenance", async move {
            loop {
                let d = watched.delivery_get(&account, id).await.unwrap();
                if d.state == DeliveryState::Leased {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            "maintenance (failed: test)".to_string()
        });
        let e = tokio::time::timeout(Duration::from_secs(10), supervisor.run(no_signal))
            .await
            .expect("the supervisor stops within seconds")
            .unwrap_err();
        assert!(e.contains("maintenance (failed: test)"), "{e}");
        let d = store
            .delivery_get(&AccountId::new("a").unwrap(), id)
            .await
            .unwrap();
        assert_eq!(d.state, DeliveryState::Pending, "the lease was released");
        assert_eq!(d.attempts, 0, "a released lease costs no attempt");
    }
}
