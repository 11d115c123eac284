//! The workflow handoff queue.

use std::time::Duration;

use control_plane_core::policy::repeat_verdict;
use control_plane_core::{
    AccountId, ClaimedTask, LeaseToken, Page, PageRequest, StoreError, StoreResult, Task,
    TaskClaimRequest, TaskEnqueueRequest, TaskEnqueued, TaskFailure, TaskId, TaskLease, TaskState,
    Timestamp,
};
use duckdb::{params, OptionalExt, Row};

use crate::error::DuckResultExt;
use crate::store::Tx;
use crate::util::{ts, ts_opt};

const TASK_COLS: &str =
    "id, account, kind, payload, state, attempts, max_attempts, run_at, lease_expires_at, \
     last_error, result, created_at, updated_at, seq, lease_token, last_outcome, staged_result";

fn json_col(r: &Row<'_>, i: usize) -> duckdb::Result<Option<serde_json::Value>> {
    let v: Option<String> = r.get(i)?;
    v.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| {
            duckdb::Error::FromSqlConversionFailure(i, duckdb::types::Type::Text, Box::new(e))
        })
}

/// A task row with the columns the port does not show.
struct Row2 {
    task: Task,
    seq: i64,
    token: Option<String>,
    last_outcome: Option<String>,
}

fn row_to_task(r: &Row<'_>) -> duckdb::Result<Row2> {
    let conv = |i: usize, e: StoreError| {
        duckdb::Error::FromSqlConversionFailure(i, duckdb::types::Type::Text, Box::new(e))
    };
    let state: String = r.get(4)?;
    Ok(Row2 {
        task: Task {
            id: TaskId::new(r.get::<_, String>(0)?).map_err(|e| conv(0, e))?,
            account: AccountId::new(r.get::<_, String>(1)?).map_err(|e| conv(1, e))?,
            kind: r.get(2)?,
            payload: json_col(r, 3)?.unwrap_or(serde_json::Value::Null),
            state: state.parse().map_err(|e| conv(4, e))?,
            attempts: r.get(5)?,
            max_attempts: r.get(6)?,
            run_at: ts(r, 7)?,
            lease_expires_at: ts_opt(r, 8)?,
            last_error: r.get(9)?,
            result: json_col(r, 10)?,
            created_at: ts(r, 11)?,
            updated_at: ts(r, 12)?,
        },
        seq: r.get(13)?,
        token: r.get(14)?,
        last_outcome: r.get(15)?,
    })
}

fn find(t: &Tx<'_>, id: &TaskId) -> StoreResult<Option<Row2>> {
    t.query_row(
        &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1"),
        params![id.as_str()],
        row_to_task,
    )
    .optional()
    .db()
}

fn scoped(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Row2> {
    find(t, id)?
        .filter(|r| &r.task.account == account)
        .ok_or_else(|| StoreError::not_found("task", id))
}

pub(crate) fn get(t: &Tx<'_>, account: &AccountId, id: &TaskId) -> StoreResult<Task> {
    Ok(scoped(t, account, id)?.task)
}

fn text(v: &serde_json::Value) -> String {
    v.to_string()
}

pub(crate) fn enqueue(t: &mut Tx<'_>, req: TaskEnqueueRequest) -> StoreResult<TaskEnqueued> {
    req.validate()?;
    if let Some(existing) = find(t, &req.id)? {
        let e = existing.task;
        if e.account != req.account || e.kind != req.kind || e.payload != req.payload {
            return Err(StoreError::Conflict(format!(
                "task {} already exists with a different account, kind or payload",
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
         VALUES ($1, $2, $3, $4, 'pending', 0, $5, $6, $7, $8, $8)",
        params![
            req.id.as_str(),
            req.account.as_str(),
            req.kind,
            text(&req.payload),
            t.options.workflow.max_attempts,
            req.run_at.map_or(now, Timestamp::as_millis),
            seq,
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
    req.validate()?;
    sweep_expired(t)?;
    let now = t.now.as_millis();
    let placeholders: String = (0..req.kinds.len())
        .map(|i| format!("${}", i + 3))
        .collect::<Vec<_>>()
        .join(", ");
    let mut values: Vec<duckdb::types::Value> = vec![now.into(), i64::from(req.limit).into()];
    values.extend(
        req.kinds
            .iter()
            .map(|k| duckdb::types::Value::Text(k.clone())),
    );
    let ids: Vec<String> = {
        let mut st = t
            .prepare(&format!(
                "SELECT id FROM tasks WHERE state = 'pending' AND run_at <= $1 AND kind IN ({placeholders}) \
                 ORDER BY run_at, seq LIMIT $2"
            ))
            .db()?;
        let rows = st
            .query_map(duckdb::params_from_iter(values), |r| r.get(0))
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    let expires = t.now.plus(req.lease_for);
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let token = LeaseToken::new();
        t.execute(
            "UPDATE tasks SET state = 'leased', attempts = attempts + 1, lease_token = $1, lease_expires_at = $2, \
             leased_by = $3, last_outcome = NULL, updated_at = $4 WHERE id = $5",
            params![token.to_string(), expires.as_millis(), req.worker, now, id],
        )
        .db()?;
        let task_id = TaskId::new(id)?;
        let row = find(t, &task_id)?.ok_or_else(|| StoreError::not_found("task", &task_id))?;
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

fn is_live(r: &Row2, lease: &TaskLease) -> bool {
    r.task.state == TaskState::Leased
        && r.token.as_deref() == Some(lease.token.to_string().as_str())
}

fn repeat(r: Row2, lease: &TaskLease, kind: &str) -> StoreResult<Task> {
    let same = r.token.as_deref() == Some(lease.token.to_string().as_str());
    repeat_verdict(same, r.last_outcome.as_deref(), kind)?;
    Ok(r.task)
}

pub(crate) fn heartbeat(
    t: &mut Tx<'_>,
    lease: &TaskLease,
    lease_for: Duration,
) -> StoreResult<TaskLease> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    if !is_live(&r, lease) || r.task.lease_expires_at.is_some_and(|e| e <= t.now) {
        return Err(StoreError::LeaseLost);
    }
    let expires_at = t.now.plus(lease_for);
    t.execute(
        "UPDATE tasks SET lease_expires_at = $1, updated_at = $2 WHERE id = $3",
        params![
            expires_at.as_millis(),
            t.now.as_millis(),
            lease.task_id.as_str()
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
    if !is_live(&r, lease) {
        return Err(StoreError::LeaseLost);
    }
    t.execute(
        "UPDATE tasks SET staged_result = $1, updated_at = $2 WHERE id = $3",
        params![text(&result), t.now.as_millis(), lease.task_id.as_str()],
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
    if !is_live(&r, lease) {
        return repeat(r, lease, "complete");
    }
    t.execute(
        "UPDATE tasks SET state = 'completed', result = $1, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'complete', updated_at = $2 WHERE id = $3",
        params![text(&result), t.now.as_millis(), lease.task_id.as_str()],
    )
    .db()?;
    get(t, &lease.account, &lease.task_id)
}

pub(crate) fn fail(
    t: &mut Tx<'_>,
    lease: &TaskLease,
    error: String,
    failure: TaskFailure,
) -> StoreResult<Task> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    if !is_live(&r, lease) {
        return repeat(r, lease, "fail");
    }
    let dead = failure.dead_letters(r.task.attempts, r.task.max_attempts);
    let (state, run_at) = if dead {
        (TaskState::DeadLettered, r.task.run_at)
    } else {
        (
            TaskState::Pending,
            t.now
                .plus(t.options.workflow.backoff(&r.task.id, r.task.attempts)),
        )
    };
    t.execute(
        "UPDATE tasks SET state = $1, run_at = $2, last_error = $3, staged_result = NULL, lease_expires_at = NULL, \
         leased_by = NULL, last_outcome = 'fail', updated_at = $4 WHERE id = $5",
        params![state.as_str(), run_at.as_millis(), error, t.now.as_millis(), lease.task_id.as_str()],
    )
    .db()?;
    get(t, &lease.account, &lease.task_id)
}

pub(crate) fn release(t: &mut Tx<'_>, lease: &TaskLease) -> StoreResult<()> {
    let r = scoped(t, &lease.account, &lease.task_id)?;
    if !is_live(&r, lease) {
        return Err(StoreError::LeaseLost);
    }
    t.execute(
        "UPDATE tasks SET state = 'pending', attempts = attempts - 1, run_at = $1, lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, staged_result = NULL, updated_at = $1 WHERE id = $2",
        params![t.now.as_millis(), lease.task_id.as_str()],
    )
    .db()?;
    Ok(())
}

pub(crate) fn list_dead(
    t: &Tx<'_>,
    account: &AccountId,
    page: PageRequest,
) -> StoreResult<Page<Task>> {
    page.validate()?;
    let rows: Vec<Row2> = {
        let mut st = t
            .prepare(&format!(
                "SELECT {TASK_COLS} FROM tasks WHERE account = $1 AND state = 'dead_lettered' \
                 AND ($2::BIGINT IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3"
            ))
            .db()?;
        let rows = st
            .query_map(
                params![account.as_str(), page.after, i64::from(page.limit) + 1],
                row_to_task,
            )
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    Ok(Page::from_overfetch(rows, page.limit, |r| r.seq).map(|r| r.task))
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
         last_outcome = NULL, updated_at = $1 WHERE id = $3",
        params![t.now.as_millis(), t.options.workflow.max_attempts, id.as_str()],
    )
    .db()?;
    get(t, account, id)
}
