//! The column lists both adapters select and map back by position: one
//! list per row shape, so the two schemas and the two row mappers cannot
//! drift apart column by column. Each adapter's mapper reads them in this
//! order; a column added here is added to both mappers.

/// An endpoint row (`endpoints`), as `row_to_endpoint` reads it.
pub const ENDPOINT_COLS: &str = "id, account, url, secret, previous_secret, previous_expires_at, \
     event_types, enabled, disabled_reason, rate_limit_per_s, ordered, description, created_at, \
     updated_at, max_in_flight, filter, headers, oauth2, retry_schedule, max_attempts, client_tls, \
     transform";

/// An attempt row (`attempts`), as `row_to_attempt` reads it.
pub const ATTEMPT_COLS: &str =
    "id, delivery_id, endpoint_id, account, attempt, result, status_code, error, \
     latency_ms, will_retry, next_attempt_at, recorded_at, response_body";

/// An event row (`events`), as `row_to_event` reads it.
pub const EVENT_COLS: &str =
    "id, account, event_type, body, idempotency_key, created_at, traceparent, example";

/// A task row (`tasks`), as `row_to_task` reads it.
pub const TASK_COLS: &str =
    "id, account, kind, payload, state, attempts, max_attempts, run_at, lease_expires_at, \
     last_error, result, created_at, updated_at, seq, lease_token, last_outcome, staged_result, progress";

/// An event type row (`event_types`), as `row_to_type` reads it.
pub const TYPE_COLS: &str = "account, name, description, schema, example, created_at, updated_at";

/// Hands `$m!` every type of the port that both adapters store as text,
/// one `Type: String => make;` line each, where `make` turns the stored
/// text back into the type (`fn(String) -> StoreResult<Type>`): the one
/// list that each adapter's column mapping expands with its own macro
/// (both name `control_plane_core` as a dependency).
#[macro_export]
macro_rules! text_columns {
    ($m:ident) => {
        $m! {
            control_plane_core::Secret: String => |v| Ok(control_plane_core::Secret::new(v));
            control_plane_core::AccountId: String => control_plane_core::AccountId::new;
            control_plane_core::TaskId: String => control_plane_core::TaskId::new;
            control_plane_core::EventFilter: String => |v| control_plane_core::EventFilter::from_text(&v);
            control_plane_core::DeliveryState: String => |v| v.parse();
            control_plane_core::AttemptResult: String => |v| v.parse();
            control_plane_core::AlertKind: String => |v| v.parse();
            control_plane_core::CircuitMode: String => |v| v.parse();
            control_plane_core::TaskState: String => |v| v.parse();
            control_plane_core::UsageMetric: String => |v| v.parse();
        }
    };
}
