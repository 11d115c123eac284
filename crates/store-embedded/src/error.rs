//! The one place DuckDB errors become [`StoreError`]s.

use control_plane_core::StoreError;

/// Maps a DuckDB error. Lock failures on open are handled in `store.rs`,
/// where the path is known.
pub(crate) fn map(e: duckdb::Error) -> StoreError {
    let text = e.to_string();
    if text.contains("Could not set lock") {
        StoreError::Unavailable(format!(
            "the embedded store file is in use by another process ({text}); the embedded profile runs one process per file: stop the other process, or use CONTROLPLANE_STORE=postgres for several replicas"
        ))
    } else {
        StoreError::Backend(format!("duckdb: {text}"))
    }
}

/// `?` on DuckDB results inside the writer.
pub(crate) trait DuckResultExt<T> {
    fn db(self) -> Result<T, StoreError>;
}

impl<T> DuckResultExt<T> for Result<T, duckdb::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(map)
    }
}
