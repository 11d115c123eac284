//! Endpoints, their signing secrets and their requests.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::*;

/// A secret value (signing secret, password). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The secrets an endpoint's requests are signed with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningSecrets {
    /// The secret every request is signed with.
    pub current: Secret,
    /// During a rotation, the previous secret, which also signs until `previous_expires_at`.
    pub previous: Option<Secret>,
    /// When the previous secret stops signing.
    pub previous_expires_at: Option<Timestamp>,
}

impl SigningSecrets {
    /// The secrets that sign a request sent at `now`: the current one, and the
    /// previous one while its grace period lasts.
    pub fn signing_at(&self, now: Timestamp) -> Vec<&Secret> {
        let mut v = vec![&self.current];
        if let (Some(p), Some(until)) = (&self.previous, self.previous_expires_at) {
            if now < until {
                v.push(p);
            }
        }
        v
    }
}

/// A webhook destination owned by one account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Identifier.
    pub id: EndpointId,
    /// Owning account.
    pub account: AccountId,
    /// Destination URL.
    pub url: String,
    /// Signing secrets.
    pub secrets: SigningSecrets,
    /// Event types this endpoint receives; empty means every type.
    pub event_types: Vec<String>,
    /// A filter on the event's type and payload, beside `event_types`
    /// ([`crate::filter`]); `None` lets every accepted type through.
    pub filter: Option<EventFilter>,
    /// Whether deliveries are claimed. A disabled endpoint's deliveries are held.
    pub enabled: bool,
    /// Why the endpoint was disabled, when it is.
    pub disabled_reason: Option<String>,
    /// Requests per second the dispatcher may send, if limited; enforced by
    /// the store at claim across every replica (bursts of up to one second).
    pub rate_limit_per_s: Option<u32>,
    /// Deliveries in flight at once across every replica; `None` means the
    /// service default (`StoreOptions::endpoint_concurrency`).
    pub max_in_flight: Option<u32>,
    /// Ordered mode: one delivery in flight, lowest sequence first.
    pub ordered: bool,
    /// Free text for operators.
    pub description: Option<String>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

impl Endpoint {
    /// Whether an event of `event_type` is delivered to this endpoint, by
    /// its event types alone (its filter aside).
    pub fn accepts(&self, event_type: &str) -> bool {
        self.event_types.is_empty() || self.event_types.iter().any(|t| t == event_type || t == "*")
    }
}

/// Where an event of `event_type` with `payload` fans out: the ids, in
/// order, of the live endpoints that accept its type and whose filter it
/// passes (a payload a filter cannot evaluate does not pass it). An
/// operational event (an [`crate::AlertKind`] name) goes only to endpoints
/// that name its type explicitly, and never to the endpoint it is `about`,
/// so a failing endpoint is not told about itself and catch-all endpoints
/// receive only the events their owners publish.
pub fn fan_out(
    endpoints: &[Endpoint],
    event_type: &str,
    payload: &serde_json::Value,
    about: Option<EndpointId>,
) -> Vec<EndpointId> {
    let operational = crate::AlertKind::from_event_type(event_type).is_some();
    let mut ids: Vec<EndpointId> = endpoints
        .iter()
        .filter(|e| Some(e.id) != about)
        .filter(|e| {
            if operational {
                e.event_types.iter().any(|t| t == event_type)
            } else {
                e.accepts(event_type)
            }
        })
        .filter(|e| {
            e.filter
                .as_ref()
                .is_none_or(|f| f.matches(event_type, payload))
        })
        .map(|e| e.id)
        .collect();
    ids.sort();
    ids
}

/// What [`crate::EndpointStore::endpoint_set_enabled`] makes of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enablement {
    /// Its held deliveries are claimed again.
    Enabled,
    /// Its deliveries are held (not dropped); `reason` is shown to operators.
    Disabled {
        /// Why, for operators.
        reason: Option<String>,
    },
}

impl Enablement {
    /// `(enabled, disabled_reason)`, as the endpoint's row keeps them: a
    /// disabled endpoint always shows a reason.
    pub fn into_row(self) -> (bool, Option<String>) {
        match self {
            Enablement::Enabled => (true, None),
            Enablement::Disabled { reason } => (
                false,
                Some(reason.unwrap_or_else(|| "disabled by an operator".into())),
            ),
        }
    }
}

/// Creates an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointCreateRequest {
    /// Owning account.
    pub account: AccountId,
    /// Destination URL (`http` or `https`).
    pub url: String,
    /// Signing secret, `whsec_` + base64.
    pub secret: Secret,
    /// Event types received; empty means every type.
    pub event_types: Vec<String>,
    /// Optional filter on the event's type and payload.
    pub filter: Option<EventFilter>,
    /// Ordered mode.
    pub ordered: bool,
    /// Optional rate limit, requests per second (1 to 100,000).
    pub rate_limit_per_s: Option<u32>,
    /// Optional in-flight cap (1 to 10,000); unset means the service default.
    pub max_in_flight: Option<u32>,
    /// Optional description.
    pub description: Option<String>,
}

impl EndpointCreateRequest {
    /// A request with defaults: every event type, unordered, no limit.
    pub fn new(account: AccountId, url: impl Into<String>, secret: Secret) -> Self {
        EndpointCreateRequest {
            account,
            url: url.into(),
            secret,
            event_types: Vec::new(),
            filter: None,
            ordered: false,
            rate_limit_per_s: None,
            max_in_flight: None,
            description: None,
        }
    }

    /// Checks what every adapter must check before storing the endpoint.
    ///
    /// # Errors
    /// `InvalidInput` for a bad URL or event type, a limit out of range or a
    /// NUL in the description.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_endpoint_url(&self.url)?;
        validate_event_types(&self.event_types)?;
        if let Some(d) = &self.description {
            validate_free_text("description", d)?;
        }
        validate_flow_limits(self.rate_limit_per_s, self.max_in_flight)
    }
}

/// Changes to an endpoint; `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct EndpointUpdateRequest {
    /// New URL.
    pub url: Option<String>,
    /// New event types.
    pub event_types: Option<Vec<String>>,
    /// New payload filter (`Some(None)` removes it).
    pub filter: Option<Option<EventFilter>>,
    /// New ordered mode.
    pub ordered: Option<bool>,
    /// New rate limit (`Some(None)` removes it).
    pub rate_limit_per_s: Option<Option<u32>>,
    /// New in-flight cap (`Some(None)` returns to the service default).
    pub max_in_flight: Option<Option<u32>>,
    /// New description (`Some(None)` removes it).
    pub description: Option<Option<String>>,
}

impl EndpointUpdateRequest {
    /// Applies the given fields to `e`, validating a new URL.
    ///
    /// # Errors
    /// `InvalidInput` for a URL that is not absolute `http(s)`, a bad event
    /// type, a limit out of range or a NUL in the description; `e` is then
    /// unchanged.
    pub fn apply_to(self, e: &mut Endpoint) -> Result<(), StoreError> {
        if let Some(url) = &self.url {
            validate_endpoint_url(url)?;
        }
        if let Some(types) = &self.event_types {
            validate_event_types(types)?;
        }
        if let Some(Some(d)) = &self.description {
            validate_free_text("description", d)?;
        }
        validate_flow_limits(
            self.rate_limit_per_s.flatten(),
            self.max_in_flight.flatten(),
        )?;
        if let Some(url) = self.url {
            e.url = url;
        }
        if let Some(types) = self.event_types {
            e.event_types = types;
        }
        if let Some(f) = self.filter {
            e.filter = f;
        }
        if let Some(o) = self.ordered {
            e.ordered = o;
        }
        if let Some(r) = self.rate_limit_per_s {
            e.rate_limit_per_s = r;
        }
        if let Some(m) = self.max_in_flight {
            e.max_in_flight = m;
        }
        if let Some(d) = self.description {
            e.description = d;
        }
        Ok(())
    }
}

/// Checks an endpoint's rate limit and in-flight cap.
///
/// # Errors
/// `InvalidInput` naming the field when one is zero or too large.
pub fn validate_flow_limits(
    rate_limit_per_s: Option<u32>,
    max_in_flight: Option<u32>,
) -> Result<(), StoreError> {
    use crate::flow::{MAX_IN_FLIGHT_LIMIT, MAX_RATE_LIMIT_PER_S};
    if let Some(r) = rate_limit_per_s {
        if r == 0 || r > MAX_RATE_LIMIT_PER_S {
            return Err(StoreError::InvalidInput(format!(
                "rate_limit_per_s must be from 1 to {MAX_RATE_LIMIT_PER_S} requests per second (omit it for no limit; disable the endpoint to stop sending), got {r}"
            )));
        }
    }
    if let Some(m) = max_in_flight {
        if m == 0 || m > MAX_IN_FLIGHT_LIMIT {
            return Err(StoreError::InvalidInput(format!(
                "max_in_flight must be from 1 to {MAX_IN_FLIGHT_LIMIT} (omit it for the service default), got {m}"
            )));
        }
    }
    Ok(())
}

/// Checks an endpoint's event-type filter: each type as a published type is
/// checked (1 to 255 characters, no control characters), or `*`.
pub fn validate_event_types(types: &[String]) -> Result<(), StoreError> {
    types
        .iter()
        .try_for_each(|t| validate_short_text("event type", t))
}

/// Checks a URL the way every adapter must before storing it.
pub fn validate_endpoint_url(url: &str) -> Result<(), StoreError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(r)
            if !r.is_empty()
                && !r.starts_with('/')
                && url.len() <= 2048
                && !url.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Ok(())
        }
        _ => Err(StoreError::InvalidInput(format!(
            "endpoint url must be an absolute http:// or https:// URL of at most 2048 characters without spaces or control characters, got {url:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_in_debug() {
        let s = Secret::new("whsec_c2VjcmV0");
        assert!(!format!("{s:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn urls_must_be_absolute_http() {
        assert!(validate_endpoint_url("https://example.com/hook").is_ok());
        assert!(validate_endpoint_url("http://127.0.0.1:9000").is_ok());
        assert!(validate_endpoint_url("ftp://x").is_err());
        assert!(validate_endpoint_url("https://").is_err());
        assert!(validate_endpoint_url("https://a b").is_err());
    }

    #[test]
    fn previous_secret_signs_only_during_grace() {
        let s = SigningSecrets {
            current: Secret::new("a"),
            previous: Some(Secret::new("b")),
            previous_expires_at: Some(Timestamp::from_millis(100)),
        };
        assert_eq!(s.signing_at(Timestamp::from_millis(99)).len(), 2);
        assert_eq!(s.signing_at(Timestamp::from_millis(100)).len(), 1);
    }
}
