//! The workflow worker runtime: handlers registered by task kind run leased
//! tasks; the lease is extended while a handler runs; a handler's error or
//! panic becomes a recorded failure, never a dead worker.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use control_plane_core::{
    ClaimedTask, DynControlPlaneStore, StoreError, Task, TaskClaimRequest, TaskFailure, TaskLease,
};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// Why a handler failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    /// What happened (recorded as the task's last error).
    pub message: String,
    /// Whether to try again (with backoff) while attempts remain.
    pub failure: TaskFailure,
}

impl TaskError {
    /// A failure worth retrying.
    pub fn retry(message: impl Into<String>) -> Self {
        TaskError {
            message: message.into(),
            failure: TaskFailure::Retryable,
        }
    }

    /// A failure that dead-letters the task at once.
    pub fn fatal(message: impl Into<String>) -> Self {
        TaskError {
            message: message.into(),
            failure: TaskFailure::Permanent,
        }
    }
}

/// What a handler returns: the task's result, or why it failed.
pub type TaskResult = Result<serde_json::Value, TaskError>;

type BoxedHandler =
    Arc<dyn Fn(Task) -> Pin<Box<dyn Future<Output = TaskResult> + Send>> + Send + Sync>;

/// How a task runner runs.
#[derive(Clone, Debug)]
pub struct TaskRunnerConfig {
    /// Worker name, recorded on leases.
    pub worker: String,
    /// Handlers running at once, at most.
    pub concurrency: usize,
    /// Lease per task; renewed every third of it while the handler runs.
    pub lease: Duration,
    /// How often to look for due tasks when the last claim found none.
    pub poll_interval: Duration,
    /// On shutdown, how long running handlers may finish before their tasks are released.
    pub grace: Duration,
}

impl Default for TaskRunnerConfig {
    fn default() -> Self {
        TaskRunnerConfig {
            worker: "tasks".into(),
            concurrency: 8,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            grace: Duration::from_secs(10),
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskReport {
    /// Tasks completed.
    pub completed: u64,
    /// Failures recorded (errors and panics).
    pub failed: u64,
    /// Tasks whose lease was lost while their handler ran.
    pub lost: u64,
    /// Tasks released at shutdown.
    pub released: u64,
}

enum Ended {
    Completed,
    Failed,
    Lost,
    Released,
}

/// Runs registered handlers over the workflow queue.
pub struct TaskRunner {
    store: DynControlPlaneStore,
    config: TaskRunnerConfig,
    handlers: HashMap<String, BoxedHandler>,
}

impl TaskRunner {
    /// A runner with no handlers yet.
    pub fn new(store: DynControlPlaneStore, config: TaskRunnerConfig) -> Self {
        TaskRunner {
            store,
            config,
            handlers: HashMap::new(),
        }
    }

    /// Runs `handler` for tasks of `kind` (a later registration of the same
    /// kind replaces the earlier one).
    pub fn register<F, Fut>(&mut self, kind: &str, handler: F)
    where
        F: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TaskResult> + Send + 'static,
    {
        let boxed: BoxedHandler = Arc::new(move |t| Box::pin(handler(t)));
        self.handlers.insert(kind.to_string(), boxed);
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.handlers.keys().cloned().collect();
        k.sort();
        k
    }

    /// Claims and runs tasks until `stop` turns true; then stops claiming,
    /// gives running handlers the grace period and releases the rest.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> TaskReport {
        let mut report = TaskReport::default();
        let kinds = self.kinds();
        if kinds.is_empty() {
            return report;
        }
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let (halt_tx, halt) = watch::channel(false);
        let mut running: JoinSet<Ended> = JoinSet::new();
        let tally = |report: &mut TaskReport, ended: Option<Ended>| match ended {
            Some(Ended::Completed) => report.completed += 1,
            Some(Ended::Failed) => report.failed += 1,
            Some(Ended::Lost) => report.lost += 1,
            Some(Ended::Released) => report.released += 1,
            None => {}
        };
        while !*stop.borrow() {
            while let Some(done) = running.try_join_next() {
                tally(&mut report, done.ok());
            }
            let free = u32::try_from(permits.available_permits()).unwrap_or(u32::MAX);
            if free == 0 {
                tokio::select! {
                    done = running.join_next() => tally(&mut report, done.and_then(|d| d.ok())),
                    _ = stop.changed() => {}
                }
                continue;
            }
            let claimed = self
                .store
                .workflow_claim(TaskClaimRequest {
                    worker: self.config.worker.clone(),
                    kinds: kinds.clone(),
                    limit: free.min(100),
                    lease_for: self.config.lease,
                })
                .await
                .unwrap_or_else(|e| {
                    eprintln!("tasks: claim failed: {e}");
                    Vec::new()
                });
            if claimed.is_empty() {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            for c in claimed {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                let Some(handler) = self.handlers.get(&c.task.kind).cloned() else {
                    let _ = self.store.workflow_release(&c.lease).await;
                    continue;
                };
                let store = self.store.clone();
                let lease_for = self.config.lease;
                let halt = halt.clone();
                running.spawn(async move {
                    let ended = run_one(&store, handler, c, lease_for, halt).await;
                    drop(permit);
                    ended
                });
            }
        }
        let deadline = tokio::time::sleep(self.config.grace);
        tokio::pin!(deadline);
        while !running.is_empty() {
            tokio::select! {
                done = running.join_next() => tally(&mut report, done.and_then(|d| d.ok())),
                _ = &mut deadline => break,
            }
        }
        // Past the grace period: each remaining task stops its handler and
        // releases its own lease.
        let _ = halt_tx.send(true);
        while let Some(done) = running.join_next().await {
            tally(&mut report, done.ok());
        }
        report
    }
}

/// Runs one handler in its own task (so a panic is caught), renewing the
/// lease until it ends, then records the outcome.
async fn run_one(
    store: &DynControlPlaneStore,
    handler: BoxedHandler,
    c: ClaimedTask,
    lease_for: Duration,
    mut halt: watch::Receiver<bool>,
) -> Ended {
    let ClaimedTask { mut lease, task } = c;
    let mut work = tokio::spawn(handler(task));
    let mut beat = tokio::time::interval(lease_for / 3);
    beat.tick().await;
    let joined = loop {
        tokio::select! {
            joined = &mut work => break joined,
            _ = beat.tick() => match store.workflow_heartbeat(&lease, lease_for).await {
                Ok(renewed) => lease = renewed,
                Err(StoreError::LeaseLost) => {
                    work.abort();
                    return Ended::Lost;
                }
                Err(e) => eprintln!("tasks: heartbeat of {} failed: {e}", lease.task_id.as_str()),
            },
            _ = halt.changed() => {
                work.abort();
                let _ = store.workflow_release(&lease).await;
                return Ended::Released;
            }
        }
    };
    let recorded = match joined {
        Ok(Ok(result)) => store
            .workflow_complete(&lease, result)
            .await
            .map(|_| Ended::Completed),
        Ok(Err(e)) => fail(store, &lease, e.message, e.failure).await,
        Err(join) => {
            let why = if join.is_panic() {
                let payload = join.into_panic();
                let text = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-text panic".into());
                format!("the handler panicked: {text}")
            } else {
                "the handler was cancelled".into()
            };
            fail(store, &lease, why, TaskFailure::Retryable).await
        }
    };
    match recorded {
        Ok(ended) => ended,
        Err(StoreError::LeaseLost) => Ended::Lost,
        Err(e) => {
            eprintln!(
                "tasks: cannot record the outcome of {}: {e}",
                lease.task_id.as_str()
            );
            Ended::Lost
        }
    }
}

async fn fail(
    store: &DynControlPlaneStore,
    lease: &TaskLease,
    message: String,
    failure: TaskFailure,
) -> Result<Ended, StoreError> {
    store
        .workflow_fail(lease, message, failure)
        .await
        .map(|_| Ended::Failed)
}
