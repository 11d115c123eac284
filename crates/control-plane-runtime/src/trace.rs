//! The bridge between a stored W3C `traceparent`
//! ([`control_plane_core::TraceParent`]) and the `tracing` span that the
//! OpenTelemetry layer exports, when the binary installs one. Without that
//! layer, [`join`] does nothing and [`of`] finds nothing: the stored value
//! is the caller's, passed on as it came.

use control_plane_core::TraceParent;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the remote span `parent`, so that what the span
/// exports belongs to the caller's trace. Nothing happens when no
/// OpenTelemetry layer is installed or the span is disabled.
pub fn join(parent: &TraceParent, span: &tracing::Span) {
    let context = span_context(parent);
    if context.is_valid() {
        // An error means no OpenTelemetry layer sees the span: nothing to join.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
    }
}

/// The `traceparent` of `span` itself, when an OpenTelemetry layer exports
/// it: what a request made inside it passes on.
pub fn of(span: &tracing::Span) -> Option<TraceParent> {
    let context = span.context();
    let sc = context.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    TraceParent::parse(&format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    ))
}

fn span_context(parent: &TraceParent) -> SpanContext {
    let text = parent.as_str();
    let part = |range: std::ops::Range<usize>| text.get(range).unwrap_or_default();
    let trace = u128::from_str_radix(part(3..35), 16).unwrap_or(0);
    let span = u64::from_str_radix(part(36..52), 16).unwrap_or(0);
    let flags = u8::from_str_radix(part(53..55), 16).unwrap_or(0);
    SpanContext::new(
        TraceId::from(trace),
        SpanId::from(span),
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_context_is_read_from_the_value() {
        let t =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let sc = span_context(&t);
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
    }
}
