//! Settings of the postgres adapter.

use std::time::Duration;

use control_plane_core::StoreOptions;
use control_plane_store_kit::DatabaseUrl;
use control_plane_store_kit::SecretKeys;

/// How to reach PostgreSQL and size the pool.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// Connection URL (`Debug` hides the password).
    pub url: DatabaseUrl,
    /// Connections in the pool.
    pub pool_size: u32,
    /// Schema for every table (created if missing); `None` uses `public`.
    /// Tests give each store its own.
    pub schema: Option<String>,
    /// How long a call waits for a pooled connection or a new one.
    pub connect_timeout: Duration,
    /// Server-side `statement_timeout` and `idle_in_transaction_session_timeout`.
    pub statement_timeout: Duration,
    /// Store-side policy.
    pub options: StoreOptions,
    /// Whether to LISTEN for other replicas' wake-ups (on by default; off,
    /// workers on this store find others' work by polling only).
    pub listen: bool,
    /// The keys endpoint credentials are sealed with (ADR 0022); none by
    /// default (plain text).
    pub keys: SecretKeys,
    /// Whether the commits of delivery outcomes wait for the disk (ADR
    /// 0034). On by default; off, a crash of PostgreSQL itself may lose the
    /// outcomes of its last moments (their deliveries are sent again, and
    /// those attempts are missing from the log). Publishes, replays and
    /// operator actions always wait.
    pub synchronous_outcomes: bool,
}

impl PostgresConfig {
    /// Defaults for `url`: 16 connections, schema `public`, 5 s to connect, 30 s per statement,
    /// outcomes committed as the server's `synchronous_commit` says.
    pub fn new(url: DatabaseUrl) -> Self {
        PostgresConfig {
            url,
            pool_size: 16,
            schema: None,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            options: StoreOptions::default(),
            listen: true,
            keys: SecretKeys::default(),
            synchronous_outcomes: true,
        }
    }
}

/// Checks a schema name: it is spliced into `search_path` and DDL.
pub(crate) fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
