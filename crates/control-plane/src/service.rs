//! The service of one process: its components (API, dispatcher, task
//! runner, maintenance and usage loops) under one [`Supervisor`], the
//! admin token, and the shutdown signal. The store comes opened from
//! `crate::store`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, StoreProfile};
use control_plane_core::DynControlPlaneStore;
use control_plane_runtime::UsageMeter;
use dispatcher::{DeliveryMetrics, Dispatcher, DispatcherConfig, RetryPolicy};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::Role;

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
        ahead: config.claim_ahead as usize,
        lease: config.lease,
        request_timeout: config.lease.mul_f64(0.5).min(Duration::from_secs(15)),
        retry: RetryPolicy {
            schedule: config.retry_schedule.clone(),
            ..RetryPolicy::default()
        },
        allowed_targets: config.allowed_targets.clone(),
        proxy: config.proxy.clone(),
        slow_answer: config.slow_answer,
        response_body_bytes: usize::try_from(config.response_body_bytes).unwrap_or(4096),
        outcome_linger: config.outcome_linger,
        // This binary's own `transform` command runs endpoints' programs
        // (ADR 0050); without it (no path to itself) they fail their
        // attempts, saying so.
        transform: dispatcher::TransformRunner::this_binary().ok(),
        ..DispatcherConfig::default()
    }
}

/// The admin token (`api` alone refuses to start without one, since
/// replicas must agree): `CONTROLPLANE_ADMIN_TOKEN`, or for `serve` a fresh one
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
        return Err(crate::store::API_NEEDS_TOKEN.into());
    }
    let token = api::generate_token("cpa_");
    let path = token_file(config);
    crate::store::write_private(&path, &format!("{token}\n"), true).map_err(|e| {
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
    let listener = bind_listen(config).await?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let api_config = api::ApiConfig {
        endpoint_concurrency: config.endpoint_concurrency,
        body_timeout: config.body_timeout,
        quotas: config.quotas,
        ..api::ApiConfig::new(token)
    };
    let router = api::router(
        store.clone(),
        &api_config,
        meters.metrics.clone(),
        meters.usage.clone(),
        dashboard::router_with(dashboard::DashboardConfig {
            portal_frame_ancestors: config.portal_frame_ancestors.clone(),
        }),
    );
    let stop = supervisor.token();
    let limits = config.server;
    supervisor.spawn("api", async move {
        match api::serve(listener, router, stop, limits).await {
            Ok(()) => "api".to_string(),
            Err(e) => format!("api (failed: {e})"),
        }
    });
    Ok((addr, token_file))
}

/// Binds `CONTROLPLANE_LISTEN`, naming the variable when it cannot.
async fn bind_listen(config: &Config) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {} (CONTROLPLANE_LISTEN): {e}",
                config.listen
            )
        })
}

/// A worker's `/healthz` and `/readyz` on `CONTROLPLANE_LISTEN`, for the
/// probes of an orchestrator; stopped with the rest of the process.
async fn spawn_probes(
    supervisor: &Supervisor,
    config: &Config,
    store: &DynControlPlaneStore,
) -> Result<std::net::SocketAddr, String> {
    let listener = bind_listen(config).await?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, limits) = (supervisor.token(), config.server);
    let router = api::probes_router(store.clone());
    supervisor.spawn("probes", async move {
        match api::serve(listener, router, stop, limits).await {
            Ok(()) => "probes".to_string(),
            Err(e) => format!("probes (failed: {e})"),
        }
    });
    Ok(addr)
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
    let probes_addr = if role == Role::Worker && config.listen_set {
        Some(spawn_probes(&supervisor, config, &store).await?)
    } else {
        None
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
            .or(probes_addr.map(|a| format!(", probes on http://{a}")))
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
    use control_plane_core::SystemClock;

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
            ("CONTROLPLANE_CLAIM_AHEAD", "9"),
            ("CONTROLPLANE_LEASE", "40s"),
            ("CONTROLPLANE_RETRY_SCHEDULE", "1s,2s"),
            ("CONTROLPLANE_OUTCOME_LINGER", "3ms"),
        ])
        .unwrap();
        let d = dispatcher_config(&config);
        assert_eq!(d.outcome_linger, Duration::from_millis(3));
        assert_eq!(d.response_body_bytes, 7);
        assert_eq!(d.concurrency, 3);
        assert_eq!(d.ahead, 9);
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
            AccountId, Check, DeliveryState, EndpointCreateRequest, PublishRequest, Secret,
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
            .endpoint_create(
                EndpointCreateRequest::new(
                    account.clone(),
                    &url,
                    Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
                )
                .checked()
                .unwrap(),
            )
            .await
            .unwrap();
        let published = store
            .event_publish(
                PublishRequest::new(account.clone(), "t", serde_json::json!({}))
                    .checked()
                    .unwrap(),
            )
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
