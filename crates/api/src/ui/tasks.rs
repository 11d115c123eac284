//! The dashboard's tasks page: a task looked up by id (its state, progress
//! and result), the dead-lettered tasks, and their retry.

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use axum::Form;
use control_plane_core::{Task, TaskId};
use serde::Deserialize;

use super::html::{base, button, esc, link, notice, segment, table, time, Tab};
use super::pages::{next_link, show, AccountPath, ItemPath, Page, Shared};
use super::{CsrfForm, Session};
use crate::error::ApiError;
use crate::routes::page as page_request;

#[derive(Deserialize)]
pub(crate) struct TaskQuery {
    id: Option<String>,
    cursor: Option<String>,
    retried: Option<u8>,
}

/// A task looked up by id, and the dead-lettered tasks with retry buttons.
pub(crate) async fn tasks(
    State(s): Shared,
    session: Session,
    Path(p): Path<AccountPath>,
    Query(q): Query<TaskQuery>,
) -> Page {
    let account = session.caller.reach(&p.account)?;
    let path = format!("{}/tasks", base(&account));
    let mut body = String::new();
    if q.retried.is_some() {
        body.push_str(&notice("Retried: the task is pending again."));
    }
    let _ = write!(
        body,
        "<form method=\"get\" action=\"{path}\" class=\"inline\">\
         <label for=\"task-id\">Task id</label>\
         <input id=\"task-id\" name=\"id\" value=\"{}\" required>\
         <button type=\"submit\" id=\"find-task\">Find</button></form>",
        esc(q.id.as_deref().unwrap_or(""))
    );
    if let Some(id) = q.id.as_deref().filter(|i| !i.is_empty()) {
        let found = match TaskId::new(id) {
            Ok(tid) => match s.store.workflow_get(&account, &tid).await {
                Ok(t) => Some(t),
                Err(control_plane_core::StoreError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            },
            Err(_) => None,
        };
        body.push_str(&found.as_ref().map_or_else(
            || "<p class=\"empty\" id=\"task\">No task with that id.</p>".to_string(),
            task_facts,
        ));
    }
    let dead = s
        .store
        .workflow_list_dead(&account, page_request(Some(50), q.cursor.as_deref())?)
        .await?;
    let rows: Vec<Vec<String>> = dead
        .items
        .iter()
        .map(|t| {
            let id = segment(t.id.as_str());
            vec![
                link(&format!("{path}?id={id}"), t.id.as_str()),
                esc(&t.kind),
                format!("{} / {}", t.attempts, t.max_attempts),
                esc(t.last_error.as_deref().unwrap_or("")),
                time(t.updated_at),
                button(
                    &format!("{path}/{id}/retry"),
                    &session.csrf,
                    "Retry",
                    &format!("retry-{}", t.id.as_str()),
                ),
            ]
        })
        .collect();
    let _ = write!(
        body,
        "<h2>Dead tasks</h2>{}{}",
        table(
            "dead-tasks",
            &["task", "kind", "attempts", "last error", "died", ""],
            &rows,
            "No dead task."
        ),
        next_link(&path, "", dead.next)
    );
    show("Tasks", &account, Tab::Tasks, &session, &body)
}

/// One task's facts, as the tasks page shows a task found by id.
fn task_facts(t: &Task) -> String {
    format!(
        "<dl class=\"facts\" id=\"task\"><dt>id</dt><dd>{}</dd><dt>kind</dt><dd>{}</dd>\
        <dt>state</dt><dd id=\"task-state\">{}</dd><dt>attempts</dt><dd>{} of {}</dd>\
        <dt>run at</dt><dd>{}</dd><dt>last error</dt><dd>{}</dd>\
        <dt>progress</dt><dd id=\"task-progress\">{}</dd>\
        <dt>result</dt><dd id=\"task-result\">{}</dd></dl>\
        <pre>{}</pre>",
        esc(t.id.as_str()),
        esc(&t.kind),
        esc(t.state.as_str()),
        t.attempts,
        t.max_attempts,
        time(t.run_at),
        esc(t.last_error.as_deref().unwrap_or("")),
        esc(&t
            .progress
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default()),
        esc(&t.result.as_ref().map(|r| r.to_string()).unwrap_or_default()),
        esc(&t.payload.to_string())
    )
}

/// Retries one dead task.
pub(crate) async fn task_retry(
    State(s): Shared,
    session: Session,
    headers: HeaderMap,
    Path(p): Path<ItemPath>,
    Form(form): Form<CsrfForm>,
) -> Page {
    let account = session.act(&headers, &form.csrf, &p.account)?;
    let id = TaskId::new(p.id).map_err(|_| ApiError::not_found("task"))?;
    let t = s.store.workflow_retry_dead(&account, &id).await?;
    Ok(Redirect::to(&format!(
        "{}/tasks?id={}&retried=1",
        base(&account),
        segment(t.id.as_str())
    ))
    .into_response())
}
