//! Workflow tasks: enqueue, read, dead letters and their retry.

use crate::auth::Caller;

use super::{
    ok, page_request, AccountPath, Answer, ApiError, Check, Deserialize, Duration, IntoParams,
    ItemPath, Json, Listing, PageQuery, Path, Query, Scope, Shared, State, StatusCode,
    TaskEnqueueRequest, TaskId, TaskListRequest, TaskState, TaskView, ToSchema, Value,
};

/// A workflow task to enqueue.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskBody {
    /// Its id, unique in the account; generated when absent. Enqueueing an
    /// id again with the same content is a no-op.
    #[schema(min_length = 1, max_length = 255)]
    id: Option<String>,
    /// What the task runner does with it. Kinds under `control-plane.` are
    /// the service's and refused (`422`), all but `control-plane.publish`
    /// (payload `{"type", "payload"}`: publish that event when due).
    #[schema(min_length = 1, max_length = 255)]
    kind: String,
    #[serde(default)]
    payload: Value,
    /// Runs no sooner than this many seconds from now.
    delay_seconds: Option<u32>,
}

/// Enqueues a workflow task: `201` when new, `200` when the same task
/// was already enqueued.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/tasks",
    tag = "tasks",
    params(AccountPath),
    request_body = TaskBody,
    responses(
        (status = 201, description = "Enqueued", body = TaskView),
        (status = 200, description = "Already enqueued", body = TaskView),
    ),
)]
pub(crate) async fn task_enqueue(
    State(s): Shared,
    Scope(account): Scope,
    Json(body): Json<TaskBody>,
) -> Answer {
    if control_plane_core::task_kind_reserved(&body.kind) {
        return Err(ApiError::invalid(format!(
            "kind {:?} is reserved to the service: kinds under {:?} run through their own \
             routes (erasure, recover); only {:?} may be enqueued here",
            body.kind,
            control_plane_core::SERVICE_TASK_PREFIX,
            control_plane_core::PUBLISH_TASK
        )));
    }
    let task_id = match body.id {
        Some(given) => TaskId::new(given)?,
        None => TaskId::new(uuid::Uuid::new_v4().to_string())?,
    };
    let run_at = body
        .delay_seconds
        .map(|d| s.clock.now().plus(Duration::from_secs(u64::from(d))));
    let enqueued = s
        .store
        .workflow_enqueue(
            TaskEnqueueRequest {
                id: task_id,
                account,
                kind: body.kind,
                payload: body.payload,
                run_at,
            }
            .checked()?,
        )
        .await?;
    let status = if enqueued.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    ok(status, TaskView::from(&enqueued.task))
}

/// One workflow task.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/tasks/{id}",
    tag = "tasks",
    params(ItemPath),
    responses((status = 200, description = "The task", body = TaskView)),
)]
pub(crate) async fn task_get(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let task = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_get(&account, &task).await?;
    ok(StatusCode::OK, TaskView::from(&t))
}

/// The account's dead workflow tasks.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/dead-tasks",
    tag = "tasks",
    params(AccountPath, PageQuery),
    responses((status = 200, description = "One page of dead tasks", body = Listing<TaskView>)),
)]
pub(crate) async fn task_list_dead(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<PageQuery>,
) -> Answer {
    let p = s
        .store
        .workflow_list(TaskListRequest {
            account,
            state: TaskState::DeadLettered,
            page: q.request()?,
        })
        .await?;
    ok(StatusCode::OK, Listing::<TaskView>::of(&p))
}

/// Makes a dead task pending again with a fresh attempt budget.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/tasks/{id}/retry",
    tag = "tasks",
    params(ItemPath),
    responses((status = 200, description = "The task, pending again", body = TaskView)),
)]
pub(crate) async fn task_retry(
    State(s): Shared,
    caller: Caller,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let task = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    // A service kind (an erasure) runs again only when the admin says so.
    if caller != Caller::Admin {
        let found = s.store.workflow_get(&account, &task).await?;
        if control_plane_core::task_kind_reserved(&found.kind) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "task kind {:?} is reserved to the service: only the admin may retry it",
                    found.kind
                ),
            ));
        }
    }
    let t = s.store.workflow_retry_dead(&account, &task).await?;
    ok(StatusCode::OK, TaskView::from(&t))
}

/// Filters of the task listing.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TaskListQuery {
    /// `pending` (waiting to run), `running` (held by a worker's lease) or
    /// `dead` (given up; also at `/dead-tasks`).
    state: String,
    /// Items per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// The account's workflow tasks in one state, newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/tasks",
    tag = "tasks",
    params(AccountPath, TaskListQuery),
    responses((status = 200, description = "One page of tasks", body = Listing<TaskView>)),
)]
pub(crate) async fn task_list(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<TaskListQuery>,
) -> Answer {
    let state = match q.state.as_str() {
        "pending" => TaskState::Pending,
        "running" => TaskState::Leased,
        "dead" => TaskState::DeadLettered,
        other => {
            return Err(ApiError::bad_request(format!(
                "state {other:?}: expected pending, running or dead"
            )))
        }
    };
    let page = page_request(q.limit, q.cursor.as_deref())?;
    let p = s
        .store
        .workflow_list(TaskListRequest {
            account,
            state,
            page,
        })
        .await?;
    ok(StatusCode::OK, Listing::<TaskView>::of(&p))
}
