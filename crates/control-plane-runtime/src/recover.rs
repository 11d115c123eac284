//! Recovering an endpoint: the use case ([`recover`]) and, so that it can
//! be read from here, where each of its parts lives.
//!
//! - Asked for with `POST /v1/accounts/{account}/endpoints/{id}/recover`
//!   (`crates/api/src/routes/endpoints.rs`) or the dashboard's form
//!   (`crates/dashboard/src/recover.rs`), which queue a task of kind
//!   [`control_plane_core::RECOVER_TASK`] with the [`Recovery`] as payload.
//! - Run by that task, which the binary registers
//!   (`crates/control-plane/src/tasks.rs`): it calls [`recover`] and keeps
//!   its [`RecoverProgress`] as the task's progress.
//! - Over the port's ordinary calls (`event_list`, `delivery_enqueue`,
//!   `delivery_resend`): no adapter code of its own.
//! - Held by the contracts `recovering_an_endpoint_sends_its_window_again_once`
//!   and `a_recovery_goes_on_from_its_last_reported_page`
//!   (`crates/control-plane-conformance/src/contracts/history.rs`).

use control_plane_core::{
    fan_out, AccountId, AlertKind, ControlPlaneStore, DeliveryState, EndpointKey, EventListRequest,
    PageRequest, RecoverProgress, Recovered, Recovery, StoreError, StoreResult, Timestamp,
};

/// Events read per page of a recovery.
const PAGE: u32 = 200;

/// Runs `recovery` for `account`: pages through the window's events, newest
/// first, and for each one the endpoint is subscribed to creates its
/// delivery, or resends a dead one (`delivery_resend`), or leaves a pending
/// or leased one as it is; a delivered one is left too, unless the recovery
/// includes delivered ones, which are resent. It starts from `from` (a run cut short
/// goes on where it was, see [`RecoverProgress`]) and calls `report` after
/// each page. Rerun after a crash, it creates nothing twice
/// (`delivery_enqueue` is insert-wins) and resends again at most what the
/// page in progress resent.
///
/// # Errors
/// `NotFound` for an endpoint that is not live; what the store returns.
pub async fn recover(
    store: &dyn ControlPlaneStore,
    account: &AccountId,
    recovery: &Recovery,
    from: Option<RecoverProgress>,
    mut report: impl FnMut(&RecoverProgress) + Send,
) -> StoreResult<Recovered> {
    let endpoint = store.endpoint_get(account, recovery.endpoint_id).await?;
    let endpoints = std::slice::from_ref(&endpoint);
    let mut at = from.unwrap_or_default();
    loop {
        let events = store
            .event_list(EventListRequest {
                account: account.clone(),
                event_type: None,
                since: Some(Timestamp::from_millis(recovery.since_ms)),
                until: Some(Timestamp::from_millis(recovery.until_ms)),
                page: PageRequest::new(PAGE, at.after)?,
            })
            .await?;
        let mut out = at.done;
        for event in &events.items {
            out.events += 1;
            // An example went to the endpoint it was sent to, and to no other.
            if event.example {
                continue;
            }
            let payload = serde_json::from_str::<serde_json::Value>(&event.body)
                .map(|mut body| body["data"].take())
                .unwrap_or_default();
            // An operational event never goes to the endpoint it is about
            // (as at publish).
            let about = AlertKind::from_event_type(&event.event_type)
                .and_then(|_| payload["endpoint_id"].as_str())
                .and_then(|s| s.parse().ok());
            if fan_out(endpoints, &event.event_type, &payload, about).is_empty() {
                continue;
            }
            out.matched += 1;
            let q = store
                .delivery_enqueue(EndpointKey::new(account, endpoint.id), event.id)
                .await?;
            if q.won {
                out.created += 1;
                continue;
            }
            if !recovery.include_delivered {
                let d = store.delivery_get(account, q.delivery_id).await?;
                if d.state == DeliveryState::Delivered {
                    out.already_delivered += 1;
                    continue;
                }
            }
            match store.delivery_resend(account, q.delivery_id).await {
                Ok(_) => out.resent += 1,
                Err(StoreError::Conflict(_)) => out.in_queue += 1,
                Err(e) => return Err(e),
            }
        }
        at = RecoverProgress {
            done: out,
            after: events.next,
        };
        if events.next.is_none() {
            return Ok(out);
        }
        report(&at);
    }
}
