//! What an HTTP result means for the delivery (README "HTTP API (v1)",
//! delivery rules), and when to retry.

use std::time::Duration;

use crate::retry::RetryPolicy;
use control_plane_core::{AttemptReport, DeliveryOutcome, Timestamp};

/// What one send observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendResult {
    /// The status, when a response arrived.
    pub status: Option<u16>,
    /// `Retry-After`, in seconds, when the response had one.
    pub retry_after: Option<Duration>,
    /// The transport error, when no response arrived (timeout, refused, reset).
    pub error: Option<String>,
    /// Time from send to response or failure.
    pub latency_ms: u64,
    /// The start of the answer's body, when one was kept.
    pub response_body: Option<String>,
    /// A broker acknowledged the message (a broker destination has no
    /// status: its ack is what delivers).
    pub acked: bool,
}

/// The outcome to record for `result` of attempt `attempt` at `now`:
/// a broker's ack or a 2xx delivered; 410 gone (disables the endpoint); 408, 425, 429, 5xx,
/// transport errors, 3xx (redirects are not followed) and other 4xx retry.
pub fn classify(
    result: &SendResult,
    attempt: u32,
    seed: &[u8],
    policy: &RetryPolicy,
    now: Timestamp,
) -> DeliveryOutcome {
    let report = AttemptReport {
        status_code: result.status,
        error: result.error.clone().or_else(|| match result.status {
            Some(s) if (300..400).contains(&s) => {
                Some(format!("HTTP {s}: redirects are not followed"))
            }
            _ => None,
        }),
        latency_ms: result.latency_ms,
        response_body: result.response_body.clone(),
    };
    match result.status {
        _ if result.acked => DeliveryOutcome::Delivered(report),
        Some(s) if (200..300).contains(&s) => DeliveryOutcome::Delivered(report),
        Some(410) => DeliveryOutcome::Gone(report),
        _ => {
            let honoured = match result.status {
                Some(429) | Some(503) => result.retry_after,
                _ => None,
            };
            let at = now.plus(policy.delay(attempt, seed, honoured));
            DeliveryOutcome::Retry { at, report }
        }
    }
}

/// Parses `Retry-After` in either form RFC 9110 allows: delay seconds, or
/// an HTTP date, read against the wall clock `now` (a date in the past means
/// no delay). Anything else is ignored.
pub fn parse_retry_after(v: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(status: Option<u16>) -> SendResult {
        SendResult {
            status,
            retry_after: None,
            error: None,
            latency_ms: 3,
            response_body: None,
            acked: false,
        }
    }

    #[test]
    fn statuses_map_to_outcomes() {
        let p = RetryPolicy::default();
        let now = Timestamp::from_millis(0);
        assert!(matches!(
            classify(&res(Some(204)), 1, &[1], &p, now),
            DeliveryOutcome::Delivered(_)
        ));
        assert!(matches!(
            classify(&res(Some(410)), 1, &[1], &p, now),
            DeliveryOutcome::Gone(_)
        ));
        let acked = SendResult {
            acked: true,
            ..res(None)
        };
        let DeliveryOutcome::Delivered(report) = classify(&acked, 1, &[1], &p, now) else {
            panic!("a broker's ack delivers")
        };
        assert_eq!((report.status_code, report.error), (None, None));
        assert!(matches!(
            classify(&res(None), 1, &[1], &p, now),
            DeliveryOutcome::Retry { .. }
        ));
        for s in [301, 400, 404, 408, 425, 429, 500, 503] {
            assert!(
                matches!(
                    classify(&res(Some(s)), 1, &[1], &p, now),
                    DeliveryOutcome::Retry { .. }
                ),
                "{s}"
            );
        }
        let refused = SendResult {
            status: None,
            retry_after: None,
            error: Some("connection refused".into()),
            latency_ms: 1,
            response_body: None,
            acked: false,
        };
        let DeliveryOutcome::Retry { report, .. } = classify(&refused, 1, &[1], &p, now) else {
            panic!("retry")
        };
        assert_eq!(report.error.as_deref(), Some("connection refused"));
        let DeliveryOutcome::Retry { report, .. } = classify(&res(Some(302)), 1, &[1], &p, now)
        else {
            panic!("retry")
        };
        assert!(report.error.unwrap_or_default().contains("redirects"));
    }

    #[test]
    fn retry_after_is_honoured_within_bounds() {
        let p = RetryPolicy::default();
        let now = Timestamp::from_millis(0);
        let mut r = res(Some(429));
        r.retry_after = Some(Duration::from_secs(120));
        let DeliveryOutcome::Retry { at, .. } = classify(&r, 1, &[7], &p, now) else {
            panic!("retry")
        };
        assert_eq!(at, now.plus(Duration::from_secs(120)));
        r.retry_after = Some(Duration::from_secs(999_999));
        let DeliveryOutcome::Retry { at, .. } = classify(&r, 1, &[7], &p, now) else {
            panic!("retry")
        };
        assert_eq!(at, now.plus(Duration::from_secs(3600)), "capped");
        let wall = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_400); // 07:26:40 GMT
        assert_eq!(
            parse_retry_after(" 30 ", wall),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", wall),
            Some(Duration::from_secs(80)),
            "an HTTP date is a delay from now"
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", wall),
            Some(Duration::ZERO),
            "a date in the past is no delay"
        );
        assert_eq!(parse_retry_after("soon", wall), None);
    }
}
