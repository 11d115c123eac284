//! What the dispatcher's test files share: an embedded store in a
//! temporary directory.

use std::sync::Arc;

use control_plane_core::{DynControlPlaneStore, SystemClock};
use store_embedded::{EmbeddedConfig, EmbeddedStore};

/// An embedded store in `dir`, opened with the defaults after `configure`
/// has changed what the test needs.
pub async fn embedded_store(
    dir: &tempfile::TempDir,
    configure: impl FnOnce(&mut EmbeddedConfig),
) -> DynControlPlaneStore {
    let mut cfg = EmbeddedConfig::new(dir.path().join("s.duckdb"));
    configure(&mut cfg);
    Arc::new(
        EmbeddedStore::open(cfg, Arc::new(SystemClock))
            .await
            .unwrap(),
    )
}
