#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod config;
pub mod error;
pub mod flow;
pub mod hash;
pub mod maintenance;
pub mod migration;
pub mod model;
pub mod ops;
pub mod policy;
pub mod store;
pub mod telemetry;
pub mod types;
pub mod wakeup;
pub mod workflow;

pub use clock::{Clock, Housekeeping, ManualClock, SystemClock, Timestamp};
pub use config::{Config, ConfigError, StoreProfile};
pub use error::{StoreError, StoreResult};
pub use flow::{share_claim, FlowCandidate, RateBudget};
pub use ops::*;
pub use policy::{BreakerPolicy, Circuit, CircuitChange, CircuitMode, StoreOptions};
pub use store::{
    AccountKeyStore, AlertStore, AttemptLogStore, CircuitStore, ControlPlaneStore, DeliveryStore,
    DynControlPlaneStore, EndpointStore, IdempotencyStore, MaintenanceStore, TickStore, UsageStore,
    WorkflowStore,
};
pub use telemetry::{Telemetry, UsageMeter};
pub use types::*;
pub use wakeup::Wakeup;
pub use workflow::*;
