//! Settings of the embedded adapter.

use std::path::PathBuf;

use control_plane_core::{SecretKeys, StoreOptions};

/// Where and how to open the embedded store.
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// The DuckDB file; created when missing.
    pub path: PathBuf,
    /// Store-side policy.
    pub options: StoreOptions,
    /// The keys endpoint credentials are sealed with (ADR 0022); none by
    /// default (plain text).
    pub keys: SecretKeys,
}

impl EmbeddedConfig {
    /// Default options at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        EmbeddedConfig {
            path: path.into(),
            options: StoreOptions::default(),
            keys: SecretKeys::default(),
        }
    }
}
