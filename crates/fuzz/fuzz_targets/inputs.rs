//! The small parsers of outside input: endpoint URLs, account names, task
//! ids, durations, CIDRs, ids from paths and publish requests. None may panic.
#![no_main]

#[path = "../../control-plane/src/config.rs"]
#[allow(dead_code)]
mod config;

use config::parse_duration;
use control_plane_core::{
    validate_endpoint_url, AccountId, Check, DeliveryId, DeliveryState, EndpointId, PublishRequest,
    TaskId, Timestamp,
};
use dispatcher::Cidr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let _ = validate_endpoint_url(&s);
    let _ = AccountId::new(s.as_ref());
    let _ = TaskId::new(s.as_ref());
    let _ = parse_duration(&s);
    let _ = Cidr::parse(&s);
    let _ = s.parse::<EndpointId>();
    let _ = s.parse::<DeliveryId>();
    let _ = s.parse::<DeliveryState>();
    if let Ok(account) = AccountId::new("fuzz") {
        let payload = serde_json::from_slice(data).unwrap_or(serde_json::Value::Null);
        let req = PublishRequest {
            account,
            event_type: s.chars().take(300).collect(),
            payload,
            idempotency_key: Some(s.to_string()),
            traceparent: None,
        };
        if let Ok(req) = req.checked() {
            let body = req.body(Timestamp::from_millis(0));
            assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok());
        }
    }
});
