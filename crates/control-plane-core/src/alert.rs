//! Operational alerts.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::*;

/// The kind of an operational alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AlertKind {
    /// An endpoint was disabled by the store (410, failing window).
    #[serde(rename = "endpoint.disabled")]
    EndpointDisabled,
    /// A delivery went dead.
    #[serde(rename = "delivery.dead")]
    DeliveryDead,
    /// A circuit opened.
    #[serde(rename = "circuit.opened")]
    CircuitOpened,
    /// A circuit closed.
    #[serde(rename = "circuit.closed")]
    CircuitClosed,
}

impl AlertKind {
    /// The event type name, e.g. `circuit.opened`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::EndpointDisabled => "endpoint.disabled",
            AlertKind::DeliveryDead => "delivery.dead",
            AlertKind::CircuitOpened => "circuit.opened",
            AlertKind::CircuitClosed => "circuit.closed",
        }
    }
}

impl AlertKind {
    /// Every kind.
    pub const ALL: [AlertKind; 4] = [
        AlertKind::EndpointDisabled,
        AlertKind::DeliveryDead,
        AlertKind::CircuitOpened,
        AlertKind::CircuitClosed,
    ];

    /// The kind whose event type is `event_type`, if it is one.
    pub fn from_event_type(event_type: &str) -> Option<AlertKind> {
        AlertKind::ALL
            .into_iter()
            .find(|k| k.as_str() == event_type)
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
        }
    }
}

impl FromStr for AlertKind {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "endpoint.disabled" => Ok(AlertKind::EndpointDisabled),
            "delivery.dead" => Ok(AlertKind::DeliveryDead),
            "circuit.opened" => Ok(AlertKind::CircuitOpened),
            "circuit.closed" => Ok(AlertKind::CircuitClosed),
            _ => Err(StoreError::Backend(format!("unknown alert kind {s:?}"))),
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
