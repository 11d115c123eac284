//! The workflow worker runtime: handlers registered by task kind run leased
//! tasks; the lease is extended while a handler runs; a handler's error or
//! panic becomes a recorded failure, never a dead worker.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use control_plane_core::{
    ClaimedTask, DynControlPlaneStore, StoreError, Task, TaskClaimRequest, TaskFailed, TaskFailure,
    TaskHeartbeat, TaskLease,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::pump::{Pump, Slot, Work};

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
    Arc<dyn Fn(Task, Progress) -> Pin<Box<dyn Future<Output = TaskResult> + Send>> + Send + Sync>;

/// What a running handler has done so far. Each report replaces the last
/// and is stored at once with a heartbeat (one write per report: report per
/// page of work, not per item), and the latest once more before the
/// outcome, as the task's `progress`: readers see it move, and a run after
/// a crash or a retried failure starts from it.
#[derive(Clone, Debug)]
pub struct Progress(Arc<tokio::sync::watch::Sender<Option<serde_json::Value>>>);

impl Progress {
    /// Reports `progress` (stored at once with a heartbeat).
    pub fn report(&self, progress: serde_json::Value) {
        self.0.send_replace(Some(progress));
    }
}

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

#[derive(Debug)]
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
        self.register_with_progress(kind, move |t, _| handler(t));
    }

    /// As [`TaskRunner::register`], for a handler that reports its
    /// [`Progress`] while it runs.
    pub fn register_with_progress<F, Fut>(&mut self, kind: &str, handler: F)
    where
        F: Fn(Task, Progress) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TaskResult> + Send + 'static,
    {
        let boxed: BoxedHandler = Arc::new(move |t, p| Box::pin(handler(t, p)));
        self.handlers.insert(kind.to_string(), boxed);
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.handlers.keys().cloned().collect();
        k.sort();
        k
    }

    /// Claims and runs tasks until `stop` is cancelled; then stops claiming,
    /// gives running handlers the grace period and releases the rest.
    pub async fn run(&self, stop: CancellationToken) -> TaskReport {
        let mut report = TaskReport::default();
        let kinds = self.kinds();
        if kinds.is_empty() {
            return report;
        }
        let pump = Pump {
            concurrency: self.config.concurrency,
            // A task's lease runs while it waits: claimed for free slots only.
            ahead: 0,
            max_batch: 100,
            poll_interval: self.config.poll_interval,
            grace: self.config.grace,
            gather_below: 0,
            gather: Duration::ZERO,
            park_after: None,
            stale_after: None,
        };
        let work = Tasks {
            runner: self,
            kinds,
        };
        pump.run(&work, stop, |ended| match ended {
            Ended::Completed => report.completed += 1,
            Ended::Failed => report.failed += 1,
            Ended::Lost => report.lost += 1,
            Ended::Released => report.released += 1,
        })
        .await;
        report
    }
}

/// The runner's work for the loop: claim tasks of the registered kinds, run
/// each handler.
struct Tasks<'a> {
    runner: &'a TaskRunner,
    kinds: Vec<String>,
}

impl Work for Tasks<'_> {
    type Item = ClaimedTask;
    type Ended = Ended;

    fn claim(&self, limit: u32) -> impl Future<Output = Vec<ClaimedTask>> + Send {
        let req = TaskClaimRequest::new(
            self.runner.config.worker.clone(),
            self.kinds.clone(),
            limit,
            self.runner.config.lease,
        );
        async move {
            let claimed = match req {
                Ok(req) => self.runner.store.workflow_claim(req).await,
                Err(e) => Err(e),
            };
            claimed.unwrap_or_else(|e| {
                tracing::warn!("task claim failed: {e}");
                Vec::new()
            })
        }
    }

    fn run(
        &self,
        c: ClaimedTask,
        halt: CancellationToken,
        _slot: Slot,
    ) -> impl Future<Output = Ended> + Send + 'static {
        let store = self.runner.store.clone();
        let handler = self.runner.handlers.get(&c.task.kind).cloned();
        let lease_for = self.runner.config.lease;
        let span = tracing::info_span!(
            "task",
            account = %c.task.account,
            task_id = %c.task.id,
            kind = %c.task.kind,
            attempt = c.task.attempts,
        );
        async move {
            let Some(handler) = handler else {
                return release(&store, &c.lease).await;
            };
            let ended = run_one(&store, handler, c, lease_for, halt).await;
            tracing::debug!(ended = ?ended, "task ended");
            ended
        }
        .instrument(span)
    }

    fn give_back(&self, c: ClaimedTask) -> impl Future<Output = Ended> + Send + 'static {
        let store = self.runner.store.clone();
        async move { release(&store, &c.lease).await }
    }

    fn lost(&self) -> Ended {
        Ended::Lost
    }
}

/// Gives `lease` back unrun or halted; a failed release leaves it to expire.
async fn release(store: &DynControlPlaneStore, lease: &TaskLease) -> Ended {
    let _ = store.workflow_release(lease).await;
    Ended::Released
}

/// Why a handler's task ended without a result: its panic, or its
/// cancellation.
fn why_ended(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return "the handler was cancelled".into();
    }
    let payload = join.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".into());
    format!("the handler panicked: {text}")
}

/// Runs one handler in its own task (so a panic is caught), renewing the
/// lease until it ends, then records the outcome.
async fn run_one(
    store: &DynControlPlaneStore,
    handler: BoxedHandler,
    c: ClaimedTask,
    lease_for: Duration,
    halt: CancellationToken,
) -> Ended {
    let ClaimedTask { mut lease, task } = c;
    let (report, mut reported) = tokio::sync::watch::channel(None);
    let mut work = tokio::spawn(handler(task, Progress(Arc::new(report))));
    let mut beat = tokio::time::interval(lease_for / 3);
    beat.tick().await;
    // A report not stored yet: kept until a heartbeat stores it.
    let mut pending: Option<TaskHeartbeat> = None;
    let joined = loop {
        let fresh = tokio::select! {
            joined = &mut work => break joined,
            // A report is stored at once (with a heartbeat), so a crash
            // loses at most what was done since the last report.
            Ok(()) = reported.changed() => true,
            _ = beat.tick() => false,
            _ = halt.cancelled() => {
                work.abort();
                return release(store, &lease).await;
            }
        };
        // `changed` marked the new report seen: take it as it is.
        let report = if fresh {
            reported.borrow_and_update().clone()
        } else {
            latest(&mut reported)
        };
        pending = checked(&lease, lease_for, report).or(pending);
        let heartbeat = pending
            .clone()
            .unwrap_or_else(|| TaskHeartbeat::extend(lease_for));
        match store.workflow_heartbeat(&lease, heartbeat).await {
            Ok(renewed) => {
                lease = renewed;
                pending = None;
            }
            Err(StoreError::LeaseLost) => {
                work.abort();
                return Ended::Lost;
            }
            Err(e) => tracing::warn!(task_id = %lease.task_id, "heartbeat failed: {e}"),
        }
    };
    // The last report, so that a failure retried later starts from it.
    if let Some(last) = checked(&lease, lease_for, latest(&mut reported)).or(pending) {
        match store.workflow_heartbeat(&lease, last).await {
            Ok(renewed) => lease = renewed,
            Err(StoreError::LeaseLost) => return Ended::Lost,
            Err(e) => tracing::warn!(task_id = %lease.task_id, "cannot store the progress: {e}"),
        }
    }
    let recorded = match joined {
        Ok(Ok(result)) => store
            .workflow_complete(&lease, result)
            .await
            .map(|_| Ended::Completed),
        Ok(Err(e)) => {
            let failed = TaskFailed {
                error: e.message,
                failure: e.failure,
            };
            fail(store, &lease, failed).await
        }
        Err(join) => fail(store, &lease, TaskFailed::retryable(why_ended(join))).await,
    };
    match recorded {
        Ok(ended) => ended,
        Err(StoreError::LeaseLost) => Ended::Lost,
        Err(e) => {
            tracing::warn!("cannot record the task's outcome: {e}");
            Ended::Lost
        }
    }
}

/// A heartbeat storing `progress`, when it is progress a store takes; a
/// refused one is logged and dropped, so that it never holds up the
/// heartbeats that keep the lease.
fn checked(
    lease: &TaskLease,
    lease_for: Duration,
    progress: Option<serde_json::Value>,
) -> Option<TaskHeartbeat> {
    match TaskHeartbeat::with_progress(lease_for, progress?) {
        Ok(beat) => Some(beat),
        Err(e) => {
            tracing::warn!(task_id = %lease.task_id, "the handler's progress is not stored: {e}");
            None
        }
    }
}

/// The progress reported since the last look, if any.
fn latest(
    reported: &mut tokio::sync::watch::Receiver<Option<serde_json::Value>>,
) -> Option<serde_json::Value> {
    // Read off the value itself: `has_changed` on the receiver fails once
    // the handler has ended and dropped its sender.
    let seen = reported.borrow_and_update();
    if seen.has_changed() {
        seen.clone()
    } else {
        None
    }
}

async fn fail(
    store: &DynControlPlaneStore,
    lease: &TaskLease,
    failed: TaskFailed,
) -> Result<Ended, StoreError> {
    store
        .workflow_fail(lease, failed)
        .await
        .map(|_| Ended::Failed)
}
