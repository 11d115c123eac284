//! Recovering an endpoint: every event of a time window it is subscribed to
//! (by its event types and filter, as they are now) that did not reach it
//! delivered to it again, each once per recovery: dead deliveries resent,
//! missing ones created; delivered ones only when asked
//! ([`Recovery::including_delivered`]). It runs as a workflow task of kind
//! [`RECOVER_TASK`] (the API enqueues it, `serve` and `worker` run it), over
//! the port, so it is the same on every adapter.

use serde::{Deserialize, Serialize};

use crate::{
    fan_out, AccountId, ControlPlaneStore, EndpointId, EventListRequest, PageRequest, StoreError,
    StoreResult, Timestamp,
};

/// The task kind of a recovery.
pub const RECOVER_TASK: &str = "control-plane.recover";

/// Events read per page of a recovery.
const PAGE: u32 = 200;

/// What a recovery covers: the task's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recovery {
    /// The endpoint that gets the events again.
    pub endpoint_id: EndpointId,
    /// Events published at or after this time (milliseconds since the epoch).
    pub since_ms: i64,
    /// Events published before this time (milliseconds since the epoch).
    pub until_ms: i64,
    /// Whether deliveries that succeeded are sent again too (the whole
    /// window); by default only what failed or never went is.
    #[serde(default)]
    pub include_delivered: bool,
}

impl Recovery {
    /// A recovery of `endpoint_id` over `[since, until)`.
    ///
    /// # Errors
    /// `InvalidInput` when `since` is not before `until`.
    pub fn new(
        endpoint_id: EndpointId,
        since: Timestamp,
        until: Timestamp,
    ) -> Result<Self, StoreError> {
        if since >= until {
            return Err(StoreError::InvalidInput(format!(
                "since ({}) must be before until ({})",
                since.to_rfc3339(),
                until.to_rfc3339()
            )));
        }
        Ok(Recovery {
            endpoint_id,
            since_ms: since.as_millis(),
            until_ms: until.as_millis(),
            include_delivered: false,
        })
    }

    /// The same window, with the deliveries that succeeded sent again too.
    #[must_use]
    pub fn including_delivered(self) -> Self {
        Recovery {
            include_delivered: true,
            ..self
        }
    }
}

/// What a recovery did: the task's result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// Events of the window read.
    pub events: u64,
    /// Of them, the ones the endpoint is subscribed to.
    pub matched: u64,
    /// Deliveries created (the endpoint had none of that event).
    pub created: u64,
    /// Finished deliveries sent again, under their ids: the dead ones, and
    /// the delivered ones when the recovery includes them.
    pub resent: u64,
    /// Deliveries still pending or leased: they go out anyway.
    pub in_queue: u64,
    /// Deliveries that had succeeded, left as they were (the recovery did
    /// not include them).
    #[serde(default)]
    pub already_delivered: u64,
}

/// Where a recovery has got to: its counts so far, and the page cursor it
/// goes on from (`None`: the first page). Reported as the task's progress
/// after every page, so readers see it move and a run after a crash goes on
/// from the last page reported instead of the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverProgress {
    /// What the pages done so far did.
    #[serde(flatten)]
    pub done: Recovered,
    /// The cursor of the next page.
    pub after: Option<i64>,
}

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
            let about = crate::AlertKind::from_event_type(&event.event_type)
                .and_then(|_| payload["endpoint_id"].as_str())
                .and_then(|s| s.parse().ok());
            if fan_out(endpoints, &event.event_type, &payload, about).is_empty() {
                continue;
            }
            out.matched += 1;
            let q = store
                .delivery_enqueue(crate::EndpointKey::new(account, endpoint.id), event.id)
                .await?;
            if q.won {
                out.created += 1;
                continue;
            }
            if !recovery.include_delivered {
                let d = store.delivery_get(account, q.delivery_id).await?;
                if d.state == crate::DeliveryState::Delivered {
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
