//! Every contract of the port as a plain async function, one file per area
//! over one `fixtures` module. Run them through
//! [`crate::conformance_suite!`]; each names the rustdoc bullet it enforces.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use control_plane_core::maintenance::run_maintenance;
use control_plane_core::*;
use control_plane_runtime::recover;
use serde_json::json;

use crate::{Harness, StoreFactory};

mod catalogue;
mod circuits;
mod delivery;
mod endpoints;
mod fairness;
mod fixtures;
mod history;
mod operations;
mod publish;
mod retention;
mod workflow;

pub use catalogue::*;
pub use circuits::*;
pub use delivery::*;
pub use endpoints::*;
pub use fairness::*;
use fixtures::*;
pub use history::*;
pub use operations::*;
pub use publish::*;
pub use retention::*;
pub use workflow::*;
