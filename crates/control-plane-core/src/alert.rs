//! Operational alerts.

use crate::{AccountId, DeliveryId, EndpointId, PublishRequest, Timestamp};

named_enum! {
    /// The kind of an operational alert.
    pub enum AlertKind ("alert kind") {
        /// An endpoint was disabled by the store (410, failing window).
        EndpointDisabled = "endpoint.disabled",
        /// A delivery went dead.
        DeliveryDead = "delivery.dead",
        /// A circuit opened.
        CircuitOpened = "circuit.opened",
        /// A circuit closed.
        CircuitClosed = "circuit.closed",
    }
}

impl AlertKind {
    /// The kind whose event type is `event_type`, if it is one.
    pub fn from_event_type(event_type: &str) -> Option<AlertKind> {
        event_type.parse().ok()
    }
}

/// An alert a transition raises, before the store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewAlert {
    /// Account.
    pub account: AccountId,
    /// Kind.
    pub kind: AlertKind,
    /// The endpoint concerned.
    pub endpoint_id: EndpointId,
    /// The delivery concerned (dead letters only).
    pub delivery_id: Option<DeliveryId>,
    /// What happened, for a person.
    pub message: String,
}

impl NewAlert {
    /// The event that publishes the alert to the account's endpoints (see
    /// [`crate::fan_out`] for who receives it). Its payload names the
    /// endpoint, the delivery when there is one, and the message.
    pub fn event(&self) -> PublishRequest {
        PublishRequest {
            account: self.account.clone(),
            event_type: self.kind.as_str().to_string(),
            payload: serde_json::json!({
                "endpoint_id": self.endpoint_id.to_string(),
                "delivery_id": self.delivery_id.map(|d| d.to_string()),
                "message": self.message,
            }),
            idempotency_key: None,
            traceparent: None,
        }
    }
}

/// An operational event, recorded in the transaction that caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// Position, increasing.
    pub id: i64,
    /// Account.
    pub account: AccountId,
    /// Kind.
    pub kind: AlertKind,
    /// The endpoint concerned.
    pub endpoint_id: EndpointId,
    /// The delivery concerned, if any.
    pub delivery_id: Option<DeliveryId>,
    /// Human-readable detail.
    pub message: String,
    /// When.
    pub created_at: Timestamp,
}
