//! Recovering an endpoint: every event of a time window it is subscribed to
//! (by its event types and filter, as they are now) that did not reach it
//! delivered to it again, each once per recovery: dead deliveries resent,
//! missing ones created; delivered ones only when asked
//! ([`Recovery::including_delivered`]). It runs as a workflow task of kind
//! [`RECOVER_TASK`] (the API enqueues it, `serve` and `worker` run it
//! through `control_plane_runtime::recover`), over the port, so it is the
//! same on every adapter. Here: what it covers and what it reports.

use serde::{Deserialize, Serialize};

use crate::{EndpointId, StoreError, Timestamp};

/// The task kind of a recovery.
pub const RECOVER_TASK: &str = "control-plane.recover";

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
