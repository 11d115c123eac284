//! Endpoints, their signing secrets and their requests.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{
    validate_free_text, AccountId, EndpointId, EndpointRetry, EventFilter, StoreError, Timestamp,
};

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
    /// Destination URL; empty for a poll endpoint, which has none
    /// ([`Endpoint::is_poll`]).
    pub url: String,
    /// Signing secrets.
    pub secrets: SigningSecrets,
    /// Event types this endpoint receives: names, `*` for every type, or
    /// `prefix.*` for every type under `prefix.`; empty means every type.
    pub event_types: Vec<String>,
    /// A filter on the event's type and payload, beside `event_types`
    /// ([`crate::EventFilter`]); `None` lets every accepted type through.
    pub filter: Option<EventFilter>,
    /// A jq program that rewrites each delivery's body before it is signed,
    /// or drops the delivery by giving `null` (ADR 0050).
    pub transform: Option<crate::Transform>,
    /// Custom headers sent with every request, as the JSON object of
    /// [`custom_headers_text`]: sealed at rest like the signing secrets,
    /// opened on reads; `None` when there are none.
    pub headers: Option<Secret>,
    /// OAuth2 client credentials its requests are authorised with, as the
    /// JSON text of [`crate::ClientCredentials::to_text`]: sealed at rest
    /// like the signing secrets, opened on reads; `None` when there are none.
    pub oauth2: Option<Secret>,
    /// The client certificate and key it presents over TLS, as the JSON
    /// text of [`crate::ClientTls::to_text`]: sealed at rest like the
    /// signing secrets, opened on reads; `None` when it has none.
    pub client_tls: Option<Secret>,
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
    /// Its own retry schedule and attempt limit; `None` means the service's.
    pub retry: Option<EndpointRetry>,
    /// Free text for operators.
    pub description: Option<String>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

impl Endpoint {
    /// Whether it is a poll endpoint (ADR 0051): it has no URL, nothing is
    /// sent to it, and its consumer reads its deliveries
    /// ([`crate::PollStore`]).
    pub fn is_poll(&self) -> bool {
        self.url.is_empty()
    }

    /// Its kind as the API names it: `poll`, or `push` for an endpoint
    /// with a URL (of any [`crate::Destination`]).
    pub fn kind(&self) -> &'static str {
        if self.is_poll() {
            "poll"
        } else {
            "push"
        }
    }

    /// What pages show for where its deliveries go: its URL, or
    /// `(poll endpoint)`.
    pub fn destination_label(&self) -> &str {
        if self.is_poll() {
            "(poll endpoint)"
        } else {
            &self.url
        }
    }

    /// Attempts its new deliveries get: its own limit, or `default` (the
    /// service's, `StoreOptions::max_attempts`).
    pub fn attempt_limit(&self, default: u32) -> u32 {
        self.retry
            .as_ref()
            .map_or(default, EndpointRetry::max_attempts)
    }

    /// The names of its custom headers (never their values), when they are
    /// opened; none when they cannot be read.
    pub fn header_names(&self) -> Vec<String> {
        self.headers
            .as_ref()
            .and_then(|h| custom_header_pairs(h).ok())
            .unwrap_or_default()
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// Its OAuth2 client credentials, when it has them and they are opened;
    /// none when they cannot be read.
    pub fn oauth2_client(&self) -> Option<crate::ClientCredentials> {
        self.oauth2
            .as_ref()
            .and_then(|o| crate::ClientCredentials::from_text(o).ok())
    }

    /// Its client certificate and key, when it has them and they are
    /// opened; none when they cannot be read.
    pub fn client_tls(&self) -> Option<crate::ClientTls> {
        self.client_tls
            .as_ref()
            .and_then(|c| crate::ClientTls::from_text(c).ok())
    }

    /// Whether an event of `event_type` is delivered to this endpoint, by
    /// its event types alone (its filter aside).
    pub fn accepts(&self, event_type: &str) -> bool {
        self.event_types.is_empty()
            || self
                .event_types
                .iter()
                .any(|t| crate::subscription_matches(t, event_type))
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

/// The longest reason an operator may give for disabling an endpoint.
pub const MAX_DISABLE_REASON_BYTES: usize = 500;

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
    ///
    /// # Errors
    /// `InvalidInput` for a reason that is empty, over
    /// [`MAX_DISABLE_REASON_BYTES`] or holds NUL: the one check of it, made
    /// by every adapter as it writes the row.
    pub fn into_row(self) -> Result<(bool, Option<String>), StoreError> {
        match self {
            Enablement::Enabled => Ok((true, None)),
            Enablement::Disabled { reason: Some(r) }
                if r.is_empty() || r.len() > MAX_DISABLE_REASON_BYTES || r.contains('\0') =>
            {
                Err(StoreError::InvalidInput(format!(
                    "reason must be 1 to {MAX_DISABLE_REASON_BYTES} characters, without NUL"
                )))
            }
            Enablement::Disabled { reason } => Ok((
                false,
                Some(reason.unwrap_or_else(|| "disabled by an operator".into())),
            )),
        }
    }
}

/// Creates an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointCreateRequest {
    /// Owning account.
    pub account: AccountId,
    /// Destination URL (see [`crate::Destination`]); empty for a poll
    /// endpoint.
    pub url: String,
    /// A poll endpoint ([`EndpointCreateRequest::poll`]): no URL; its
    /// consumer reads its deliveries (ADR 0051).
    pub poll: bool,
    /// Signing secret: `whsec_` + base64 of 24 to 64 bytes, or `whsk_` +
    /// base64 of a 32-byte Ed25519 seed.
    pub secret: Secret,
    /// Event types received; empty means every type.
    pub event_types: Vec<String>,
    /// Optional filter on the event's type and payload.
    pub filter: Option<EventFilter>,
    /// Optional jq program applied to each body before it is signed.
    pub transform: Option<crate::Transform>,
    /// Custom headers sent with every request (names and values checked by
    /// [`custom_headers_text`]).
    pub headers: BTreeMap<String, String>,
    /// OAuth2 client credentials for every request, if any.
    pub oauth2: Option<crate::ClientCredentials>,
    /// The client certificate and key presented over TLS, if any.
    pub client_tls: Option<crate::ClientTls>,
    /// Ordered mode.
    pub ordered: bool,
    /// Optional rate limit, requests per second (1 to 100,000).
    pub rate_limit_per_s: Option<u32>,
    /// Optional in-flight cap (1 to 10,000); unset means the service default.
    pub max_in_flight: Option<u32>,
    /// Optional retry schedule and attempt limit of its own.
    pub retry: Option<EndpointRetry>,
    /// Optional description.
    pub description: Option<String>,
    /// The most live endpoints the account may hold, this one included;
    /// the store counts them in the create's own transaction and answers
    /// [`StoreError::OverQuota`] past it. `None` is no quota.
    pub quota: Option<u32>,
}

impl EndpointCreateRequest {
    /// A request with defaults: every event type, unordered, no limit.
    pub fn new(account: AccountId, url: impl Into<String>, secret: Secret) -> Self {
        EndpointCreateRequest {
            account,
            url: url.into(),
            poll: false,
            secret,
            event_types: Vec::new(),
            filter: None,
            transform: None,
            headers: BTreeMap::new(),
            oauth2: None,
            client_tls: None,
            ordered: false,
            rate_limit_per_s: None,
            max_in_flight: None,
            retry: None,
            description: None,
            quota: None,
        }
    }
}

impl EndpointCreateRequest {
    /// A poll endpoint (ADR 0051): no URL; its consumer reads its
    /// deliveries.
    pub fn poll(account: AccountId, secret: Secret) -> Self {
        EndpointCreateRequest {
            poll: true,
            ..EndpointCreateRequest::new(account, "", secret)
        }
    }

    /// On a poll endpoint, refuses every setting that shapes sending.
    fn check_poll(&self) -> Result<(), StoreError> {
        crate::refuse_on_poll(&[
            ("url", !self.url.is_empty()),
            ("custom headers", !self.headers.is_empty()),
            ("oauth2", self.oauth2.is_some()),
            ("client_tls", self.client_tls.is_some()),
            ("transform", self.transform.is_some()),
            ("ordered mode (reads are in order already)", self.ordered),
            ("rate_limit_per_s", self.rate_limit_per_s.is_some()),
            ("max_in_flight", self.max_in_flight.is_some()),
            ("retry", self.retry.is_some()),
        ])
    }
}

impl crate::Check for EndpointCreateRequest {
    /// Checks what every adapter must check before storing the endpoint.
    ///
    /// # Errors
    /// `InvalidInput` for a bad URL, signing secret
    /// ([`crate::signing::validate_signing_secret`]) or event type, a limit
    /// out of range, a NUL in the description, or a client certificate
    /// that does not parse, whose key is not its own, or on an endpoint
    /// that is not `https` ([`crate::ClientTls::validate`]).
    fn check(&self) -> Result<(), StoreError> {
        if self.poll {
            self.check_poll()?;
        } else {
            validate_endpoint_url(&self.url)?;
        }
        crate::signing::validate_signing_secret(self.secret.expose())?;
        validate_event_types(&self.event_types)?;
        custom_headers_text(&self.headers)?;
        if let Some(o) = &self.oauth2 {
            o.validate()?;
            crate::endpoint_update::oauth2_needs_http(&self.url)?;
        }
        if let Some(c) = &self.client_tls {
            c.validate()?;
            crate::client_tls::client_tls_needs_https(&self.url)?;
        }
        if let Some(d) = &self.description {
            validate_description(d)?;
        }
        validate_flow_limits(self.rate_limit_per_s, self.max_in_flight)
    }
}

/// A rotation of an endpoint's signing secret: the new secret, and how
/// long the one it replaces keeps signing beside it.
#[derive(Clone, Debug)]
pub struct SecretRotation {
    /// The new signing secret.
    pub secret: Secret,
    /// How long the previous secret keeps signing too.
    pub grace: std::time::Duration,
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
    /// New jq program (`Some(None)` removes it).
    pub transform: Option<Option<crate::Transform>>,
    /// New custom headers, replacing all of them (an empty map removes them).
    pub headers: Option<BTreeMap<String, String>>,
    /// New OAuth2 client credentials (`Some(None)` removes them).
    pub oauth2: Option<Option<crate::ClientCredentials>>,
    /// New client certificate and key (`Some(None)` removes them).
    pub client_tls: Option<Option<crate::ClientTls>>,
    /// New ordered mode.
    pub ordered: Option<bool>,
    /// New rate limit (`Some(None)` removes it).
    pub rate_limit_per_s: Option<Option<u32>>,
    /// New in-flight cap (`Some(None)` returns to the service default).
    pub max_in_flight: Option<Option<u32>>,
    /// New retry schedule and attempt limit (`Some(None)` returns to the
    /// service's). Deliveries already made keep the limit they were given
    /// until they are replayed; the schedule applies from their next failure.
    pub retry: Option<Option<EndpointRetry>>,
    /// New description (`Some(None)` removes it).
    pub description: Option<Option<String>>,
}

impl EndpointUpdateRequest {
    /// Applies the given fields to `e`, validating a new URL.
    ///
    /// # Errors
    /// `InvalidInput` for a URL that is not absolute `http(s)`, a bad event
    /// type, a limit out of range or a NUL in the description; for a URL of
    /// another origin (scheme, host, port) while the endpoint keeps custom
    /// headers, OAuth2 credentials or a client certificate the request does
    /// not give again; for a client certificate that is refused
    /// ([`crate::ClientTls::validate`]) or an endpoint left with one that is
    /// not `https`; `e` is then unchanged.
    pub fn apply_to(self, e: &mut Endpoint) -> Result<(), StoreError> {
        self.check_poll(e)?;
        self.check_destination(e)?;
        if let Some(types) = &self.event_types {
            validate_event_types(types)?;
        }
        let headers = self.headers.as_ref().map(custom_headers_text).transpose()?;
        let oauth2 = crate::endpoint_update::change_text(
            self.oauth2.as_ref(),
            crate::ClientCredentials::to_text,
        )?;
        let client_tls = crate::endpoint_update::change_text(
            self.client_tls.as_ref(),
            crate::ClientTls::to_text,
        )?;
        if let Some(Some(d)) = &self.description {
            validate_description(d)?;
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
        if let Some(t) = self.transform {
            e.transform = t;
        }
        if let Some(h) = headers {
            e.headers = h;
        }
        if let Some(o) = oauth2 {
            e.oauth2 = o;
        }
        if let Some(c) = client_tls {
            e.client_tls = c;
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
        if let Some(r) = self.retry {
            e.retry = r;
        }
        if let Some(d) = self.description {
            e.description = d;
        }
        Ok(())
    }
}

/// Custom headers an endpoint may carry at most.
pub const MAX_CUSTOM_HEADERS: usize = 20;
/// A custom header's value, in bytes, at most.
pub const MAX_CUSTOM_HEADER_BYTES: usize = 1024;
/// Header names the dispatcher sets itself or that would change how the
/// request is framed or routed: refused as custom headers (and every
/// `webhook-*` name).
pub const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "content-type",
    "expect",
    "host",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
];

/// Checks custom headers and gives them as stored: a JSON object of
/// lower-cased names and their values, `None` when there are none.
///
/// # Errors
/// `InvalidInput` naming the header: more than [`MAX_CUSTOM_HEADERS`], a
/// name that is not an HTTP token (1 to 64 of `A-Z a-z 0-9` and
/// ``!#$%&'*+-.^_`|~``), a reserved one, or the same name twice in
/// different case; a value that is empty, longer than
/// [`MAX_CUSTOM_HEADER_BYTES`], or holds a character outside visible ASCII,
/// space and tab.
pub fn custom_headers_text(
    headers: &BTreeMap<String, String>,
) -> Result<Option<Secret>, StoreError> {
    if headers.is_empty() {
        return Ok(None);
    }
    if headers.len() > MAX_CUSTOM_HEADERS {
        return Err(StoreError::InvalidInput(format!(
            "at most {MAX_CUSTOM_HEADERS} custom headers, got {}",
            headers.len()
        )));
    }
    let mut lowered = BTreeMap::new();
    for (name, value) in headers {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || name.len() > 64 || !name.chars().all(token) {
            return Err(StoreError::InvalidInput(format!(
                "header name {name:?} must be 1 to 64 characters of A-Z a-z 0-9 and !#$%&'*+-.^_`|~"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("webhook-") {
            return Err(StoreError::InvalidInput(format!(
                "header {name:?} is set by the dispatcher and cannot be replaced"
            )));
        }
        let visible = |b: u8| b == b'\t' || (0x20..0x7f).contains(&b);
        if value.is_empty() || value.len() > MAX_CUSTOM_HEADER_BYTES || !value.bytes().all(visible)
        {
            return Err(StoreError::InvalidInput(format!(
                "header {name:?}: its value must be 1 to {MAX_CUSTOM_HEADER_BYTES} bytes of visible ASCII, space and tab"
            )));
        }
        if lowered.insert(lower, value.clone()).is_some() {
            return Err(StoreError::InvalidInput(format!(
                "header {name:?} is given twice (names are case-insensitive)"
            )));
        }
    }
    serde_json::to_string(&lowered)
        .map(|t| Some(Secret::new(t)))
        .map_err(|e| StoreError::InvalidInput(format!("custom headers: {e}")))
}

/// The `(name, value)` pairs of custom headers as stored and opened.
///
/// # Errors
/// `Backend` when the text is not a JSON object of strings (a value still
/// sealed, or a store changed by hand).
pub fn custom_header_pairs(text: &Secret) -> Result<Vec<(String, String)>, StoreError> {
    serde_json::from_str::<BTreeMap<String, String>>(text.expose())
        .map(|m| m.into_iter().collect())
        .map_err(|_| StoreError::Backend("stored custom headers are not readable".into()))
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

/// Checks an endpoint's event-type subscriptions: each a type name (1 to
/// 255 characters, no control characters), `*`, or a prefix wildcard such
/// as `order.*` (see [`crate::validate_subscription`]).
pub fn validate_event_types(types: &[String]) -> Result<(), StoreError> {
    if types.len() > MAX_ENDPOINT_EVENT_TYPES {
        return Err(StoreError::InvalidInput(format!(
            "event_types may name at most {MAX_ENDPOINT_EVENT_TYPES} types or patterns, got {}",
            types.len()
        )));
    }
    types
        .iter()
        .try_for_each(|t| crate::validate_subscription(t))
}

/// The most entries of an endpoint's `event_types`.
pub const MAX_ENDPOINT_EVENT_TYPES: usize = 100;

/// The longest endpoint description, in bytes.
pub const MAX_ENDPOINT_DESCRIPTION_BYTES: usize = 1_024;

/// Checks an endpoint's description: no NUL, at most
/// [`MAX_ENDPOINT_DESCRIPTION_BYTES`].
pub fn validate_description(d: &str) -> Result<(), StoreError> {
    validate_free_text("description", d)?;
    if d.len() > MAX_ENDPOINT_DESCRIPTION_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "description must be at most {MAX_ENDPOINT_DESCRIPTION_BYTES} bytes, got {}",
            d.len()
        )));
    }
    Ok(())
}

/// Query parameter names that carry a credential: the end of the name
/// (lower case, `-` as `_`) is one of these.
const CREDENTIAL_PARAMS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "key",
    "auth",
    "authorization",
    "signature",
    "sig",
    "credential",
    "credentials",
];

/// Refuses a URL that carries a credential in the clear: a user or password
/// before the host, or a query parameter named like one. A URL is shown by
/// every read and on the dashboard, so a credential belongs in a custom
/// header, which is sealed at rest and never shown again.
pub(crate) fn refuse_credentials_in(url: &str, rest: &str) -> Result<(), StoreError> {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(StoreError::InvalidInput(format!(
            "endpoint url must not carry a user or password ({}); send credentials in a custom header \
             (headers are sealed and never shown again), e.g. \"headers\": {{\"authorization\": \"Basic ...\"}}",
            url.split('@').next_back().map_or("", |h| h)
        )));
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let query = query.split('#').next().unwrap_or_default();
    for pair in query.split('&') {
        let name = pair
            .split('=')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase()
            .replace('-', "_");
        if let Some(c) = CREDENTIAL_PARAMS
            .iter()
            .find(|c| name == **c || name.ends_with(&format!("_{c}")))
        {
            return Err(StoreError::InvalidInput(format!(
                "endpoint url must not carry a credential in its query (parameter {name:?} looks like a {c}); \
                 send it in a custom header instead: headers are sealed and never shown again"
            )));
        }
    }
    Ok(())
}

/// Checks an endpoint's URL the way every adapter must before storing it:
/// an HTTP URL or a broker's ([`crate::Destination`]).
///
/// # Errors
/// `InvalidInput` saying what is wrong.
pub fn validate_endpoint_url(url: &str) -> Result<(), StoreError> {
    crate::Destination::parse(url).map(|_| ())
}

/// Checks an HTTP(S) URL: absolute, at most 2048 characters, no spaces or
/// control characters, no credential in the clear. An OAuth2 token URL must
/// be one.
///
/// # Errors
/// `InvalidInput` saying what is wrong.
pub fn validate_http_url(url: &str) -> Result<(), StoreError> {
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
            refuse_credentials_in(url, r)
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
        let s = Secret::new("whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0");
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
    fn credentials_in_a_url_are_refused_pointing_to_headers() {
        for url in [
            "https://user:pass@example.com/hook",
            "https://user@example.com/hook",
            "https://example.com/hook?token=abc",
            "https://example.com/hook?a=1&API-KEY=abc",
            "https://example.com/hook?x_secret=abc#frag",
            "http://example.com?password=x",
        ] {
            let e = validate_endpoint_url(url).unwrap_err().to_string();
            assert!(e.contains("header"), "{url}: {e}");
            assert!(
                !e.contains("pass@") && !e.contains("abc"),
                "{url} echoes the secret: {e}"
            );
        }
        for url in [
            "https://example.com/hook?tenant=7&monkey=1",
            "https://example.com/a@b",
            "https://example.com/hook?x=a@b",
        ] {
            assert!(validate_endpoint_url(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn endpoint_strings_and_lists_have_a_length() {
        let many: Vec<String> = (0..=MAX_ENDPOINT_EVENT_TYPES)
            .map(|i| format!("t{i}"))
            .collect();
        assert!(validate_event_types(&many).is_err());
        assert!(validate_event_types(&many[..MAX_ENDPOINT_EVENT_TYPES]).is_ok());
        assert!(validate_description(&"d".repeat(MAX_ENDPOINT_DESCRIPTION_BYTES)).is_ok());
        assert!(validate_description(&"d".repeat(MAX_ENDPOINT_DESCRIPTION_BYTES + 1)).is_err());
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
