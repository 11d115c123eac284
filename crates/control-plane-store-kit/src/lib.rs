//! What both store adapters share below the port (issue 58): the port
//! itself and its rules are in `control-plane-core`; this crate holds the
//! machinery that each adapter would otherwise write again.
//!
//! - [`sealing`]: endpoint credentials encrypted at rest, and the SQL that
//!   finds and reseals them (ADR 0022).
//! - [`wakeup`]: the in-process wake-up channel behind
//!   `DeliveryStore::delivery_wakeups`.
//! - [`columns`]: the column lists both adapters select and read back by
//!   position.
//! - [`housekeeping`]: the gate of the claim path's periodic work.
//!
//! Only the adapters, the binary that wires them (it loads the keys) and
//! their tests depend on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod columns;
pub mod housekeeping;
pub mod sealing;
pub mod wakeup;

pub use housekeeping::Housekeeping;
pub use sealing::{SecretKey, SecretKeys, StoredCredentials};
pub use wakeup::Wakeup;
