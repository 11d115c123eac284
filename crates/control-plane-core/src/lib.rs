#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Defines an enum that is stored and shown by name: each variant with its
/// name, `as_str`, `ALL` (in declaration order), serde by the same names, and
/// a `FromStr` whose error lists every accepted name.
macro_rules! named_enum {
    ($(#[$doc:meta])* pub enum $name:ident ($what:literal) {
        $($(#[$vdoc:meta])* $variant:ident = $text:literal,)+
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::StoreError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let names: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                    $crate::StoreError::InvalidInput(format!(
                        "{} must be one of {}, got {s:?}",
                        $what,
                        names.join(", ")
                    ))
                })
            }
        }
    };
}

/// Defines a validated string newtype: the struct, `as_str`, `Display`, and
/// serde through `String` with `new` (written beside each type) as the
/// check, so a value that fails `new` cannot be deserialized either. With
/// `short_text "what";` after it, `new` is written here too: 1 to 255
/// characters, no control character ([`validate_short_text`]).
macro_rules! string_id {
    ($(#[$doc:meta])* pub struct $name:ident; short_text $what:literal;) => {
        string_id! { $(#[$doc])* pub struct $name; }

        impl $name {
            #[doc = concat!("Validates `s` as a ", $what, ".")]
            ///
            /// # Errors
            /// `InvalidInput` when it is empty, longer than 255 characters,
            /// or holds a control character.
            pub fn new(s: impl Into<String>) -> Result<Self, $crate::StoreError> {
                let s = s.into();
                $crate::validate_short_text($what, &s)?;
                Ok($name(s))
            }
        }
    };
    ($(#[$doc:meta])* pub struct $name:ident;) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::StoreError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                $name::new(s)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

mod account_key;
mod alert;
mod attempt;
mod backoff;
mod catalogue;
mod checked;
mod client_tls;
mod clock;
mod delivery;
mod destination;
mod endpoint;
mod endpoint_update;
mod erasure;
mod error;
mod filter;
mod flow;
mod hash;
mod idempotency;
mod lease;
mod maintenance;
mod oauth2;
mod policy;
mod poll;
mod portal;
mod recover;
mod session;
mod signing;
mod store;
mod tick;
mod trace;
mod transform;
mod types;
mod usage;
mod workflow;

pub use account_key::{AccountKey, KeyHash};
pub use alert::{Alert, AlertKind, NewAlert};
pub use attempt::{
    latency_bucket, latency_bucket_bound, nearest_rank, rollup_bucket, rollup_minute,
    storable_body, AttemptQuery, AttemptRecord, AttemptResult, AttemptStats, RollupRow,
    LATENCY_BUCKETS, ROLLUP_HORIZON, ROLLUP_MINUTE_MS,
};
pub use backoff::{jitter_unit, jittered};
pub use backoff::{
    EndpointRetry, MAX_ENDPOINT_ATTEMPTS, MAX_ENDPOINT_RETRY_DELAY, MAX_ENDPOINT_RETRY_DELAYS,
};
pub use catalogue::{
    compile_schema, subscription_matches, validate_subscription, validate_type_name,
    CompiledSchema, EventType, EventTypePut, MAX_DESCRIPTION_BYTES, MAX_EXAMPLE_BYTES,
    MAX_SCHEMA_BYTES, MAX_SCHEMA_PATTERNS, REMOTE_REFUSED,
};
pub use checked::{Check, Checked};
pub use client_tls::{
    CertificateSummary, ClientTls, MAX_CLIENT_CERTIFICATE_BYTES, MAX_CLIENT_KEY_BYTES,
};
pub use clock::duration_millis;
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use delivery::{
    cut_by_time, validate_lease, AttemptReport, ClaimRequest, ClaimedDelivery, Delivery,
    DeliveryListRequest, DeliveryOutcome, DeliveryState, Enqueued, Event, EventListRequest, Lease,
    OutcomeRecorded, PublishRequest, Published, ReplayFilter, Requeue, TimeCut,
};
pub use destination::check_nats_subject;
pub use destination::Destination;
pub use endpoint::{
    custom_header_pairs, custom_headers_text, fan_out, validate_description, validate_endpoint_url,
    validate_event_types, validate_flow_limits, validate_http_url, Enablement, Endpoint,
    EndpointCreateRequest, EndpointUpdateRequest, Secret, SecretRotation, SigningSecrets,
    MAX_CUSTOM_HEADERS, MAX_CUSTOM_HEADER_BYTES, MAX_DISABLE_REASON_BYTES,
    MAX_ENDPOINT_DESCRIPTION_BYTES, MAX_ENDPOINT_EVENT_TYPES, RESERVED_HEADERS,
};
pub use erasure::ERASE_BATCH_ROWS;
pub use erasure::{ErasureBegun, ErasureProgress, ERASE_TASK, ERASING};
pub use error::{StoreError, StoreResult};
pub use filter::EventFilter;
pub use flow::{share_claim, FlowCandidate, RateBudget, Throttle};
pub use flow::{MAX_IN_FLIGHT_LIMIT, MAX_THROTTLED};
pub use hash::fnv1a;
pub use idempotency::{
    idempotency_account_prefix, validate_idempotency_key, IdempotencyBegin,
    IdempotencyBeginRequest, IdempotencyOwner, IdempotencyRecord, IdempotencyToken, StoredResponse,
};
pub use lease::{fence, FencedWrite, FinishedRow, Held, LeaseRow, Refused, TaskRow, Verdict};
pub use maintenance::{run_maintenance, Purged};
pub use maintenance::{PurgeBatch, PurgeReport};
pub use oauth2::ClientCredentials;
pub use policy::{
    alerts_for, plan_lease_expiry, plan_outcome, AttemptDraft, AttemptState, Transition,
    DEFAULT_ENDPOINT_CONCURRENCY,
};
pub use policy::{BreakerPolicy, Circuit, CircuitChange, CircuitMode, Migrations, StoreOptions};
pub use poll::{
    not_a_poll_endpoint, refuse_on_poll, PollPage, PollRequest, Polled, DEFAULT_POLL_LIMIT,
    MAX_POLL_LIMIT,
};
pub use portal::{
    portal_endpoints_parse, portal_endpoints_text, PortalLink, PortalLinkCreateRequest, PortalRole,
    MAX_PORTAL_LINKS_LISTED, MAX_PORTAL_LINK_ENDPOINTS, MAX_PORTAL_LINK_LIFETIME,
};
pub use recover::{RecoverProgress, Recovered, Recovery, RECOVER_TASK};
pub use session::check_hex;
pub use session::{DashboardSession, SessionCreateRequest, MAX_SESSION_LIFETIME};
pub use signing::SignatureScheme;
pub use signing::{
    check_rotation, ed25519_secret, ed25519_verify, generate_ed25519_secret,
    validate_signing_secret, Ed25519Key,
};
pub use store::{
    AccountKeyStore, AlertStore, AttemptLogStore, CatalogueStore, CircuitStore, ControlPlaneStore,
    DeliveryStore, DynControlPlaneStore, EndpointStore, ErasureStore, EventStore, IdempotencyStore,
    MaintenanceStore, PollStore, PortalStore, SessionStore, TickStore, UsageStore, Wakeups,
    WorkflowStore, MAX_SESSIONS_LISTED,
};
pub use tick::{TickClaimRequest, TickLease};
pub use trace::TraceParent;
pub use transform::{run_program, Transform, Transformed, MAX_PROGRAM_BYTES};
pub use types::{
    fenced, validate_free_text, validate_json_text, validate_limit, validate_short_text, AccountId,
    DeliveryId, EndpointId, EndpointKey, EventId, KeyId, LeaseToken, Page, PageRequest,
    PortalLinkId, TimeRange, OTHER_ACCOUNTS,
};
pub use usage::{usage_window, UsageBatch, UsageEntry, UsageMetric, UsageRow, USAGE_WINDOW};
pub use workflow::{
    listable, task_kind_reserved, validate_progress, ClaimedTask, Task, TaskClaimRequest,
    TaskEnqueueRequest, TaskEnqueued, TaskFailed, TaskFailure, TaskHeartbeat, TaskId, TaskLease,
    TaskListRequest, TaskState, WorkflowPolicy, MAX_PROGRESS_BYTES, PUBLISH_TASK,
    SERVICE_TASK_PREFIX,
};
