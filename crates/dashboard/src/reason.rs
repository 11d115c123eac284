//! Why a delivery is where it is (issue 75): a pending delivery is held by
//! a disabled endpoint, an open or half-open circuit, the endpoint's
//! in-flight cap, its order or its rate limit, or backs off until its next
//! attempt. Derived here, in one pure function, from what the query layer
//! read (`api::query::Flow`): the endpoint, its circuit and its deliveries
//! in flight; the store keeps no reason of its own.

use api::query::Flow;
use control_plane_core::{Circuit, CircuitMode, Delivery, DeliveryState, Endpoint, Timestamp};

/// How a state looks: its class on the page (colour and weight, always
/// with its text beside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tone {
    /// Delivered.
    Good,
    /// Leased: being sent.
    Busy,
    /// Waiting its turn or its next attempt: nothing is wrong yet.
    Waiting,
    /// Held by something an operator may have to act on.
    Held,
    /// Dead.
    Bad,
}

impl Tone {
    /// The CSS class of the state's badge.
    pub(crate) fn class(self) -> &'static str {
        match self {
            Tone::Good => "st st-good",
            Tone::Busy => "st st-busy",
            Tone::Waiting => "st st-wait",
            Tone::Held => "st st-held",
            Tone::Bad => "st st-bad",
        }
    }
}

/// A delivery's state as an operator reads it: a word, its tone, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Why {
    /// The word of the badge: the state, or `held` for a pending delivery
    /// that something holds back.
    pub(crate) label: &'static str,
    /// How the badge looks.
    pub(crate) tone: Tone,
    /// What holds it or what happens next (empty when there is nothing to
    /// say).
    pub(crate) text: String,
    /// The time the reason ends at, shown relative and absolute.
    pub(crate) until: Option<Timestamp>,
}

impl Why {
    fn new(label: &'static str, tone: Tone, text: impl Into<String>) -> Why {
        Why {
            label,
            tone,
            text: text.into(),
            until: None,
        }
    }

    fn until(self, t: Option<Timestamp>) -> Why {
        Why { until: t, ..self }
    }
}

/// How long past its due time a delivery of a rate-limited endpoint must
/// wait before the page blames the rate limit rather than the workers.
const PACED_AFTER_MS: i64 = 2_000;

/// Why `d` is in its state at `now`, given its endpoint's flow.
pub(crate) fn why(d: &Delivery, flow: &Flow, now: Timestamp) -> Why {
    match d.state {
        DeliveryState::Delivered => Why::new("delivered", Tone::Good, ""),
        DeliveryState::Dead => Why::new(
            "dead",
            Tone::Bad,
            match (&d.last_error, flow.endpoint(d.endpoint_id)) {
                (_, None) => "its endpoint was deleted".to_string(),
                (Some(e), _) => format!("gave up after {} attempts: {e}", d.attempts),
                (None, _) => format!("gave up after {} attempts", d.attempts),
            },
        ),
        DeliveryState::Leased => Why::new(
            "sending",
            Tone::Busy,
            format!("attempt {} of {} in flight", d.attempts, d.max_attempts),
        )
        .until(d.lease_expires_at),
        DeliveryState::Pending => pending(d, flow, now),
    }
}

/// Why a pending delivery has not gone yet, the first reason that holds in
/// the order the claim checks them.
fn pending(d: &Delivery, flow: &Flow, now: Timestamp) -> Why {
    let Some(e) = flow.endpoint(d.endpoint_id) else {
        return Why::new("held", Tone::Held, "its endpoint was deleted");
    };
    if !e.enabled {
        let reason = e.disabled_reason.as_deref().unwrap_or("no reason given");
        return Why::new("held", Tone::Held, format!("endpoint disabled: {reason}"));
    }
    if e.is_poll() {
        return Why::new(
            "pending",
            Tone::Waiting,
            "waiting for its consumer to read it (poll endpoint)",
        );
    }
    let circuit = flow.circuit(d.endpoint_id);
    match circuit.mode {
        CircuitMode::Open => {
            let text = match circuit.open_until {
                Some(t) if t > now => "circuit open: next probe".to_string(),
                _ => "circuit open: a probe is due now".to_string(),
            };
            return Why::new("held", Tone::Held, text)
                .until(circuit.open_until.filter(|t| *t > now));
        }
        CircuitMode::HalfOpen if circuit.probe != Some(d.id) => {
            return Why::new(
                "held",
                Tone::Held,
                "circuit half-open: waiting for its probe's answer",
            );
        }
        _ => {}
    }
    if d.due_at > now {
        let text = if d.attempts == 0 {
            "scheduled".to_string()
        } else {
            format!(
                "backing off after attempt {} of {}: next attempt",
                d.attempts, d.max_attempts
            )
        };
        return Why::new("backing off", Tone::Waiting, text).until(Some(d.due_at));
    }
    let in_flight = flow.in_flight_of(d.endpoint_id);
    if e.ordered && in_flight > 0 {
        return Why::new(
            "held",
            Tone::Held,
            "ordered endpoint: waiting for the delivery in flight",
        );
    }
    let cap = u64::from(e.max_in_flight.unwrap_or(flow.default_cap));
    if in_flight >= cap {
        return Why::new(
            "held",
            Tone::Held,
            format!("in-flight cap reached ({in_flight} of {cap} in flight)"),
        );
    }
    match e.rate_limit_per_s {
        Some(r) if now.as_millis() - d.due_at.as_millis() > PACED_AFTER_MS => Why::new(
            "held",
            Tone::Held,
            format!("paced by the endpoint's rate limit ({r}/s)"),
        ),
        _ => Why::new("pending", Tone::Waiting, "due: waiting for a worker"),
    }
}

/// An endpoint's state as an operator reads it: disabled (and why), its
/// circuit open (until its next probe) or half-open, or enabled.
pub(crate) fn endpoint_state(e: &Endpoint, c: &Circuit, now: Timestamp) -> Why {
    if !e.enabled {
        let reason = e.disabled_reason.as_deref().unwrap_or("no reason given");
        return Why::new("disabled", Tone::Bad, reason);
    }
    let failures = c.consecutive_failures;
    match c.mode {
        CircuitMode::Open => Why::new(
            "circuit open",
            Tone::Held,
            format!("{failures} failures in a row; next probe"),
        )
        .until(c.open_until.filter(|t| *t > now).or(Some(now))),
        CircuitMode::HalfOpen => Why::new(
            "half-open",
            Tone::Waiting,
            "one probe in flight decides whether it closes",
        ),
        CircuitMode::Closed if failures > 0 => Why::new(
            "enabled",
            Tone::Waiting,
            format!("circuit closed, {failures} failures in a row"),
        ),
        CircuitMode::Closed => Why::new("enabled", Tone::Good, "circuit closed"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    use control_plane_core::{AccountId, DeliveryId, EndpointId, EventId, Secret, SigningSecrets};

    const NOW: Timestamp = Timestamp::from_millis(1_000_000_000);

    fn endpoint() -> Endpoint {
        Endpoint {
            id: EndpointId::new(),
            account: AccountId::new("acme").unwrap(),
            url: "https://example.com/hook".into(),
            secrets: SigningSecrets {
                current: Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
                previous: None,
                previous_expires_at: None,
            },
            event_types: vec![],
            filter: None,
            headers: None,
            oauth2: None,
            client_tls: None,
            transform: None,
            enabled: true,
            disabled_reason: None,
            rate_limit_per_s: None,
            max_in_flight: None,
            ordered: false,
            retry: None,
            description: None,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn pending_of(e: &Endpoint, due_at: Timestamp, attempts: u32) -> Delivery {
        Delivery {
            id: DeliveryId::new(),
            account: e.account.clone(),
            endpoint_id: e.id,
            event_id: EventId::new(),
            seq: 1,
            state: DeliveryState::Pending,
            attempts,
            max_attempts: 8,
            due_at,
            lease_expires_at: None,
            last_error: None,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn flow_of(e: &Endpoint, circuit: Circuit, in_flight: u64) -> Flow {
        Flow {
            endpoints: vec![e.clone()],
            circuits: HashMap::from([(e.id, circuit)]),
            in_flight: HashMap::from([(e.id, in_flight)]),
            default_cap: 10,
        }
    }

    #[test]
    fn a_pending_delivery_names_what_holds_it() {
        let later = NOW.plus(std::time::Duration::from_secs(240));
        let mut e = endpoint();
        let due = pending_of(&e, NOW, 0);
        let w = why(&due, &flow_of(&e, Circuit::closed(), 0), NOW);
        assert_eq!((w.label, w.tone), ("pending", Tone::Waiting), "{w:?}");

        let backing = pending_of(&e, later, 2);
        let w = why(&backing, &flow_of(&e, Circuit::closed(), 0), NOW);
        assert_eq!((w.label, w.until), ("backing off", Some(later)), "{w:?}");
        assert!(w.text.contains("attempt 2 of 8"), "{w:?}");

        let mut open = Circuit::closed();
        open.mode = CircuitMode::Open;
        open.open_until = Some(later);
        let w = why(&due, &flow_of(&e, open.clone(), 0), NOW);
        assert!(
            w.tone == Tone::Held && w.text.starts_with("circuit open"),
            "{w:?}"
        );
        assert_eq!(w.until, Some(later));

        // Half-open: the probe goes, the others wait for its answer.
        let mut half = Circuit::closed();
        half.mode = CircuitMode::HalfOpen;
        half.probe = Some(due.id);
        let w = why(&due, &flow_of(&e, half.clone(), 1), NOW);
        assert!(!w.text.contains("half-open"), "the probe itself: {w:?}");
        let other = pending_of(&e, NOW, 0);
        let w = why(&other, &flow_of(&e, half, 1), NOW);
        assert_eq!(
            (w.tone, w.text.as_str()),
            (
                Tone::Held,
                "circuit half-open: waiting for its probe's answer"
            ),
            "{w:?}"
        );

        let w = why(&due, &flow_of(&e, Circuit::closed(), 10), NOW);
        assert!(w.tone == Tone::Held && w.text.contains("10 of 10"), "{w:?}");

        e.rate_limit_per_s = Some(5);
        let late = pending_of(&e, NOW.minus(std::time::Duration::from_secs(30)), 0);
        let w = why(&late, &flow_of(&e, Circuit::closed(), 0), NOW);
        assert!(
            w.tone == Tone::Held && w.text.contains("rate limit (5/s)"),
            "{w:?}"
        );

        // A poll endpoint's delivery waits for its consumer, not a worker.
        let mut polled = e.clone();
        polled.url = String::new();
        let waiting = pending_of(&polled, NOW, 0);
        let w = why(&waiting, &flow_of(&polled, Circuit::closed(), 0), NOW);
        assert!(w.text.contains("waiting for its consumer"), "{w:?}");

        e.enabled = false;
        e.disabled_reason = Some("410 Gone".into());
        // A disabled endpoint is named before its circuit.
        let w = why(&due, &flow_of(&e, open, 0), NOW);
        assert_eq!(w.text, "endpoint disabled: 410 Gone");
        assert_eq!(w.tone, Tone::Held);
    }

    #[test]
    fn an_endpoint_with_an_open_circuit_does_not_read_enabled() {
        let mut e = endpoint();
        let mut c = Circuit::closed();
        assert_eq!(endpoint_state(&e, &c, NOW).tone, Tone::Good);
        c.consecutive_failures = 2;
        assert_eq!(endpoint_state(&e, &c, NOW).tone, Tone::Waiting);
        c.mode = CircuitMode::Open;
        c.consecutive_failures = 5;
        c.open_until = Some(NOW.plus(std::time::Duration::from_secs(30)));
        let w = endpoint_state(&e, &c, NOW);
        assert_eq!((w.label, w.tone), ("circuit open", Tone::Held), "{w:?}");
        assert_eq!(w.until, c.open_until);
        e.enabled = false;
        let w = endpoint_state(&e, &c, NOW);
        assert_eq!((w.label, w.text.as_str()), ("disabled", "no reason given"));
    }

    #[test]
    fn finished_and_leased_deliveries_say_what_happened() {
        let e = endpoint();
        let flow = flow_of(&e, Circuit::closed(), 1);
        let mut d = pending_of(&e, NOW, 8);
        d.state = DeliveryState::Dead;
        d.last_error = Some("HTTP 500".into());
        let w = why(&d, &flow, NOW);
        assert_eq!((w.label, w.tone), ("dead", Tone::Bad));
        assert_eq!(w.text, "gave up after 8 attempts: HTTP 500");
        d.state = DeliveryState::Leased;
        assert_eq!(why(&d, &flow, NOW).tone, Tone::Busy);
        d.state = DeliveryState::Delivered;
        assert_eq!(why(&d, &flow, NOW).tone, Tone::Good);
        let none = Flow {
            endpoints: vec![],
            ..flow
        };
        d.state = DeliveryState::Pending;
        assert_eq!(why(&d, &none, NOW).text, "its endpoint was deleted");
    }
}
