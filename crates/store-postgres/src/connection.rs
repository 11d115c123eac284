//! The store's connections: the pool, the settings each new connection
//! takes, and the check that every connection is a session of its own.

use control_plane_core::{StoreError, StoreResult};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::config::PostgresConfig;
use crate::error::PgResultExt;

/// What each new connection sets for its session: the store's schema, the
/// statement and idle-in-transaction timeouts, and plans made at every run.
/// Statements are prepared once per connection and, by default, planned at
/// every run: a generic plan made with early statistics drained claims at
/// 5,500/s instead of 13,000-16,000/s (ADR 0005). The delivery path's
/// transactions opt into generic plans written to be right whatever the
/// statistics (`generic_plans!`, ADR 0040).
///
/// Set by a statement on the new connection, not by the startup packet's
/// `options`: PgBouncer refuses a startup parameter it does not know
/// (`options` among them), or, told to ignore it, drops it, and the store
/// would run outside its schema.
const SESSION_SETTINGS: &str = "SELECT set_config('search_path', $1, false), \
     set_config('statement_timeout', $2, false), \
     set_config('idle_in_transaction_session_timeout', $2, false), \
     set_config('plan_cache_mode', 'force_custom_plan', false)";

/// The pool of `config`'s size over `pg`, each connection set up for
/// `schema`.
pub(crate) fn pool(
    pg: &tokio_postgres::Config,
    config: &PostgresConfig,
    schema: &str,
) -> StoreResult<Pool> {
    let manager = Manager::from_config(
        pg.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let schema = schema.to_string();
    let timeout_ms = config.statement_timeout.as_millis().to_string();
    Pool::builder(manager)
        .max_size(config.pool_size as usize)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(config.connect_timeout))
        .create_timeout(Some(config.connect_timeout))
        .recycle_timeout(Some(config.connect_timeout))
        .post_create(Hook::async_fn(move |client, _| {
            let (schema, timeout_ms) = (schema.clone(), timeout_ms.clone());
            Box::pin(async move {
                client
                    .execute(SESSION_SETTINGS, &[&schema, &timeout_ms])
                    .await
                    .map(|_| ())
                    .map_err(HookError::Backend)
            })
        }))
        .build()
        .map_err(|e| StoreError::InvalidInput(format!("connection pool: {e}")))
}

/// Refuses a connection pooler in transaction or statement mode (PgBouncer's
/// `pool_mode = transaction`): the store keeps session state (prepared
/// statements per connection, the wake-up connection's listen, session
/// advisory locks while migrating), which such a pooler hands to another
/// client between transactions. Two connections are opened and asked for
/// their server process one after the other, both held open: directly or
/// through a pooler in session mode they are two sessions with two pids; a
/// pooler that shares sessions gives the second the first's server
/// connection (PgBouncer reuses the last used one first, its default).
pub(crate) async fn sessions_are_their_own(pg: &tokio_postgres::Config) -> StoreResult<()> {
    let (_first, a) = backend_pid(pg).await?;
    let (_second, b) = backend_pid(pg).await?;
    if a == b {
        return Err(StoreError::InvalidInput(format!(
            "CONTROLPLANE_DATABASE_URL leads to a connection pooler in transaction or statement \
             mode: two connections shared one server session (pid {a}). The store keeps session \
             state (prepared statements, its wake-up listener, advisory locks); point it at \
             PgBouncer in session mode (pool_mode = session) or at PostgreSQL itself"
        )));
    }
    Ok(())
}

/// A new connection and the pid of the server process it talks to.
async fn backend_pid(pg: &tokio_postgres::Config) -> StoreResult<(tokio_postgres::Client, String)> {
    let (client, conn) = pg.connect(NoTls).await.db()?;
    tokio::spawn(conn);
    // A simple query: nothing is prepared before the check.
    let rows = client.simple_query("SELECT pg_backend_pid()").await.db()?;
    let pid = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default();
    Ok((client, pid))
}
