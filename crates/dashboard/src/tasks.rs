//! The tasks page: a task looked up by id (its state, progress and result),
//! the tasks of one state (dead-lettered by default, with their retry;
//! pending; running).

use api::query;
use api::ApiError;
use axum::extract::{Path, Query, State};
use control_plane_core::{
    Recovery, Task, TaskId, TaskListRequest, TaskState, Timestamp, RECOVER_TASK,
};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{
    base, button, endpoint_href, link, next_link, notice, segment, table, time, Tab,
};
use crate::pages::show;
use crate::session::{AccountPage, Action, CsrfForm};
use crate::Page;
use crate::{to, ItemPath, Shared};

#[derive(Deserialize)]
pub(crate) struct TaskQuery {
    id: Option<String>,
    cursor: Option<String>,
    retried: Option<u8>,
    /// `pending`, `running` or `dead` (the default).
    state: Option<String>,
}

/// A task looked up by id, and the dead-lettered tasks with retry buttons.
pub(crate) async fn tasks(
    State(s): Shared,
    AccountPage { session, account }: AccountPage,
    Query(q): Query<TaskQuery>,
) -> Page {
    let path = format!("{}/tasks", base(&account));
    let wanted = q.id.as_deref().filter(|i| !i.is_empty());
    let found = match wanted {
        Some(id) => query::find_task(s.store(), &account, id).await?,
        None => None,
    };
    let (shown, state) = listed_state(q.state.as_deref())?;
    let dead = s
        .store()
        .workflow_list(TaskListRequest {
            account: account.clone(),
            state,
            page: query::page_request(Some(50), q.cursor.as_deref())?,
        })
        .await?;
    let rows: Vec<Vec<Markup>> = dead
        .items
        .iter()
        .map(|t| {
            let id = segment(t.id.as_str());
            vec![
                link(&format!("{path}?id={id}"), t.id.as_str()),
                html! { (t.kind) },
                html! { (t.attempts) " / " (t.max_attempts) },
                html! { (t.last_error.as_deref().unwrap_or("")) },
                html! { (time(t.updated_at)) },
                if state == TaskState::DeadLettered {
                    button(
                        &format!("{path}/{id}/retry"),
                        &session.csrf,
                        "Retry",
                        &format!("retry-{}", t.id.as_str()),
                    )
                } else {
                    html! {}
                },
            ]
        })
        .collect();
    let body = html! {
        @if q.retried.is_some() {
            (notice("Retried: the task is pending again."))
        }
        form.inline method="get" action=(path) {
            label for="task-id" { "Task id" }
            input id="task-id" name="id" value=(q.id.as_deref().unwrap_or("")) required;
            button type="submit" id="find-task" { "Find" }
        }
        @if wanted.is_some() {
            @match &found {
                Some(t) => { (task_facts(t)) }
                None => { p.empty id="task" { "No task with that id." } }
            }
        }
        p.filters {
            @for st in ["pending", "running", "dead"] {
                " " (link(&format!("{path}?state={st}"), st))
            }
        }
        @if state == TaskState::DeadLettered {
            h2 { "Dead tasks" }
            (table("dead-tasks", &["task", "kind", "attempts", "last error", "died", ""], &rows,
                "No dead task."))
        } @else {
            h2 { (if shown == "pending" { "Pending tasks" } else { "Running tasks" }) }
            (table(&format!("{shown}-tasks"), &["task", "kind", "attempts", "last error", "updated", ""],
                &rows, &format!("No {shown} task.")))
        }
        (next_link(&path, &format!("&state={shown}"), dead.next))
    };
    show("Tasks", &account, Tab::Tasks, &session, &body)
}

/// The state the page lists, by its name there: dead by default.
fn listed_state(given: Option<&str>) -> Result<(&'static str, TaskState), ApiError> {
    match given.unwrap_or("dead") {
        "pending" => Ok(("pending", TaskState::Pending)),
        "running" => Ok(("running", TaskState::Leased)),
        "dead" => Ok(("dead", TaskState::DeadLettered)),
        _ => Err(ApiError::bad_request(
            "state: expected pending, running or dead",
        )),
    }
}

/// One task's facts, as the tasks page shows a task found by id.
fn task_facts(t: &Task) -> Markup {
    let json = |v: Option<&serde_json::Value>| v.map(ToString::to_string).unwrap_or_default();
    html! {
        dl.facts id="task" {
            dt { "id" } dd { (t.id.as_str()) }
            dt { "kind" } dd { (t.kind) }
            dt { "state" } dd id="task-state" { (t.state.as_str()) }
            dt { "attempts" } dd { (t.attempts) " of " (t.max_attempts) }
            dt { "run at" } dd { (time(t.run_at)) }
            dt { "last error" } dd { (t.last_error.as_deref().unwrap_or("")) }
            dt { "progress" } dd id="task-progress" { (json(t.progress.as_ref())) }
            dt { "result" } dd id="task-result" { (json(t.result.as_ref())) }
        }
        @if let Some(r) = recovery(t) {
            p id="task-summary" {
                "Recovers endpoint "
                a href=(endpoint_href(&t.account, &r.endpoint_id.to_string())) { (r.endpoint_id) }
                ": events published from " (time(Timestamp::from_millis(r.since_ms)))
                " to " (time(Timestamp::from_millis(r.until_ms)))
                @if r.include_delivered { ", delivered ones too" } @else { ", what failed or never went" }
                "."
            }
        }
        pre { (t.payload) }
    }
}

/// The recovery a task of the recover kind carries (its times are epoch
/// milliseconds in the payload; the page shows them as times).
fn recovery(t: &Task) -> Option<Recovery> {
    (t.kind == RECOVER_TASK)
        .then(|| serde_json::from_value(t.payload.clone()).ok())
        .flatten()
}

/// Retries one dead task.
pub(crate) async fn task_retry(
    State(s): Shared,
    Path(p): Path<ItemPath>,
    Action { account, .. }: Action<CsrfForm>,
) -> Page {
    let id = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store().workflow_retry_dead(&account, &id).await?;
    to(&format!(
        "{}/tasks?id={}&retried=1",
        base(&account),
        segment(t.id.as_str())
    ))
}
