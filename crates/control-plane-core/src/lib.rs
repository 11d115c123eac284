#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod account_key;
pub mod alert;
pub mod attempt;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod endpoint;
pub mod error;
pub mod flow;
pub mod hash;
pub mod idempotency;
pub mod maintenance;
pub mod migration;
pub mod model;
pub mod policy;
pub mod store;
pub mod tick;
pub mod types;
pub mod usage;
pub mod wakeup;
pub mod workflow;

pub use account_key::*;
pub use alert::*;
pub use attempt::*;
pub use clock::{Clock, Housekeeping, ManualClock, SystemClock, Timestamp};
pub use config::{Config, ConfigError, StoreProfile};
pub use delivery::*;
pub use endpoint::*;
pub use error::{StoreError, StoreResult};
pub use flow::{share_claim, FlowCandidate, RateBudget};
pub use idempotency::*;
pub use maintenance::PurgeReport;
pub use policy::{BreakerPolicy, Circuit, CircuitChange, CircuitMode, StoreOptions};
pub use store::{
    AccountKeyStore, AlertStore, AttemptLogStore, CircuitStore, ControlPlaneStore, DeliveryStore,
    DynControlPlaneStore, EndpointStore, IdempotencyStore, MaintenanceStore, TickStore, UsageStore,
    WorkflowStore,
};
pub use tick::*;
pub use types::*;
pub use usage::*;
pub use wakeup::Wakeup;
pub use workflow::*;
