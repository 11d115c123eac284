#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod classify;
mod http;
pub mod metrics;
mod pump;
pub mod signing;
pub mod ssrf;
pub mod tasks;
pub mod worker;

pub use classify::{classify, RetryPolicy, SendResult};
pub use metrics::DeliveryMetrics;
pub use tasks::{TaskError, TaskReport, TaskResult, TaskRunner, TaskRunnerConfig};
pub use worker::{DispatchReport, Dispatcher, DispatcherConfig};
