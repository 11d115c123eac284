//! The one place PostgreSQL and pool errors become [`StoreError`]s.

use control_plane_core::StoreError;
use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::SqlState;

/// Classifies a driver error by SQLSTATE, as every store call does; callers of
/// [`crate::PostgresStore::publish_in`] may use it for their own statements.
/// Serialization failure, deadlock, lock timeout and cancellation are `Busy`
/// (retryable), unique violation is `Conflict`, connection failures and server
/// shutdowns (`08xxx`, `57P0x`) are `Unavailable`, the rest `Backend`.
pub fn classify(e: tokio_postgres::Error) -> StoreError {
    map(e)
}

/// How many times a statement of this process met a read-only server
/// (SQLSTATE 25006): each store drops its idle connections when it sees the
/// count move, so that none stays on a server that no longer takes writes.
pub(crate) static READ_ONLY_SEEN: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Classifies a driver error by SQLSTATE.
pub(crate) fn map(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let msg = format!("{} ({})", db.message(), code.code());
        return if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::QUERY_CANCELED
        {
            StoreError::Busy(msg)
        } else if *code == SqlState::UNIQUE_VIOLATION {
            // The server's text names the constraint; a caller of the API
            // sees a conflict's message, so it says only what happened.
            StoreError::Conflict(
                "another request stored the same key at the same time; read it again (SQLSTATE 23505)".into(),
            )
        } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            // A standby, or a primary being demoted: the pool drops its
            // idle connections and reconnects (`PostgresStore::client`),
            // which with `target_session_attrs=read-write` finds the primary.
            READ_ONLY_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            StoreError::Unavailable(format!(
                "the server is read-only (a standby, or a primary being demoted); the service \
                 reconnects and looks for the primary: {msg}"
            ))
        } else if code.code().starts_with("08")
            || code.code().starts_with("57P")
            || *code == SqlState::TOO_MANY_CONNECTIONS
        {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Backend(format!("postgres: {msg}"))
        };
    }
    let text = e.to_string().to_ascii_lowercase();
    let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    if e.is_closed()
        || io
        || text.contains("connection")
        || text.contains("communicating with the server")
        || text.contains("io error")
    {
        return StoreError::Unavailable(format!("postgres connection lost: {e}"));
    }
    StoreError::Backend(format!("postgres: {e}"))
}

/// Classifies a pool error, saying which stage timed out.
pub(crate) fn map_pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(TimeoutType::Wait) => StoreError::Unavailable(
            "timed out waiting for a free connection in the pool; raise CONTROLPLANE_POOL_SIZE or lower the load".into(),
        ),
        PoolError::Timeout(TimeoutType::Create) => StoreError::Unavailable(
            "timed out connecting to PostgreSQL; check that the server is up and CONTROLPLANE_DATABASE_URL".into(),
        ),
        PoolError::Timeout(TimeoutType::Recycle) => {
            StoreError::Unavailable("timed out checking a pooled connection".into())
        }
        PoolError::Backend(e) => map(e),
        PoolError::Closed => StoreError::Unavailable("the connection pool is closed".into()),
        other => StoreError::Unavailable(format!("connection pool: {other}")),
    }
}

/// `?` on driver results.
pub(crate) trait PgResultExt<T> {
    fn db(self) -> Result<T, StoreError>;
}

impl<T> PgResultExt<T> for Result<T, tokio_postgres::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(map)
    }
}
