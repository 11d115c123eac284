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
//! - [`schemas`]: the publish's schema checks, with the compiled schemas cached.
//! - [`migration`]: which numbered migrations a store still needs.
//! - [`DatabaseUrl`]: a PostgreSQL URL that never shows its password.
//!
//! Only the adapters, the binary that wires them (it loads the keys) and
//! their tests depend on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod columns;
mod database_url;
pub mod housekeeping;
pub mod migration;
pub mod schemas;
pub mod sealing;
pub mod wakeup;

pub use database_url::DatabaseUrl;
pub use housekeeping::Housekeeping;
pub use sealing::{SecretKey, SecretKeys, StoredCredentials};
pub use wakeup::Wakeup;
