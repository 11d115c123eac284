//! Types of the workflow handoff queue and its retry policy.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::{
    validate_json_text, validate_lease, validate_limit, validate_short_text, AccountId, LeaseToken,
};

string_id! {
    /// A caller-chosen task id: 1 to 255 characters, no control characters.
    pub struct TaskId;
    short_text "task id";
}

/// The prefix of the task kinds the service runs itself
/// (`control-plane.erase`, `control-plane.recover`, ...).
pub const SERVICE_TASK_PREFIX: &str = "control-plane.";

/// The one service kind a tenant may enqueue through the task API: publish
/// an event when the task is due (payload `{"type", "payload"}`).
pub const PUBLISH_TASK: &str = "control-plane.publish";

/// Whether `kind` is reserved to the service: every kind under
/// [`SERVICE_TASK_PREFIX`] but [`PUBLISH_TASK`]. The task API refuses to
/// enqueue one and an account key to retry one, so that an erasure or a
/// recovery runs only through its own route and its own checks.
pub fn task_kind_reserved(kind: &str) -> bool {
    kind.starts_with(SERVICE_TASK_PREFIX) && kind != PUBLISH_TASK
}

named_enum! {
    /// The lifecycle of a task.
    ///
    /// `pending` → `leased` (claim) → `completed` | `pending` (retryable failure,
    /// release, lease expiry) | `dead_lettered` (attempts used up, non-retryable
    /// failure). `dead_lettered` → `pending` by retry. A lease that expires after
    /// its handler staged a result is finalized as `completed` by the next claim,
    /// without running the handler again.
    pub enum TaskState ("task state") {
        /// Waiting until `run_at`.
        Pending = "pending",
        /// Held by a live lease.
        Leased = "leased",
        /// Done; `result` holds the outcome. Final.
        Completed = "completed",
        /// Given up; `last_error` says why. Listable and retryable.
        DeadLettered = "dead_lettered",
    }
}

/// A task of the workflow queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Caller-chosen id.
    pub id: TaskId,
    /// Owning account.
    pub account: AccountId,
    /// Handler kind.
    pub kind: String,
    /// Input.
    pub payload: serde_json::Value,
    /// State.
    pub state: TaskState,
    /// Attempts started (incremented at claim).
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// When it is next due.
    pub run_at: Timestamp,
    /// While leased: the lease's expiry.
    pub lease_expires_at: Option<Timestamp>,
    /// The last failure.
    pub last_error: Option<String>,
    /// The result, once completed.
    pub result: Option<serde_json::Value>,
    /// What its handler last reported while it ran (with a heartbeat, see
    /// `WorkflowStore::workflow_heartbeat`), kept after it ends: a handler
    /// that runs again after a crash starts from it.
    pub progress: Option<serde_json::Value>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

/// The largest progress a heartbeat stores, as JSON text.
pub const MAX_PROGRESS_BYTES: usize = 65_536;

/// Checks a task's progress before it is stored: no NUL in a string or key
/// (as payloads), at most [`MAX_PROGRESS_BYTES`] of JSON.
///
/// # Errors
/// `InvalidInput` saying which.
pub fn validate_progress(progress: &serde_json::Value) -> Result<(), StoreError> {
    validate_json_text("task progress", progress)?;
    let len = progress.to_string().len();
    if len > MAX_PROGRESS_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "task progress must be at most {MAX_PROGRESS_BYTES} bytes of JSON, got {len}"
        )));
    }
    Ok(())
}

/// Enqueues a task.
#[derive(Clone, Debug)]
pub struct TaskEnqueueRequest {
    /// Caller-chosen id; enqueueing it again is idempotent.
    pub id: TaskId,
    /// Owning account.
    pub account: AccountId,
    /// Handler kind, 1 to 255 characters.
    pub kind: String,
    /// Input.
    pub payload: serde_json::Value,
    /// Not before this time (now when `None`).
    pub run_at: Option<Timestamp>,
}

impl crate::Check for TaskEnqueueRequest {
    /// `InvalidInput` for a kind that is empty, longer than 255 bytes or
    /// holds a control character, or a payload with a NUL in a string.
    fn check(&self) -> Result<(), StoreError> {
        validate_short_text("task kind", &self.kind)?;
        validate_json_text("task payload", &self.payload)
    }
}

/// What an enqueue did.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskEnqueued {
    /// The task (the existing one for a repeat).
    pub task: Task,
    /// False when the same task was already enqueued.
    pub created: bool,
}

/// Asks for due tasks of some kinds. Built checked ([`TaskClaimRequest::new`]).
#[derive(Clone, Debug)]
pub struct TaskClaimRequest {
    worker: String,
    kinds: Vec<String>,
    limit: u32,
    lease_for: Duration,
}

impl TaskClaimRequest {
    /// Up to `limit` due tasks of `kinds` for `worker`, leased for
    /// `lease_for`.
    ///
    /// # Errors
    /// `InvalidInput` for a limit outside 1 to 1000, no kinds, or a zero lease.
    pub fn new(
        worker: impl Into<String>,
        kinds: Vec<String>,
        limit: u32,
        lease_for: Duration,
    ) -> Result<Self, StoreError> {
        validate_limit(limit)?;
        if kinds.is_empty() {
            return Err(StoreError::InvalidInput(
                "claim at least one task kind".into(),
            ));
        }
        validate_lease(lease_for)?;
        Ok(TaskClaimRequest {
            worker: worker.into(),
            kinds,
            limit,
            lease_for,
        })
    }

    /// Who claims.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// The kinds this worker handles.
    pub fn kinds(&self) -> &[String] {
        &self.kinds
    }

    /// At most this many tasks.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// How long each lease runs.
    pub fn lease_for(&self) -> Duration {
        self.lease_for
    }
}

/// A heartbeat of a leased task: how much longer its lease runs, and the
/// handler's progress when it has some to store (checked when built).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskHeartbeat {
    lease_for: Duration,
    progress: Option<serde_json::Value>,
}

impl TaskHeartbeat {
    /// Extends the lease by `lease_for` and keeps the last progress.
    pub fn extend(lease_for: Duration) -> Self {
        TaskHeartbeat {
            lease_for,
            progress: None,
        }
    }

    /// Extends the lease by `lease_for` and stores `progress`.
    ///
    /// # Errors
    /// `InvalidInput` for progress over [`MAX_PROGRESS_BYTES`] of JSON or
    /// holding text a store cannot keep ([`validate_progress`]).
    pub fn with_progress(
        lease_for: Duration,
        progress: serde_json::Value,
    ) -> Result<Self, StoreError> {
        validate_progress(&progress)?;
        Ok(TaskHeartbeat {
            lease_for,
            progress: Some(progress),
        })
    }

    /// How much longer the lease runs, from the heartbeat.
    pub fn lease_for(&self) -> Duration {
        self.lease_for
    }

    /// The progress to store, if any.
    pub fn progress(&self) -> Option<&serde_json::Value> {
        self.progress.as_ref()
    }
}

/// A failed run of a task: its error, and whether it may run again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskFailed {
    /// What went wrong (kept as the task's `last_error`).
    pub error: String,
    /// Whether the task is tried again.
    pub failure: TaskFailure,
}

impl TaskFailed {
    /// A failure tried again after a backoff while attempts remain.
    pub fn retryable(error: impl Into<String>) -> Self {
        TaskFailed {
            error: error.into(),
            failure: TaskFailure::Retryable,
        }
    }

    /// A failure that dead-letters the task at once.
    pub fn permanent(error: impl Into<String>) -> Self {
        TaskFailed {
            error: error.into(),
            failure: TaskFailure::Permanent,
        }
    }
}

/// How a failed task goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskFailure {
    /// Tried again after a backoff while attempts remain, then dead-lettered.
    Retryable,
    /// Dead-lettered at once.
    Permanent,
}

impl TaskFailure {
    /// Whether this failure, on attempt `attempts` of `max_attempts`,
    /// dead-letters the task.
    pub fn dead_letters(self, attempts: u32, max_attempts: u32) -> bool {
        self == TaskFailure::Permanent || attempts >= max_attempts
    }

    /// Where `task` goes after this failure at `now`: dead-lettered (its run
    /// time kept), or pending again after its backoff.
    pub fn next(
        self,
        task: &Task,
        now: Timestamp,
        policy: &WorkflowPolicy,
    ) -> (TaskState, Timestamp) {
        if self.dead_letters(task.attempts, task.max_attempts) {
            (TaskState::DeadLettered, task.run_at)
        } else {
            (
                TaskState::Pending,
                now.plus(policy.backoff(&task.id, task.attempts)),
            )
        }
    }
}

/// Proof of a task claim; it carries the account, so every write is scoped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLease {
    /// The task.
    pub task_id: TaskId,
    /// Its account.
    pub account: AccountId,
    /// Fencing token.
    pub token: LeaseToken,
    /// Attempt number.
    pub attempt: u32,
    /// Expiry.
    pub expires_at: Timestamp,
}

/// A claimed task.
#[derive(Clone, Debug)]
pub struct ClaimedTask {
    /// The lease.
    pub lease: TaskLease,
    /// The task (state `leased`).
    pub task: Task,
}

/// Retry policy of the workflow queue: capped exponential backoff with jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkflowPolicy {
    /// Attempts before a task is dead-lettered.
    pub max_attempts: u32,
    /// Backoff before the second attempt.
    pub backoff_base: Duration,
    /// Cap on the backoff.
    pub backoff_max: Duration,
}

impl Default for WorkflowPolicy {
    fn default() -> Self {
        WorkflowPolicy {
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(600),
        }
    }
}

impl WorkflowPolicy {
    /// The delay after failed attempt `attempt` (from 1) of `task`: the capped
    /// exponential `base * 2^(attempt-1)`, scaled by a jitter factor in
    /// [0.5, 1.0] derived from the task id and attempt ([`crate::EndpointRetry`]). The jitter is
    /// deterministic, so every replica and the model agree, yet tasks that
    /// failed together spread out.
    pub fn backoff(&self, task: &TaskId, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let full = self
            .backoff_base
            .checked_mul(1u32 << exp)
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max);
        let seed: Vec<u8> = task.as_str().bytes().chain(attempt.to_le_bytes()).collect();
        crate::backoff::jittered(full, crate::backoff::jitter_unit(&seed), 0.5, 1.0).min(full)
    }
}

/// Which tasks [`crate::WorkflowStore::workflow_list`] returns: one
/// account's, in one state, newest first.
#[derive(Clone, Debug)]
pub struct TaskListRequest {
    /// The account.
    pub account: crate::AccountId,
    /// Pending, leased or dead-lettered (completed ones are not listed).
    pub state: TaskState,
    /// The page; its cursor is the task's sequence number.
    pub page: crate::PageRequest,
}

/// Refuses a listing of completed tasks: they are history (purged by
/// retention) and no index serves them by account.
///
/// # Errors
/// `InvalidInput` for [`TaskState::Completed`].
pub fn listable(state: TaskState) -> crate::StoreResult<TaskState> {
    match state {
        TaskState::Completed => Err(crate::StoreError::InvalidInput(
            "completed tasks are not listed; ask for pending, leased or dead_lettered ones".into(),
        )),
        s => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered_within_bounds() {
        let p = WorkflowPolicy {
            max_attempts: 9,
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(60),
        };
        let t = TaskId::new("t-1").unwrap();
        for attempt in 1..=10u32 {
            let full =
                Duration::from_secs(2 * (1u64 << (attempt - 1))).min(Duration::from_secs(60));
            let d = p.backoff(&t, attempt);
            assert!(
                d >= full / 2 && d <= full,
                "attempt {attempt}: {d:?} vs {full:?}"
            );
        }
        assert_eq!(p.backoff(&t, 3), p.backoff(&t, 3), "deterministic");
        let spread: std::collections::HashSet<_> = (0..20)
            .map(|i| p.backoff(&TaskId::new(format!("t{i}")).unwrap(), 4))
            .collect();
        assert!(spread.len() > 10, "tasks failing together spread out");
    }

    #[test]
    fn task_ids_are_validated() {
        assert!(TaskId::new("order-1/step-2").is_ok());
        assert!(TaskId::new("").is_err());
        assert!(TaskId::new("a\nb").is_err());
    }
}

#[cfg(test)]
mod reserved_tests {
    use super::*;

    #[test]
    fn service_kinds_are_reserved_but_the_publish_a_tenant_may_delay() {
        for kind in [
            crate::ERASE_TASK,
            crate::RECOVER_TASK,
            "control-plane.anything",
        ] {
            assert!(task_kind_reserved(kind), "{kind}");
        }
        for kind in [
            PUBLISH_TASK,
            "email.send",
            "control-plane",
            "Control-plane.erase",
        ] {
            assert!(!task_kind_reserved(kind), "{kind}");
        }
    }
}
