//! The workflow queue, request idempotency and single-flight ticks.

use async_trait::async_trait;

use crate::{
    AccountId, Checked, ClaimedTask, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyToken,
    Page, StoreResult, StoredResponse, Task, TaskClaimRequest, TaskEnqueueRequest, TaskEnqueued,
    TaskFailed, TaskHeartbeat, TaskId, TaskLease, TaskListRequest, TickClaimRequest, TickLease,
};

/// The workflow handoff queue: leased jobs handed between processes.
///
/// Heartbeats, staged results, completions, failures and releases are
/// decided by the same lease check as deliveries, [`crate::lease::fence`],
/// asked through [`crate::lease::TaskRow::fence`] and
/// [`crate::lease::TaskRow::fail_to`] in each adapter's `workflow.rs`.
#[async_trait]
pub trait WorkflowStore: Send + Sync {
    /// Enqueues a task, idempotent on its id within its account.
    ///
    /// # Behavior
    /// - The same id with the same kind and payload returns the existing
    ///   task; with either different it is `Conflict`. Ids are scoped by
    ///   account: another account's task of the same id is a different task,
    ///   and enqueueing never reveals that it exists
    ///   (`workflow_enqueue_is_idempotent_and_conflicts_on_difference`).
    ///
    /// # Errors
    /// `Conflict`. An empty or oversized kind is refused when the request is
    /// sealed ([`crate::Check::checked`]).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_enqueue(&self, req: Checked<TaskEnqueueRequest>)
        -> StoreResult<TaskEnqueued>;

    /// Leases up to `limit` due tasks of the given kinds, oldest due first.
    ///
    /// # Behavior
    /// - Only due tasks of the given kinds (`workflow_claim_takes_due_tasks_of_given_kinds`).
    /// - Exclusive across concurrent claimers (`workflow_claim_is_exclusive_under_concurrent_claimers`).
    /// - Expired leases are swept first: due again, or dead-lettered when the
    ///   attempts are used up (`workflow_expired_lease_is_claimable_again`); a
    ///   task whose handler staged a result is completed with it instead
    ///   (`workflow_staged_result_is_finalized_without_rerun`).
    ///
    /// # Errors
    /// None of its own: [`TaskClaimRequest::new`] refuses no kinds, a limit
    /// outside 1..=1000 or a zero lease.
    ///
    /// # Cancellation safety
    /// Leases of a claim cancelled after its commit expire.
    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>>;

    /// Extends a live lease while the handler runs by the heartbeat's
    /// `lease_for`, and stores its progress when it has one (what the
    /// handler has done so far; none keeps the last). The progress was
    /// checked when the [`TaskHeartbeat`] was built.
    ///
    /// # Behavior
    /// - A stale or expired lease is `LeaseLost` (`workflow_heartbeat_extends_and_stale_lease_is_lost`).
    /// - The progress is readable at once ([`WorkflowStore::workflow_get`]),
    ///   kept through completion, failure and a lost lease, and given to the
    ///   next claim of the task; a lost lease's progress is not stored
    ///   (`workflow_heartbeat_stores_progress_for_readers_and_the_next_run`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        beat: TaskHeartbeat,
    ) -> StoreResult<TaskLease>;

    /// Stores the handler's result before completion, so a crash between the
    /// two never runs the handler again.
    ///
    /// # Errors
    /// `LeaseLost`; `NotFound` under another account.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()>;

    /// Completes a task with its result. A repeat with the same lease returns the task.
    ///
    /// # Behavior
    /// - A lease reaches its own account's task only, also when another
    ///   account has a task of the same id (`workflow_same_id_in_two_accounts_stays_apart`).
    ///
    /// # Errors
    /// `LeaseLost`; `NotFound` when the lease names another account
    /// (`workflow_account_scoping_fails_closed`); `Conflict` when the lease
    /// already failed the task.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task>;

    /// Records a failure: backs off (capped exponential, jittered) when
    /// retryable and attempts remain, dead-letters otherwise.
    ///
    /// # Behavior
    /// - Backoff, then dead letter with the last error (`workflow_fail_backs_off_then_dead_letters`).
    /// - Non-retryable: dead-lettered at once (`workflow_non_retryable_failure_dead_letters_at_once`).
    ///
    /// # Errors
    /// As [`WorkflowStore::workflow_complete`].
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_fail(&self, lease: &TaskLease, failed: TaskFailed) -> StoreResult<Task>;

    /// Returns a leased task to `pending` without spending its attempt (shutdown).
    ///
    /// # Behavior
    /// - The attempt budget is unchanged (`workflow_release_keeps_the_attempt_budget`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()>;

    /// Reads a task of `account`.
    ///
    /// # Errors
    /// `NotFound`, also for another account's task.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task>;

    /// The tasks of an account in one state (pending, leased or
    /// dead-lettered; completed ones are history and not listed), newest
    /// first.
    ///
    /// # Behavior
    /// - Lists dead letters with their last error; retry makes one due again
    ///   with a fresh budget (`workflow_dead_letters_are_listed_and_retried`).
    /// - Lists pending and leased ones of that account only
    ///   (`workflow_tasks_are_listed_by_state`).
    ///
    /// # Errors
    /// `InvalidInput` for `Completed`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn workflow_list(&self, req: TaskListRequest) -> StoreResult<Page<Task>>;

    /// Moves a dead-lettered task back to `pending` with a fresh attempt budget.
    ///
    /// # Errors
    /// `NotFound`; `Conflict` when it is not dead-lettered.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not retry.
    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task>;
}

/// Request idempotency records.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims `(scope, key)` for a request with `request_hash`, for `ttl`.
    ///
    /// # Behavior
    /// - `Started` for a new or expired key, `InProgress` while its owner runs,
    ///   `Replay` with the stored response once completed, `Mismatch` for a
    ///   different request (`idempotency_begin_reports_every_outcome`).
    /// - An unfinished record holds its key for the request's lease only;
    ///   a completed one lives the ttl from its completion
    ///   (`an_unfinished_idempotency_record_is_held_only_for_its_lease`).
    ///
    /// # Errors
    /// A failure to persist is an error, never a `Started` (an empty or
    /// oversized scope or key cannot be asked: [`IdempotencyBeginRequest::new`]
    /// refuses it).
    ///
    /// # Cancellation safety
    /// A cancelled begin may hold the key until the TTL passes.
    async fn idempotency_begin(
        &self,
        req: &IdempotencyBeginRequest,
    ) -> StoreResult<IdempotencyBegin>;

    /// Stores the response; later begins replay it.
    ///
    /// # Errors
    /// `LeaseLost` when the token no longer owns the key
    /// (`idempotency_complete_with_a_stale_token_is_an_error`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()>;

    /// Frees the key after a failed handler.
    ///
    /// # Behavior
    /// - The next begin is `Started` (`idempotency_abandon_frees_the_key`).
    ///
    /// # Errors
    /// `LeaseLost` when the token no longer owns the key.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()>;
}

/// Single-flight periodic work.
#[async_trait]
pub trait TickStore: Send + Sync {
    /// Claims the tick the request names unless another holder's lease is
    /// live or it completed less than its `every` ago.
    ///
    /// # Behavior
    /// - At most one holder across replicas until completion or expiry
    ///   (`tick_is_single_flight_until_completed_or_expired`); the stored state
    ///   comes back and `every` is respected (`tick_state_is_kept_and_interval_respected`).
    ///
    /// The name was checked when the [`TickClaimRequest`] was built.
    ///
    /// # Cancellation safety
    /// A cancelled claim may hold the tick until its lease expires.
    async fn tick_claim(&self, req: &TickClaimRequest) -> StoreResult<Option<TickLease>>;

    /// Stores the tick's state and frees it.
    ///
    /// # Errors
    /// `LeaseLost` when the lease is stale.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()>;
}
