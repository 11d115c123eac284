//! Settings of the embedded adapter.

use std::path::PathBuf;

use control_plane_core::StoreOptions;
use control_plane_store_kit::SecretKeys;

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
    /// Live (pending or leased) deliveries the writer indexes in memory at
    /// most, about 450 bytes each with their rows (ADR 0028); past it,
    /// claims scan the table and read their rows back instead. `0` never
    /// keeps the index.
    pub live_index_limit: usize,
    /// Pending deliveries of one endpoint the live index keeps at most, by
    /// lowest seq (ADR 0028): a backlog that waits beyond it stays in the
    /// table, counted, and is read a window at a time as its endpoint is
    /// served. At least 1.
    pub live_window: usize,
    /// Compare what the writer keeps in memory (the live index and its
    /// rows, the finished-delivery tally, the endpoint, circuit and event
    /// caches) with the tables at every use, and fail the call on a
    /// difference (ADR 0028). For tests: every check rereads what it checks,
    /// which made each claim of a debug build scan the live queue (issue
    /// 54). Off by default.
    pub check_against_table: bool,
}

/// The default [`EmbeddedConfig::live_index_limit`]: a quarter of a million
/// live deliveries, about 110 MB.
pub const DEFAULT_LIVE_INDEX_LIMIT: usize = 250_000;

/// The default [`EmbeddedConfig::live_window`]: five claims of the largest
/// size (1,000) per endpoint.
pub const DEFAULT_LIVE_WINDOW: usize = 5_000;

impl EmbeddedConfig {
    /// Default options at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        EmbeddedConfig {
            path: path.into(),
            options: StoreOptions::default(),
            keys: SecretKeys::default(),
            live_index_limit: DEFAULT_LIVE_INDEX_LIMIT,
            live_window: DEFAULT_LIVE_WINDOW,
            check_against_table: false,
        }
    }
}
