//! The pool, the schema, the migrations, and the transaction helper.

use std::ops::Deref;
use std::sync::Arc;

use control_plane_core::hash::fnv1a;
use control_plane_core::migration::{self, Migration};
use control_plane_core::{
    Clock, Housekeeping, StoreError, StoreOptions, StoreResult, Timestamp, Wakeup,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, StatementCache};
use tokio_postgres::NoTls;

use crate::config::{valid_schema, PostgresConfig};
use crate::error::{map_pool, PgResultExt};
use crate::notify::{channel_for, spawn, Listener};

/// Embedded, versioned migrations, applied in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    (1, include_str!("migrations/0001_initial.sql")),
    (
        2,
        include_str!("migrations/0002_workflow_and_operations.sql"),
    ),
    (3, include_str!("migrations/0003_account_keys.sql")),
    (4, include_str!("migrations/0004_flow_control.sql")),
    (
        5,
        include_str!("migrations/0005_tasks_scoped_by_account.sql"),
    ),
    (6, include_str!("migrations/0006_retention_indexes.sql")),
    (7, include_str!("migrations/0007_events_by_account.sql")),
    (8, include_str!("migrations/0008_one_index_of_leases.sql")),
];

/// The postgres adapter: a connection pool plus the store's clock and policy.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: Pool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: StoreOptions,
    pub(crate) schema: String,
    pub(crate) wakeup: Arc<Wakeup>,
    pub(crate) channel: String,
    /// Claims sweep expired leases and look for due probes only when this
    /// gate is open.
    pub(crate) housekeeping: Arc<Housekeeping>,
    _listener: Option<Arc<Listener>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// A stable advisory-lock key for migrating `schema` (FNV-1a).
fn migration_lock_key(schema: &str) -> i64 {
    fnv1a("control-plane-migrate:".bytes().chain(schema.bytes())) as i64
}

impl PostgresStore {
    /// Builds the pool, creates the schema if needed and applies pending
    /// migrations under an advisory lock, so any number of processes may
    /// open at once.
    ///
    /// # Errors
    /// `InvalidInput` for a bad URL, schema or pool size; `Unavailable` when
    /// the server cannot be reached; `Backend` when a migration fails.
    pub async fn open(config: PostgresConfig, clock: Arc<dyn Clock>) -> StoreResult<Self> {
        let schema = config
            .schema
            .clone()
            .unwrap_or_else(|| "public".to_string());
        if !valid_schema(&schema) {
            return Err(StoreError::InvalidInput(format!(
                "schema must be 1 to 63 characters of a-z, 0-9 and '_', starting with a letter or '_', got {schema:?}"
            )));
        }
        if config.pool_size == 0 {
            return Err(StoreError::InvalidInput(
                "pool size must be at least 1".into(),
            ));
        }
        let mut pg: tokio_postgres::Config = config.url.expose().parse().map_err(|e| {
            StoreError::InvalidInput(format!(
                "CONTROLPLANE_DATABASE_URL {} is not a valid PostgreSQL URL: {e}",
                config.url.redacted()
            ))
        })?;
        let timeout_ms = config.statement_timeout.as_millis();
        // Hot statements are prepared once per connection (no parse round
        // trip), but planned at every execution: after five runs PostgreSQL
        // would otherwise switch to a generic plan, which for the claim
        // (`due_at <= $1 ... LIMIT $2`) drained about 5,500/s instead of
        // 13,000-16,000/s in the burn-down benchmark (ADR 0005).
        pg.options(format!(
            "-c search_path={schema} -c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={timeout_ms} \
             -c plan_cache_mode=force_custom_plan"
        ));
        pg.connect_timeout(config.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("control-plane");
        }
        let manager = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size as usize)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.connect_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.connect_timeout))
            .build()
            .map_err(|e| StoreError::InvalidInput(format!("connection pool: {e}")))?;
        let wakeup = Arc::new(Wakeup::default());
        let channel = channel_for(&schema);
        let listener = config
            .listen
            .then(|| Arc::new(spawn(pg, channel.clone(), wakeup.clone())));
        let store = PostgresStore {
            pool,
            clock,
            options: config.options,
            schema,
            wakeup,
            channel,
            housekeeping: Arc::default(),
            _listener: listener,
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> StoreResult<()> {
        let mut client = self.pool.get().await.map_err(map_pool)?;
        let tx = client.transaction().await.db()?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&migration_lock_key(&self.schema)],
        )
        .await
        .db()?;
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {0}; SET LOCAL search_path = {0}; \
             CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
            self.schema
        ))
        .await
        .db()?;
        let current: i64 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM schema_migrations",
                &[],
            )
            .await
            .db()?
            .get(0);
        let schema = format!("schema {}", self.schema);
        for (version, sql) in
            migration::pending(&schema, current, MIGRATIONS, self.options.migrations)?
        {
            tx.batch_execute(sql).await.map_err(|e| {
                StoreError::Backend(format!(
                    "migration {version} failed: {}",
                    crate::error::map(e)
                ))
            })?;
            tx.execute(
                "INSERT INTO schema_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .db()?;
        }
        tx.commit().await.db()
    }

    /// The schema this store lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The applied migration versions, oldest first.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached.
    pub async fn applied_migrations(&self) -> StoreResult<Vec<i64>> {
        let client = self.pool.get().await.map_err(map_pool)?;
        let rows = client
            .query(
                "SELECT version FROM schema_migrations ORDER BY version",
                &[],
            )
            .await
            .db()?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Wakes workers here and, best effort, on every replica (polling covers
    /// a lost notification); called after a commit that made work due.
    pub(crate) async fn wake(&self) {
        let _ = self.notify_committed().await;
    }
}

/// One transaction with the store time, options and housekeeping gate it
/// runs with: the context every area function takes, as in the embedded
/// adapter.
pub(crate) struct Tx<'a> {
    tx: &'a tokio_postgres::Transaction<'a>,
    /// The pool's per-connection statement cache; `None` for a caller's own
    /// transaction ([`PostgresStore::publish_in`]).
    statements: Option<&'a StatementCache>,
    /// The clock's reading when the transaction began.
    pub now: Timestamp,
    /// Store-side policy.
    pub options: &'a StoreOptions,
    /// The gate of claim-time sweeps and probe searches.
    pub housekeeping: &'a Housekeeping,
}

impl<'a> Tx<'a> {
    /// The context of `tx` at store time `now`.
    pub(crate) fn new(
        tx: &'a tokio_postgres::Transaction<'a>,
        statements: Option<&'a StatementCache>,
        store: &'a PostgresStore,
        now: Timestamp,
    ) -> Self {
        Tx {
            tx,
            statements,
            now,
            options: &store.options,
            housekeeping: &store.housekeeping,
        }
    }

    /// A statement prepared once per connection (planned at every run, see
    /// [`PostgresStore::open`]; a claim transaction runs its generic plan,
    /// see [`Tx::claim_settings`]).
    pub(crate) async fn prepare_cached(
        &self,
        sql: &str,
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        match self.statements {
            Some(cache) => cache.prepare(self.tx.client(), sql).await,
            None => self.tx.prepare(sql).await,
        }
    }

    /// The settings of a claim transaction (ADR 0016), in one round trip:
    /// - its commit returns without waiting for its WAL to reach the disk
    ///   (`synchronous_commit = off`): the next fenced outcome's synchronous
    ///   commit flushes the claim with it, and a claim lost in a crash only
    ///   hands its deliveries out again, which at-least-once allows;
    /// - its prepared statements run their cached generic plan instead of
    ///   being planned at every run (`plan_cache_mode`, set to custom for
    ///   the session in [`PostgresStore::open`]): the claim's statements take
    ///   one endpoint's index range each, whatever the parameters, and their
    ///   planning cost about as much as running them;
    /// - no sequential scan: a generic plan is made once per connection
    ///   with the statistics of that moment, and one made while the table
    ///   was small would scan the whole table at every claim as it grows;
    ///   every statement of the claim has an index for what it reads.
    ///
    /// What it buys: claimers of one endpoint hold its flow-row lock for one
    /// disk flush and one planning less.
    pub(crate) async fn claim_settings(&self) -> StoreResult<()> {
        self.tx
            .batch_execute(CLAIM_SETTINGS)
            .await
            .map_err(crate::error::map)
    }
}

/// The settings a delivery claim's transaction starts with (ADR 0016): its
/// commit does not wait for the disk, its prepared statements run their
/// generic plans, and none of them scans a whole table. Public for the plan
/// test.
pub const CLAIM_SETTINGS: &str = "SET LOCAL synchronous_commit TO off; \
     SET LOCAL plan_cache_mode TO force_generic_plan; SET LOCAL enable_seqscan TO off";

impl<'a> Deref for Tx<'a> {
    type Target = tokio_postgres::Transaction<'a>;
    fn deref(&self) -> &Self::Target {
        self.tx
    }
}

/// Runs `$body` (an expression using the context `$t`, a [`Tx`]) in one
/// transaction from the pool and commits when it returns `Ok`. An async
/// closure cannot name the `Send` bound the trait's futures need, hence a
/// macro.
macro_rules! in_tx {
    ($store:expr, |$t:ident| $body:expr) => {{
        let mut client = $store.pool.get().await.map_err($crate::error::map_pool)?;
        let tx = client.transaction().await.map_err($crate::error::map)?;
        let out = {
            let $t = $crate::store::Tx::new(&tx, Some(&tx.statement_cache), $store, $store.now());
            $body.await?
        };
        tx.commit().await.map_err($crate::error::map)?;
        Ok::<_, control_plane_core::StoreError>(out)
    }};
}
pub(crate) use in_tx;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_lock_keys_differ_per_schema() {
        assert_ne!(migration_lock_key("a"), migration_lock_key("b"));
        assert_eq!(migration_lock_key("a"), migration_lock_key("a"));
    }

    #[test]
    fn schema_names_are_checked() {
        assert!(valid_schema("cp_test_1"));
        assert!(!valid_schema("1abc"));
        assert!(!valid_schema("a;drop"));
        assert!(!valid_schema(""));
    }
}
