//! The workflow handoff queue.

use async_trait::async_trait;
use control_plane_core::{
    AccountId, Checked, ClaimedTask, LeaseToken, Page, StoreError, StoreResult, Task,
    TaskClaimRequest, TaskEnqueueRequest, TaskEnqueued, TaskFailed, TaskHeartbeat, TaskId,
    TaskLease, TaskListRequest, TaskState, WorkflowStore,
};
use control_plane_core::{FencedWrite, TaskRow, Verdict};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};
use crate::util::RowExt;
use control_plane_store_kit::columns::TASK_COLS;

/// [`TASK_COLS`] qualified by the alias `t` (for `UPDATE tasks t ... FROM c`).
const TASK_COLS_OF_T: &str =
    "t.id, t.account, t.kind, t.payload, t.state, t.attempts, t.max_attempts, t.run_at, t.lease_expires_at, \
     t.last_error, t.result, t.created_at, t.updated_at, t.seq, t.lease_token, t.last_outcome, t.staged_result, t.progress";

fn row_to_task(r: &Row) -> StoreResult<Task> {
    Ok(Task {
        id: r.col(0)?,
        account: r.col(1)?,
        kind: r.col(2)?,
        payload: r.col(3)?,
        state: r.col(4)?,
        attempts: r.col(5)?,
        max_attempts: r.col(6)?,
        run_at: r.col(7)?,
        lease_expires_at: r.col(8)?,
        last_error: r.col(9)?,
        result: r.col(10)?,
        progress: r.col(17)?,
        created_at: r.col(11)?,
        updated_at: r.col(12)?,
    })
}

pub(crate) async fn get(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
    let row = t
        .query_opt(
            &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 AND account = $2"),
            &[&id.as_str(), &account.as_str()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("task", id))?;
    row_to_task(&row)
}

pub(crate) async fn enqueue(
    t: &Tx<'_>,
    req: Checked<TaskEnqueueRequest>,
) -> StoreResult<TaskEnqueued> {
    let run_at = req.run_at.unwrap_or(t.now).as_millis();
    let inserted = t
        .query_opt(
            &format!(
                "INSERT INTO tasks (id, account, kind, payload, state, attempts, max_attempts, run_at, seq, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, 'pending', 0, $5, $6, nextval('task_seq'), $7, $7) \
                 ON CONFLICT (account, id) DO NOTHING RETURNING {TASK_COLS}"
            ),
            &[
                &req.id.as_str(),
                &req.account.as_str(),
                &req.kind,
                &req.payload,
                &i64::from(t.options.workflow.max_attempts),
                &run_at,
                &t.now.as_millis(),
            ],
        )
        .await
        .db()?;
    if let Some(row) = inserted {
        return Ok(TaskEnqueued {
            task: row_to_task(&row)?,
            created: true,
        });
    }
    let row = t
        .query_one(
            &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 AND account = $2"),
            &[&req.id.as_str(), &req.account.as_str()],
        )
        .await
        .db()?;
    let existing = row_to_task(&row)?;
    if existing.kind != req.kind || existing.payload != req.payload {
        return Err(StoreError::Conflict(format!(
            "task {} already exists with a different kind or payload",
            req.id
        )));
    }
    Ok(TaskEnqueued {
        task: existing,
        created: false,
    })
}

/// The expired-lease sweep: staged results complete, exhausted tasks
/// dead-letter, the rest are due again.
async fn sweep_expired(t: &Tx<'_>) -> StoreResult<()> {
    t.execute(
        "WITH c AS (SELECT account, id FROM tasks WHERE state = 'leased' AND lease_expires_at <= $1 \
                    ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED) \
         UPDATE tasks t SET \
           state = CASE WHEN t.staged_result IS NOT NULL THEN 'completed' \
                        WHEN t.attempts >= t.max_attempts THEN 'dead_lettered' ELSE 'pending' END, \
           result = CASE WHEN t.staged_result IS NOT NULL THEN t.staged_result ELSE t.result END, \
           last_error = CASE WHEN t.staged_result IS NOT NULL THEN t.last_error \
                             ELSE 'lease expired before the worker reported' END, \
           run_at = CASE WHEN t.staged_result IS NULL AND t.attempts < t.max_attempts THEN $1 ELSE t.run_at END, \
           staged_result = NULL, lease_token = NULL, lease_expires_at = NULL, leased_by = NULL, updated_at = $1 \
         FROM c WHERE t.account = c.account AND t.id = c.id",
        &[&t.now.as_millis()],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn claim(t: &Tx<'_>, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
    sweep_expired(t).await?;
    let expires = t.now.plus(req.lease_for());
    let rows = t
        .query(
            &format!(
                "WITH c AS (SELECT account, id FROM tasks WHERE state = 'pending' AND run_at <= $1 AND kind = ANY($2) \
                            ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 UPDATE tasks t SET state = 'leased', attempts = t.attempts + 1, lease_token = gen_random_uuid(), \
                   lease_expires_at = $4, leased_by = $5, last_outcome = NULL, updated_at = $1 \
                 FROM c WHERE t.account = c.account AND t.id = c.id RETURNING {TASK_COLS_OF_T}"
            ),
            &[&t.now.as_millis(), &req.kinds(), &i64::from(req.limit()), &expires.as_millis(), &req.worker()],
        )
        .await
        .db()?;
    // RETURNING does not keep the claim order: sort by (run_at, seq) again.
    let mut claimed = Vec::with_capacity(rows.len());
    for r in &rows {
        let task = row_to_task(r)?;
        let seq: i64 = r.col(13)?;
        let token: Uuid = r.col(14)?;
        let lease = TaskLease {
            task_id: task.id.clone(),
            account: task.account.clone(),
            token: LeaseToken(token),
            attempt: task.attempts,
            expires_at: expires,
        };
        claimed.push(((task.run_at, seq), ClaimedTask { lease, task }));
    }
    claimed.sort_by_key(|(k, _)| *k);
    let out = claimed.into_iter().map(|(_, c)| c).collect();
    Ok(out)
}

/// The locked row of a lease's task, scoped to the lease's account.
async fn lock(t: &Tx<'_>, lease: &TaskLease) -> StoreResult<TaskRow> {
    let row = t
        .query_opt(
            &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 AND account = $2 FOR UPDATE"),
            &[&lease.task_id.as_str(), &lease.account.as_str()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("task", &lease.task_id))?;
    Ok(TaskRow {
        task: row_to_task(&row)?,
        seq: row.col(13)?,
        token: row.col(14)?,
        last_outcome: row.col(15)?,
    })
}

pub(crate) async fn heartbeat(
    t: &Tx<'_>,
    lease: &TaskLease,
    beat: &TaskHeartbeat,
) -> StoreResult<TaskLease> {
    let (lease_for, progress) = (beat.lease_for(), beat.progress());
    let l = lock(t, lease).await?;
    l.fence(&lease.token, FencedWrite::Keep { now: t.now })?;
    let expires_at = t.now.plus(lease_for);
    t.execute(
        "UPDATE tasks SET lease_expires_at = $1, updated_at = $2, progress = coalesce($5::jsonb, progress) \
         WHERE account = $3 AND id = $4",
        &[
            &expires_at.as_millis(),
            &t.now.as_millis(),
            &lease.account.as_str(),
            &lease.task_id.as_str(),
            &progress,
        ],
    )
    .await
    .db()?;
    Ok(TaskLease {
        expires_at,
        ..lease.clone()
    })
}

pub(crate) async fn stage(
    t: &Tx<'_>,
    lease: &TaskLease,
    result: serde_json::Value,
) -> StoreResult<()> {
    let l = lock(t, lease).await?;
    l.fence(&lease.token, FencedWrite::Within)?;
    t.execute(
        "UPDATE tasks SET staged_result = $1, updated_at = $2 WHERE account = $3 AND id = $4",
        &[
            &result,
            &t.now.as_millis(),
            &lease.account.as_str(),
            &lease.task_id.as_str(),
        ],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn complete(
    t: &Tx<'_>,
    lease: &TaskLease,
    result: serde_json::Value,
) -> StoreResult<Task> {
    let l = lock(t, lease).await?;
    let end = FencedWrite::End { kind: "complete" };
    if l.fence(&lease.token, end)? == Verdict::Repeat {
        return Ok(l.task);
    }
    t.execute(
        "UPDATE tasks SET state = 'completed', result = $1, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'complete', updated_at = $2 WHERE account = $3 AND id = $4",
        &[&result, &t.now.as_millis(), &lease.account.as_str(), &lease.task_id.as_str()],
    )
    .await
    .db()?;
    get(t, &lease.account, &lease.task_id).await
}

pub(crate) async fn fail(t: &Tx<'_>, lease: &TaskLease, failed: &TaskFailed) -> StoreResult<Task> {
    let TaskFailed { error, failure } = failed;
    let l = lock(t, lease).await?;
    let Some((state, run_at)) = l.fail_to(&lease.token, *failure, t.now, &t.options.workflow)?
    else {
        return Ok(l.task);
    };
    t.execute(
        "UPDATE tasks SET state = $1, run_at = $2, last_error = $3, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'fail', updated_at = $4 WHERE account = $5 AND id = $6",
        &[&state.as_str(), &run_at.as_millis(), &error, &t.now.as_millis(), &lease.account.as_str(), &lease.task_id.as_str()],
    )
    .await
    .db()?;
    get(t, &lease.account, &lease.task_id).await
}

pub(crate) async fn release(t: &Tx<'_>, lease: &TaskLease) -> StoreResult<()> {
    let l = lock(t, lease).await?;
    l.fence(&lease.token, FencedWrite::Within)?;
    t.execute(
        "UPDATE tasks SET state = 'pending', attempts = attempts - 1, run_at = $1, lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, staged_result = NULL, updated_at = $1 WHERE account = $2 AND id = $3",
        &[&t.now.as_millis(), &lease.account.as_str(), &lease.task_id.as_str()],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn list(t: &Tx<'_>, req: &TaskListRequest) -> StoreResult<Page<Task>> {
    let (account, page) = (&req.account, req.page);
    let state = control_plane_core::listable(req.state)?;
    let rows = t
        .query(
            &format!(
                "SELECT {TASK_COLS} FROM tasks WHERE account = $1 AND state = $4 \
                 AND ($2::bigint IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3"
            ),
            &[
                &account.as_str(),
                &page.after(),
                &(i64::from(page.limit()) + 1),
                &state.as_str(),
            ],
        )
        .await
        .db()?;
    let items = rows
        .iter()
        .map(|r| Ok((r.col::<i64>(13)?, row_to_task(r)?)))
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, page.limit(), |(seq, _)| *seq).map(|(_, t)| t))
}

pub(crate) async fn retry_dead(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
    let task = get(t, account, id).await?;
    if task.state != TaskState::DeadLettered {
        return Err(StoreError::Conflict(format!(
            "task {id} is {}; only dead-lettered tasks can be retried",
            task.state.as_str()
        )));
    }
    t.execute(
        "UPDATE tasks SET state = 'pending', run_at = $1, max_attempts = attempts + $2, lease_token = NULL, \
         last_outcome = NULL, updated_at = $1 WHERE account = $3 AND id = $4 AND state = 'dead_lettered'",
        &[&t.now.as_millis(), &i64::from(t.options.workflow.max_attempts), &account.as_str(), &id.as_str()],
    )
    .await
    .db()?;
    get(t, account, id).await
}

#[async_trait]
impl WorkflowStore for PostgresStore {
    async fn workflow_enqueue(
        &self,
        req: Checked<TaskEnqueueRequest>,
    ) -> StoreResult<TaskEnqueued> {
        in_tx!(self, |t| enqueue(&t, req))
    }

    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
        in_tx!(self, |t| claim(&t, req))
    }

    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        beat: TaskHeartbeat,
    ) -> StoreResult<TaskLease> {
        in_tx!(self, |t| heartbeat(&t, lease, &beat))
    }

    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()> {
        in_tx!(self, |t| stage(&t, lease, result))
    }

    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task> {
        in_tx!(self, |t| complete(&t, lease, result))
    }

    async fn workflow_fail(&self, lease: &TaskLease, failed: TaskFailed) -> StoreResult<Task> {
        in_tx!(self, |t| fail(&t, lease, &failed))
    }

    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()> {
        in_tx!(self, |t| release(&t, lease))
    }

    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        in_tx!(self, |t| get(&t, account, id))
    }

    async fn workflow_list(&self, req: TaskListRequest) -> StoreResult<Page<Task>> {
        in_tx!(self, |t| list(&t, &req))
    }

    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        in_tx!(self, |t| retry_dead(&t, account, id))
    }
}
