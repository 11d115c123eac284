//! The workflow handoff queue.

use async_trait::async_trait;
use control_plane_core::{
    AccountId, Checked, ClaimedTask, LeaseToken, Page, StoreError, StoreResult, Task,
    TaskClaimRequest, TaskEnqueueRequest, TaskEnqueued, TaskFailed, TaskHeartbeat, TaskId,
    TaskLease, TaskListRequest, TaskState, Timestamp, WorkflowStore,
};
use control_plane_core::{FencedWrite, TaskRow, Verdict};
use duckdb::{params, OptionalExt, Row};

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::{conversion, RowExt};
use control_plane_store_kit::columns::TASK_COLS;

fn json_col(r: &Row<'_>, i: usize) -> duckdb::Result<Option<serde_json::Value>> {
    let v: Option<String> = r.get(i)?;
    v.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| conversion(i, e))
}

fn row_to_task(r: &Row<'_>) -> duckdb::Result<TaskRow> {
    Ok(TaskRow {
        task: Task {
            id: r.col(0)?,
            account: r.col(1)?,
            kind: r.get(2)?,
            payload: json_col(r, 3)?.unwrap_or(serde_json::Value::Null),
            state: r.col(4)?,
            attempts: r.get(5)?,
            max_attempts: r.get(6)?,
            run_at: r.col(7)?,
            lease_expires_at: r.col(8)?,
            last_error: r.get(9)?,
            result: json_col(r, 10)?,
            progress: json_col(r, 17)?,
            created_at: r.col(11)?,
            updated_at: r.col(12)?,
        },
        seq: r.get(13)?,
        token: r.col(14)?,
        last_outcome: r.get(15)?,
    })
}

/// Task ids are scoped by account: another account's task of the same id
/// is a different task.
fn find(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Option<TaskRow>> {
    t.query_row(
        &format!("SELECT {TASK_COLS} FROM tasks WHERE account = $1 AND id = $2"),
        params![account.as_str(), id.as_str()],
        row_to_task,
    )
    .optional()
    .db()
}

fn scoped(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<TaskRow> {
    find(t, account, id)?.ok_or_else(|| StoreError::not_found("task", id))
}

pub(crate) fn get(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
    Ok(scoped(t, account, id)?.task)
}

fn text(v: &serde_json::Value) -> String {
    v.to_string()
}

pub(crate) fn enqueue(
    t: &mut Tx<'_>,
    req: Checked<TaskEnqueueRequest>,
) -> StoreResult<TaskEnqueued> {
    if let Some(existing) = find(t, &req.account, &req.id)? {
        let e = existing.task;
        if e.kind != req.kind || e.payload != req.payload {
            return Err(StoreError::Conflict(format!(
                "task {} already exists with a different kind or payload",
                req.id
            )));
        }
        return Ok(TaskEnqueued {
            task: e,
            created: false,
        });
    }
    let seq = t.next("task_seq");
    let now = t.now.as_millis();
    t.execute(
        "INSERT INTO tasks (id, account, kind, payload, state, attempts, max_attempts, run_at, seq, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, 'pending', 0, $5::BIGINT, $6::BIGINT, $7::BIGINT, $8::BIGINT, $9::BIGINT)",
        params![
            req.id.as_str(),
            req.account.as_str(),
            req.kind,
            text(&req.payload),
            i64::from(t.options.workflow.max_attempts),
            req.run_at.map_or(now, Timestamp::as_millis),
            seq,
            now,
            now
        ],
    )
    .db()?;
    Ok(TaskEnqueued {
        task: get(t, &req.account, &req.id)?,
        created: true,
    })
}

fn sweep_expired(t: &mut Tx<'_>) -> StoreResult<()> {
    let now = t.now.as_millis();
    t.execute(
        "UPDATE tasks SET \
           state = CASE WHEN staged_result IS NOT NULL THEN 'completed' \
                        WHEN attempts >= max_attempts THEN 'dead_lettered' ELSE 'pending' END, \
           result = CASE WHEN staged_result IS NOT NULL THEN staged_result ELSE result END, \
           last_error = CASE WHEN staged_result IS NOT NULL THEN last_error \
                             ELSE 'lease expired before the worker reported' END, \
           run_at = CASE WHEN staged_result IS NULL AND attempts < max_attempts THEN $1 ELSE run_at END, \
           staged_result = NULL, lease_token = NULL, lease_expires_at = NULL, leased_by = NULL, updated_at = $1 \
         WHERE state = 'leased' AND lease_expires_at <= $1",
        params![now],
    )
    .db()?;
    Ok(())
}

pub(crate) fn claim(t: &mut Tx<'_>, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
    sweep_expired(t)?;
    let now = t.now.as_millis();
    let placeholders: String = (0..req.kinds().len())
        .map(|i| format!("${}", i + 3))
        .collect::<Vec<_>>()
        .join(", ");
    let mut values: Vec<duckdb::types::Value> = vec![now.into(), i64::from(req.limit()).into()];
    values.extend(
        req.kinds()
            .iter()
            .map(|k| duckdb::types::Value::Text(k.clone())),
    );
    let ids: Vec<(String, String)> = {
        let mut st = t
            .prepare(&format!(
                "SELECT account, id FROM tasks WHERE state = 'pending' AND run_at <= $1 AND kind IN ({placeholders}) \
                 ORDER BY run_at, seq LIMIT $2"
            ))
            .db()?;
        let rows = st
            .query_map(duckdb::params_from_iter(values), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    let expires = t.now.plus(req.lease_for());
    let mut out = Vec::with_capacity(ids.len());
    for (account, id) in ids {
        let token = LeaseToken::new();
        t.execute(
            "UPDATE tasks SET state = 'leased', attempts = attempts + 1, lease_token = $1, lease_expires_at = $2, \
             leased_by = $3, last_outcome = NULL, updated_at = $4 WHERE account = $5 AND id = $6",
            params![token.to_string(), expires.as_millis(), req.worker(), now, account, id],
        )
        .db()?;
        let (account, task_id) = (AccountId::new(account)?, TaskId::new(id)?);
        let row = scoped(t, &account, &task_id)?;
        out.push(ClaimedTask {
            lease: TaskLease {
                task_id,
                account: row.task.account.clone(),
                token,
                attempt: row.task.attempts,
                expires_at: expires,
            },
            task: row.task,
        });
    }
    Ok(out)
}

pub(crate) fn heartbeat(
    t: &mut Tx<'_>,
    lease: &TaskLease,
    beat: &TaskHeartbeat,
) -> StoreResult<TaskLease> {
    let (lease_for, progress) = (beat.lease_for(), beat.progress());
    let r = scoped(t, &lease.account, &lease.task_id)?;
    r.fence(&lease.token, FencedWrite::Keep { now: t.now })?;
    let expires_at = t.now.plus(lease_for);
    t.execute(
        "UPDATE tasks SET lease_expires_at = $1, updated_at = $2, progress = coalesce($5::VARCHAR, progress) \
         WHERE account = $3 AND id = $4",
        params![
            expires_at.as_millis(),
            t.now.as_millis(),
            lease.account.as_str(),
            lease.task_id.as_str(),
            progress.map(text)
        ],
    )
    .db()?;
    Ok(TaskLease {
        expires_at,
        ..lease.clone()
    })
}

pub(crate) fn stage(
    t: &mut Tx<'_>,
    lease: &TaskLease,
    result: serde_json::Value,
) -> StoreResult<()> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    r.fence(&lease.token, FencedWrite::Within)?;
    t.execute(
        "UPDATE tasks SET staged_result = $1, updated_at = $2 WHERE account = $3 AND id = $4",
        params![
            text(&result),
            t.now.as_millis(),
            lease.account.as_str(),
            lease.task_id.as_str()
        ],
    )
    .db()?;
    Ok(())
}

pub(crate) fn complete(
    t: &mut Tx<'_>,
    lease: &TaskLease,
    result: serde_json::Value,
) -> StoreResult<Task> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    let end = FencedWrite::End { kind: "complete" };
    if r.fence(&lease.token, end)? == Verdict::Repeat {
        return Ok(r.task);
    }
    t.execute(
        "UPDATE tasks SET state = 'completed', result = $1, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'complete', updated_at = $2 WHERE account = $3 AND id = $4",
        params![text(&result), t.now.as_millis(), lease.account.as_str(), lease.task_id.as_str()],
    )
    .db()?;
    get(t, &lease.account, &lease.task_id)
}

pub(crate) fn fail(t: &mut Tx<'_>, lease: &TaskLease, failed: TaskFailed) -> StoreResult<Task> {
    let TaskFailed { error, failure } = failed;
    let r = scoped(t, &lease.account, &lease.task_id)?;
    let Some((state, run_at)) = r.fail_to(&lease.token, failure, t.now, &t.options.workflow)?
    else {
        return Ok(r.task);
    };
    t.execute(
        "UPDATE tasks SET state = $1, run_at = $2, last_error = $3, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'fail', updated_at = $4 WHERE account = $5 AND id = $6",
        params![state.as_str(), run_at.as_millis(), error, t.now.as_millis(), lease.account.as_str(), lease.task_id.as_str()],
    )
    .db()?;
    get(t, &lease.account, &lease.task_id)
}

pub(crate) fn release(t: &mut Tx<'_>, lease: &TaskLease) -> StoreResult<()> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    r.fence(&lease.token, FencedWrite::Within)?;
    t.execute(
        "UPDATE tasks SET state = 'pending', attempts = attempts - 1, run_at = $1, lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, staged_result = NULL, updated_at = $1 WHERE account = $2 AND id = $3",
        params![t.now.as_millis(), lease.account.as_str(), lease.task_id.as_str()],
    )
    .db()?;
    Ok(())
}

pub(crate) fn list(t: &Tx<'_>, req: &TaskListRequest) -> StoreResult<Page<Task>> {
    let (account, page) = (&req.account, req.page);
    let state = control_plane_core::listable(req.state)?;
    let rows: Vec<TaskRow> = {
        let mut st = t
            .prepare(&format!(
                "SELECT {TASK_COLS} FROM tasks WHERE account = $1 AND state = $4 \
                 AND ($2::BIGINT IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3"
            ))
            .db()?;
        let rows = st
            .query_map(
                params![
                    account.as_str(),
                    page.after(),
                    i64::from(page.limit()) + 1,
                    state.as_str()
                ],
                row_to_task,
            )
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    Ok(Page::from_overfetch(rows, page.limit(), |r| r.seq).map(|r| r.task))
}

pub(crate) fn retry_dead(t: &mut Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
    let r = scoped(t, account, id)?;
    if r.task.state != TaskState::DeadLettered {
        return Err(StoreError::Conflict(format!(
            "task {id} is {}; only dead-lettered tasks can be retried",
            r.task.state.as_str()
        )));
    }
    t.execute(
        "UPDATE tasks SET state = 'pending', run_at = $1, max_attempts = attempts + $2, lease_token = NULL, \
         last_outcome = NULL, updated_at = $1 WHERE account = $3 AND id = $4",
        params![t.now.as_millis(), t.options.workflow.max_attempts, account.as_str(), id.as_str()],
    )
    .db()?;
    get(t, account, id)
}

#[async_trait]
impl WorkflowStore for EmbeddedStore {
    async fn workflow_enqueue(
        &self,
        req: Checked<TaskEnqueueRequest>,
    ) -> StoreResult<TaskEnqueued> {
        self.tx(move |t| enqueue(t, req)).await
    }

    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>> {
        self.work_tx(move |t| claim(t, req)).await
    }

    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        beat: TaskHeartbeat,
    ) -> StoreResult<TaskLease> {
        let lease = lease.clone();
        self.work_tx(move |t| heartbeat(t, &lease, &beat)).await
    }

    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()> {
        let lease = lease.clone();
        self.work_tx(move |t| stage(t, &lease, result)).await
    }

    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task> {
        let lease = lease.clone();
        self.work_tx(move |t| complete(t, &lease, result)).await
    }

    async fn workflow_fail(&self, lease: &TaskLease, failed: TaskFailed) -> StoreResult<Task> {
        let lease = lease.clone();
        self.work_tx(move |t| fail(t, &lease, failed)).await
    }

    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()> {
        let lease = lease.clone();
        self.work_tx(move |t| release(t, &lease)).await
    }

    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        let (account, id) = (account.clone(), id.clone());
        self.tx(move |t| get(t, &account, &id)).await
    }

    async fn workflow_list(&self, req: TaskListRequest) -> StoreResult<Page<Task>> {
        self.tx(move |t| list(t, &req)).await
    }

    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
        let (account, id) = (account.clone(), id.clone());
        self.tx(move |t| retry_dead(t, &account, &id)).await
    }
}
