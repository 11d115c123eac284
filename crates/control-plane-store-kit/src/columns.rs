//! The column lists both adapters select and map back by position: one
//! list per row shape, so the two schemas and the two row mappers cannot
//! drift apart column by column. Each adapter's mapper reads them in this
//! order; a column added here is added to both mappers.

/// An endpoint row (`endpoints`), as `row_to_endpoint` reads it.
pub const ENDPOINT_COLS: &str = "id, account, url, secret, previous_secret, previous_expires_at, \
     event_types, enabled, disabled_reason, rate_limit_per_s, ordered, description, created_at, \
     updated_at, max_in_flight, filter, headers, oauth2, retry_schedule, max_attempts";

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
