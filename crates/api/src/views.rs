//! The JSON shapes of the API's answers. Secrets appear only where a route
//! says so (endpoint creation and rotation).

use control_plane_core::{
    Alert, AttemptRecord, AttemptStats, Delivery, Endpoint, Event, Task, Timestamp, UsageRow,
};
use serde_json::{json, Value};

fn time(t: Timestamp) -> String {
    t.to_rfc3339()
}

pub(crate) fn endpoint(e: &Endpoint) -> Value {
    json!({
        "id": e.id,
        "account": e.account.as_str(),
        "url": e.url,
        "event_types": e.event_types,
        "enabled": e.enabled,
        "disabled_reason": e.disabled_reason,
        "ordered": e.ordered,
        "rate_limit_per_s": e.rate_limit_per_s,
        "max_in_flight": e.max_in_flight,
        "description": e.description,
        "created_at": time(e.created_at),
        "updated_at": time(e.updated_at),
    })
}

pub(crate) fn attempt_stats(s: &AttemptStats) -> Value {
    json!({
        "attempts": {
            "delivered": s.delivered,
            "failed": s.failed,
            "lease_expired": s.lease_expired,
        },
        "success_rate": s.success_rate(),
        "p50_latency_ms": s.p50_latency_ms,
        "p95_latency_ms": s.p95_latency_ms,
    })
}

/// The event with the exact body its deliveries send.
pub(crate) fn event(e: &Event) -> Value {
    json!({
        "id": e.id,
        "account": e.account.as_str(),
        "type": e.event_type,
        "body": e.body,
        "idempotency_key": e.idempotency_key,
        "created_at": time(e.created_at),
    })
}

pub(crate) fn delivery(d: &Delivery) -> Value {
    json!({
        "id": d.id,
        "endpoint_id": d.endpoint_id,
        "event_id": d.event_id,
        "state": d.state.as_str(),
        "attempts": d.attempts,
        "max_attempts": d.max_attempts,
        "due_at": time(d.due_at),
        "last_error": d.last_error,
        "created_at": time(d.created_at),
        "updated_at": time(d.updated_at),
    })
}

pub(crate) fn attempt(a: &AttemptRecord) -> Value {
    json!({
        "attempt": a.attempt,
        "result": a.result.as_str(),
        "status_code": a.status_code,
        "error": a.error,
        "latency_ms": a.latency_ms,
        "will_retry": a.will_retry,
        "next_attempt_at": a.next_attempt_at.map(time),
        "recorded_at": time(a.recorded_at),
    })
}

pub(crate) fn task(t: &Task) -> Value {
    json!({
        "id": t.id.as_str(),
        "kind": t.kind,
        "payload": t.payload,
        "state": t.state.as_str(),
        "attempts": t.attempts,
        "max_attempts": t.max_attempts,
        "run_at": time(t.run_at),
        "last_error": t.last_error,
        "result": t.result,
        "created_at": time(t.created_at),
        "updated_at": time(t.updated_at),
    })
}

pub(crate) fn usage(r: &UsageRow) -> Value {
    json!({
        "metric": r.metric.as_str(),
        "window_start": time(r.window_start),
        "amount": r.amount,
    })
}

pub(crate) fn alert(a: &Alert) -> Value {
    json!({
        "id": a.id,
        "kind": a.kind.as_str(),
        "endpoint_id": a.endpoint_id,
        "delivery_id": a.delivery_id,
        "message": a.message,
        "created_at": time(a.created_at),
    })
}
