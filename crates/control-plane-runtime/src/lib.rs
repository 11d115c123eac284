//! What runs beside the port (`control-plane-core`), shared by the API, the
//! dispatcher and the binary, so that core stays the port, its types and
//! its pure rules (issue 58):
//!
//! - [`group::GroupCommit`], the batcher of the API's publisher and the
//!   dispatcher's completion recorder;
//! - [`usage::UsageMeter`], which accumulates usage and writes it in batches;
//! - [`trace`], the bridge between a stored `traceparent` and `tracing` spans;
//! - the use cases run as workflow tasks: [`recover::recover`] and
//!   [`erasure::erase`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod erasure;
pub mod group;
pub mod recover;
pub mod trace;
pub mod usage;

pub use erasure::erase;
pub use group::{GroupCommit, Linger};
pub use recover::recover;
pub use usage::UsageMeter;
