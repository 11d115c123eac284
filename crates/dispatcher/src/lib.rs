#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
pub mod classify;
mod context;
mod http;
pub mod metrics;
mod oauth2;
pub mod outcome;
mod pace;
mod pump;
pub mod retry;
pub mod signing;
pub mod ssrf;
pub mod tasks;
pub mod transform;
mod turns;
pub mod worker;

pub use classify::{classify, SendResult};
pub use http::Proxy;
pub use metrics::DeliveryMetrics;
pub use retry::RetryPolicy;
pub use ssrf::Cidr;
pub use tasks::{Progress, TaskError, TaskReport, TaskResult, TaskRunner, TaskRunnerConfig};
pub use transform::TransformRunner;
pub use worker::{DispatchReport, Dispatcher, DispatcherConfig, OUTCOME_FILL, OUTCOME_LINGER};

/// Runs the answer parsers (the head of an HTTP answer, and the framing of
/// a chunked body) over `bytes`, for the fuzz target `answers`: neither may
/// panic on anything a receiver sends.
#[doc(hidden)]
pub fn parse_answer_for_fuzzing(bytes: &[u8]) {
    http::parse_for_fuzzing(bytes);
}
