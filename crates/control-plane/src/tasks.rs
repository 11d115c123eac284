//! The workflow task kinds the service runs itself: a publish later
//! (`control-plane.publish`), an endpoint's recovery
//! (`control-plane.recover`, `control_plane_core::recover`) and an
//! account's erasure (`control-plane.erase`, `control_plane_core::erase`).

use std::sync::Arc;

use control_plane_core::{
    Check, DynControlPlaneStore, ErasureProgress, PublishRequest, RecoverProgress, Recovery,
    StoreError, TaskId, UsageMetric, ERASE_TASK, RECOVER_TASK,
};
use control_plane_runtime::{erase, recover, UsageMeter};
use dispatcher::{TaskError, TaskRunner, TaskRunnerConfig};
use sha2::{Digest, Sha256};

/// The task kind the service runs itself: publish an event later. The
/// payload is `{"type", "payload"}`; the task id is the idempotency key, so a
/// rerun after a crash never publishes twice.
pub use control_plane_core::PUBLISH_TASK;

/// The idempotency key of a publish task's event: `task:` and the task id,
/// or, for an id too long for a key (over 250 characters), `task-sha256:` and
/// the id's hash, so every valid task id publishes at most once.
fn publish_key(id: &TaskId) -> String {
    let key = format!("task:{}", id.as_str());
    if key.len() <= 255 {
        key
    } else {
        format!("task-sha256:{:x}", Sha256::digest(id.as_str().as_bytes()))
    }
}

/// The workflow runner with the service's own handlers.
pub fn task_runner(store: DynControlPlaneStore, usage: Arc<UsageMeter>) -> TaskRunner {
    let mut runner = TaskRunner::new(
        store.clone(),
        TaskRunnerConfig {
            worker: format!("control-plane-{}", std::process::id()),
            ..TaskRunnerConfig::default()
        },
    );
    let recovering = store.clone();
    register_erase(&mut runner, store.clone());
    runner.register(PUBLISH_TASK, move |task| {
        let store = store.clone();
        let usage = usage.clone();
        async move {
            let event_type = task.payload["type"]
                .as_str()
                .ok_or_else(|| TaskError::fatal("the payload needs a string \"type\""))?
                .to_string();
            let req = PublishRequest {
                account: task.account.clone(),
                event_type,
                payload: task.payload["payload"].clone(),
                idempotency_key: Some(publish_key(&task.id)),
                traceparent: None,
            }
            .checked()
            .map_err(|e| task_error(&e))?;
            match store.event_publish(req).await {
                Ok(p) => {
                    if p.created {
                        usage.add(&task.account, UsageMetric::EventsPublished, 1);
                    }
                    Ok(serde_json::json!({
                    "event_id": p.event.id,
                        "deliveries": p.deliveries.len(),
                    }))
                }
                Err(e) => Err(task_error(&e)),
            }
        }
    });
    runner.register_with_progress(RECOVER_TASK, move |task, progress| {
        let store = recovering.clone();
        async move {
            let recovery: Recovery = serde_json::from_value(task.payload.clone())
                .map_err(|e| TaskError::fatal(format!("the payload is not a recovery ({e})")))?;
            // A run after a crash or a retried failure goes on from the last
            // page it reported.
            let from = task
                .progress
                .and_then(|p| serde_json::from_value::<RecoverProgress>(p).ok());
            let report = |at: &RecoverProgress| {
                if let Ok(v) = serde_json::to_value(at) {
                    progress.report(v);
                }
            };
            let done = recover(store.as_ref(), &task.account, &recovery, from, report)
                .await
                .map_err(|e| task_error(&e))?;
            tracing::info!(account = %task.account, task = %task.id, ?done, "endpoint recovered");
            serde_json::to_value(done).map_err(|e| TaskError::fatal(e.to_string()))
        }
    });
    runner
}

/// Registers the erasure of an account ([`erase`]): resumable from its
/// last reported progress, its result the final count.
fn register_erase(runner: &mut TaskRunner, store: DynControlPlaneStore) {
    runner.register_with_progress(ERASE_TASK, move |task, progress| {
        let store = store.clone();
        async move {
            // A run after a crash goes on counting from its last report.
            let from = task
                .progress
                .and_then(|p| serde_json::from_value::<ErasureProgress>(p).ok());
            let report = |at: &ErasureProgress| {
                if let Ok(v) = serde_json::to_value(at) {
                    progress.report(v);
                }
            };
            let done = erase(store.as_ref(), &task.account, from, report)
                .await
                .map_err(|e| task_error(&e))?;
            tracing::info!(account = %task.account, task = %task.id, ?done, "account erased");
            serde_json::to_value(done).map_err(|e| TaskError::fatal(e.to_string()))
        }
    });
}

/// A store error as a task failure: retried when the store says so.
fn task_error(e: &StoreError) -> TaskError {
    if e.is_retryable() {
        TaskError::retry(e.to_string())
    } else {
        TaskError::fatal(e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
mod tests {
    use std::time::Duration;

    use control_plane_core::{Clock, SystemClock};
    use tokio_util::sync::CancellationToken;

    use super::*;

    #[cfg(feature = "embedded")]
    use crate::service::tests::embedded_store;

    /// An embedded store in `dir` with one endpoint of account `a`.
    #[cfg(feature = "embedded")]
    async fn store_with_endpoint(
        dir: &std::path::Path,
    ) -> (
        DynControlPlaneStore,
        control_plane_core::AccountId,
        control_plane_core::Endpoint,
    ) {
        use control_plane_core::{AccountId, EndpointCreateRequest, Secret};
        let store = embedded_store(dir).await;
        let account = AccountId::new("a").unwrap();
        let req = EndpointCreateRequest::new(
            account.clone(),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        let e = store.endpoint_create(req.checked().unwrap()).await.unwrap();
        (store, account, e)
    }

    /// Enqueues `tasks` (id, kind, payload) for `account`, runs the
    /// service's task runner until every one of them has ended, and returns
    /// them as they ended.
    #[cfg(feature = "embedded")]
    async fn run_to_the_end(
        store: &DynControlPlaneStore,
        usage: Arc<UsageMeter>,
        account: &control_plane_core::AccountId,
        tasks: Vec<(control_plane_core::TaskId, &str, serde_json::Value)>,
    ) -> Vec<control_plane_core::Task> {
        use control_plane_core::{TaskEnqueueRequest, TaskState};
        for (id, kind, payload) in &tasks {
            let req = TaskEnqueueRequest {
                id: id.clone(),
                account: account.clone(),
                kind: (*kind).into(),
                payload: payload.clone(),
                run_at: None,
            };
            store
                .workflow_enqueue(req.checked().unwrap())
                .await
                .unwrap();
        }
        let stop = CancellationToken::new();
        let runner = task_runner(store.clone(), usage);
        let run = tokio::spawn({
            let stop = stop.clone();
            async move { runner.run(stop).await }
        });
        let ended = async {
            loop {
                let mut now = Vec::new();
                for (id, _, _) in &tasks {
                    now.push(store.workflow_get(account, id).await.unwrap());
                }
                if now
                    .iter()
                    .all(|t| t.state != TaskState::Pending && t.state != TaskState::Leased)
                {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let ended = tokio::time::timeout(Duration::from_secs(20), ended)
            .await
            .expect("every task ends");
        stop.cancel();
        run.await.unwrap();
        ended
    }

    /// The service's publish task: an id of the longest valid length still
    /// publishes (its key fits), exactly once; an operational event type is
    /// refused as fatal, publishing nothing.
    #[cfg(feature = "embedded")]
    #[tokio::test]
    async fn the_publish_task_publishes_once_and_never_an_operational_type() {
        use control_plane_core::{EventListRequest, PageRequest, TaskId, TaskState};
        let dir = tempfile::tempdir().unwrap();
        let (store, account, _) = store_with_endpoint(dir.path()).await;
        let long = TaskId::new("t".repeat(255)).unwrap();
        let reserved = TaskId::new("reserved").unwrap();
        let usage = Arc::new(UsageMeter::default());
        let task = |id: &TaskId, event_type: &str| {
            let payload = serde_json::json!({"type": event_type, "payload": {"n": 1}});
            (id.clone(), PUBLISH_TASK, payload)
        };
        let ended = run_to_the_end(
            &store,
            usage.clone(),
            &account,
            vec![task(&long, "order.paid"), task(&reserved, "delivery.dead")],
        )
        .await;
        let states = (ended[0].state, ended[1].state);
        assert_eq!(states, (TaskState::Completed, TaskState::DeadLettered));
        let events = store
            .event_list(EventListRequest {
                account: account.clone(),
                event_type: None,
                since: None,
                until: None,
                page: PageRequest::first(10),
            })
            .await
            .unwrap();
        let types: Vec<&str> = events.items.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(types, ["order.paid"]);
        usage
            .flush(store.as_ref(), SystemClock.now())
            .await
            .unwrap();
        let counted = store
            .usage_query(
                &account,
                control_plane_core::TimeRange {
                    from: SystemClock.now().minus(Duration::from_secs(7200)),
                    to: SystemClock.now().plus(Duration::from_secs(3600)),
                },
            )
            .await
            .unwrap();
        let published: u64 = counted
            .iter()
            .filter(|c| c.metric == UsageMetric::EventsPublished)
            .map(|c| c.amount)
            .sum();
        assert_eq!(
            published, 1,
            "the task's event is metered like an API publish"
        );
        // The long id's key is stable and fits; another id has another key.
        let key = publish_key(&long);
        assert!(key.len() <= 255, "{key}");
        assert_eq!(key, publish_key(&long));
        assert_ne!(key, publish_key(&TaskId::new("u".repeat(255)).unwrap()));
    }

    /// The recover task of a whole window resends a delivered delivery and
    /// reports what it did as its result; a payload that is not a recovery
    /// dead-letters at once.
    #[cfg(feature = "embedded")]
    #[tokio::test]
    async fn the_recover_task_resends_its_window_and_reports() {
        use control_plane_core::{
            AttemptReport, ClaimRequest, DeliveryOutcome, DeliveryState, TaskState,
        };
        let dir = tempfile::tempdir().unwrap();
        let (store, account, e) = store_with_endpoint(dir.path()).await;
        let since = SystemClock.now();
        let p = store
            .event_publish(
                PublishRequest::new(account.clone(), "order.paid", serde_json::json!({"n": 1}))
                    .checked()
                    .unwrap(),
            )
            .await
            .unwrap();
        let c = store
            .delivery_claim(ClaimRequest::new("w", 1, Duration::from_secs(30)).unwrap())
            .await
            .unwrap();
        let ok = DeliveryOutcome::Delivered(AttemptReport {
            status_code: Some(200),
            error: None,
            latency_ms: 1,
            response_body: None,
        });
        store
            .delivery_record_outcome(&c[0].lease, ok)
            .await
            .unwrap();
        // The whole window (the task's payload carries the choice): the
        // delivered one is sent again.
        let recovery = Recovery::new(e.id, since, SystemClock.now().plus(Duration::from_secs(1)))
            .unwrap()
            .including_delivered();
        let (good, bad) = (TaskId::new("r1").unwrap(), TaskId::new("r2").unwrap());
        let ended = run_to_the_end(
            &store,
            Arc::new(UsageMeter::default()),
            &account,
            vec![
                (good, RECOVER_TASK, serde_json::to_value(&recovery).unwrap()),
                (bad, RECOVER_TASK, serde_json::json!({"endpoint": "nope"})),
            ],
        )
        .await;
        let (a, b) = (&ended[0], &ended[1]);
        assert_eq!(a.state, TaskState::Completed, "{a:?}");
        assert_eq!(
            a.result,
            Some(
                serde_json::json!({"events": 1, "matched": 1, "created": 0, "resent": 1, "in_queue": 0, "already_delivered": 0})
            )
        );
        assert_eq!(b.state, TaskState::DeadLettered, "{b:?}");
        let d = store.delivery_get(&account, p.deliveries[0]).await.unwrap();
        assert_eq!(d.state, DeliveryState::Pending, "resent");
    }

    /// The service's erase task removes the account's endpoint and event,
    /// completes with its count, and stays as the one row of the account.
    #[cfg(feature = "embedded")]
    #[tokio::test]
    async fn the_erase_task_removes_the_account_and_reports() {
        use control_plane_core::{PublishRequest, TaskId, TaskState};
        let dir = tempfile::tempdir().unwrap();
        let (store, account, _) = store_with_endpoint(dir.path()).await;
        let publish = PublishRequest::new(account.clone(), "order.paid", serde_json::json!(1));
        store
            .event_publish(publish.checked().unwrap())
            .await
            .unwrap();
        let id = TaskId::new("erase-1").unwrap();
        let usage = Arc::new(UsageMeter::default());
        let task = (id.clone(), ERASE_TASK, serde_json::json!({}));
        let ended = run_to_the_end(&store, usage, &account, vec![task]).await;
        assert_eq!(ended[0].state, TaskState::Completed, "{:?}", ended[0]);
        let result: ErasureProgress =
            serde_json::from_value(ended[0].result.clone().unwrap()).unwrap();
        assert!(result.done && result.rows_removed >= 3, "{result:?}");
        assert!(store.endpoint_list(&account).await.unwrap().is_empty());
        assert!(
            store.workflow_get(&account, &id).await.is_ok(),
            "the task stays"
        );
    }

    /// Usage metered just before an erasure (by a process whose usage loop
    /// writes it a moment later) is erased too, not written after the
    /// erasure reports done.
    #[tokio::test]
    async fn usage_metered_just_before_an_erasure_is_erased_with_it() {
        use control_plane_core::{TaskId, TaskState, TimeRange, Timestamp, UsageMetric};
        let dir = tempfile::tempdir().unwrap();
        let (store, account, _) = store_with_endpoint(dir.path()).await;
        let api_usage = Arc::new(UsageMeter::default());
        api_usage.add(&account, UsageMetric::EventsPublished, 5);
        // The API process's usage loop writes it half a second later.
        let stop = CancellationToken::new();
        let writer = tokio::spawn({
            let (store, usage, stop) = (store.clone(), api_usage.clone(), stop.clone());
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                crate::loops::usage_loop(store, usage, stop).await;
            }
        });
        let id = TaskId::new("erase-usage").unwrap();
        let task = (id, ERASE_TASK, serde_json::json!({}));
        let worker_usage = Arc::new(UsageMeter::default());
        let ended = run_to_the_end(&store, worker_usage, &account, vec![task]).await;
        assert_eq!(ended[0].state, TaskState::Completed, "{:?}", ended[0]);
        stop.cancel();
        writer.await.unwrap();
        let window = TimeRange {
            from: Timestamp::from_millis(0),
            to: SystemClock.now().plus(std::time::Duration::from_secs(7200)),
        };
        assert!(
            store
                .usage_query(&account, window)
                .await
                .unwrap()
                .is_empty(),
            "no usage of the erased account is left"
        );
    }
}
