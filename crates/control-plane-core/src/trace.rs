//! W3C trace context across the store: the `traceparent` a publish carries
//! is stored with its event and sent on every delivery of it, so a trace
//! started by the publisher continues in the service and at the receiver.
//!
//! [`TraceParent`] is the value (version `00`, checked); the bridge to the
//! `tracing` spans that the OpenTelemetry layer exports is
//! `control_plane_runtime::trace`.

/// A W3C `traceparent` header value of version `00`:
/// `00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>`, in
/// lower case, neither id all zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// The value when `s` is a valid version-`00` `traceparent`; `None`
    /// otherwise (the W3C rule: an invalid header is ignored, not refused).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let hex = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let zeros = |part: &str| part.bytes().all(|b| b == b'0');
        let mut parts = s.split('-');
        let (Some(version), Some(trace), Some(parent), Some(flags), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let valid = version == "00"
            && hex(trace, 32)
            && hex(parent, 16)
            && hex(flags, 2)
            && !zeros(trace)
            && !zeros(parent);
        valid.then(|| TraceParent(s.to_string()))
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id, as 32 lower-case hex digits.
    pub fn trace_id(&self) -> &str {
        self.0.get(3..35).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_valid_version_00_traceparent_is_taken() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceParent::parse(ok).unwrap();
        assert_eq!(t.as_str(), ok);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
