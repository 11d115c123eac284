//! The pool, the schema, the migrations, and the transaction helper.

use crate::util::RowExt;
use std::ops::Deref;
use std::sync::Arc;

use control_plane_core::fnv1a;
use control_plane_core::{Clock, StoreError, StoreOptions, StoreResult, Timestamp};
use control_plane_store_kit::migration::{self, Migration};
use control_plane_store_kit::sealing::SEALED_KEY_IDS;
use control_plane_store_kit::{Housekeeping, SecretKeys, Wakeup};
use deadpool_postgres::{Pool, StatementCache};

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
    (9, include_str!("migrations/0009_one_index_by_event.sql")),
    (
        10,
        include_str!("migrations/0010_write_each_delivery_once.sql"),
    ),
    (11, include_str!("migrations/0011_dashboard_sessions.sql")),
    (
        12,
        include_str!("migrations/0012_endpoint_filters_and_headers.sql"),
    ),
    (13, include_str!("migrations/0013_event_type_catalogue.sql")),
    (14, include_str!("migrations/0014_event_trace_context.sql")),
    (15, include_str!("migrations/0015_task_progress.sql")),
    (16, include_str!("migrations/0016_endpoint_oauth2.sql")),
    (17, include_str!("migrations/0017_counts_and_rollups.sql")),
    (18, include_str!("migrations/0018_example_events.sql")),
    (19, include_str!("migrations/0019_tasks_by_state.sql")),
    (20, include_str!("migrations/0020_endpoint_retry.sql")),
    (21, include_str!("migrations/0021_attempts_by_account.sql")),
    (22, include_str!("migrations/0022_portal_links.sql")),
    (23, include_str!("migrations/0023_endpoint_client_tls.sql")),
    (24, include_str!("migrations/0024_endpoint_transform.sql")),
];

/// The plan settings of the delivery path's transactions (claims,
/// keyless publishes, outcome batches), sent with their `BEGIN`:
/// - prepared statements run their cached generic plan instead of being
///   planned at every run (`plan_cache_mode`, set to custom for the session
///   in [`PostgresStore::open`] so that every other statement keeps the plan
///   made for its parameters): these statements take a few rows by key or
///   from `unnest` of their array parameters, whatever the values, and
///   planning them cost about as much as running them (ADR 0040: planning
///   was 43 % of the statement time of the HTTP user path);
/// - no sequential scan, and no hash or merge join: a generic plan is made
///   once per connection with the statistics of that moment, and one made
///   while the tables were small would scan whole tables (or whole indexes,
///   to hash them) at every run as they grow; every one of these
///   statements reads a few rows by index, so nested loops of index
///   lookups are always right (ADR 0020).
macro_rules! generic_plans {
    () => {
        "SET LOCAL plan_cache_mode TO force_generic_plan; SET LOCAL enable_seqscan TO off; \
         SET LOCAL enable_hashjoin TO off; SET LOCAL enable_mergejoin TO off"
    };
}

/// The postgres adapter: a connection pool plus the store's clock and policy.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: Pool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: StoreOptions,
    pub(crate) keys: Arc<SecretKeys>,
    pub(crate) schema: String,
    pub(crate) wakeup: Arc<Wakeup>,
    pub(crate) channel: String,
    /// Claims sweep expired leases and look for due probes only when this
    /// gate is open.
    pub(crate) housekeeping: Arc<Housekeeping>,
    /// What begins a transaction that records outcomes
    /// ([`PostgresConfig::synchronous_outcomes`]).
    pub(crate) begin_outcomes: &'static str,
    _listener: Option<Arc<Listener>>,
    /// The count of read-only errors ([`crate::error::READ_ONLY_SEEN`]) this
    /// store last acted on.
    read_only_acted: Arc<std::sync::atomic::AtomicU64>,
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
    /// A pooled connection. When a statement of this process has met a
    /// read-only server since the last call (a standby after a failover, a
    /// primary being demoted), the pool's idle connections are dropped
    /// first, so that the next ones are made anew: with
    /// `target_session_attrs=read-write` on the new primary.
    pub(crate) async fn client(&self) -> StoreResult<deadpool_postgres::Object> {
        use std::sync::atomic::Ordering::Relaxed;
        let seen = crate::error::READ_ONLY_SEEN.load(Relaxed);
        if self.read_only_acted.swap(seen, Relaxed) != seen {
            self.pool.retain(|_, _| false);
        }
        self.pool.get().await.map_err(map_pool)
    }

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
        pg.connect_timeout(config.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("control-plane");
        }
        crate::connection::sessions_are_their_own(&pg).await?;
        let pool = crate::connection::pool(&pg, &config, &schema)?;
        let wakeup = Arc::new(Wakeup::default());
        let channel = channel_for(&schema);
        let listener = config
            .listen
            .then(|| Arc::new(spawn(pg, channel.clone(), wakeup.clone())));
        let store = PostgresStore {
            pool,
            clock,
            options: config.options,
            keys: Arc::new(config.keys),
            schema,
            wakeup,
            channel,
            housekeeping: Arc::default(),
            begin_outcomes: if config.synchronous_outcomes {
                BEGIN_GENERIC
            } else {
                concat!(
                    "BEGIN; SET LOCAL synchronous_commit TO off; ",
                    generic_plans!()
                )
            },
            _listener: listener,
            read_only_acted: Arc::new(std::sync::atomic::AtomicU64::new(
                crate::error::READ_ONLY_SEEN.load(std::sync::atomic::Ordering::Relaxed),
            )),
        };
        store.migrate().await?;
        check_keys(&store).await?;
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
            .col(0)?;
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
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT version FROM schema_migrations ORDER BY version",
                &[],
            )
            .await
            .db()?;
        rows.iter().map(|r| r.col(0)).collect()
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
/// adapter. Its statements go to the connection the transaction is open on.
pub(crate) struct Tx<'a> {
    client: &'a tokio_postgres::Client,
    /// The pool's per-connection statement cache; `None` for a caller's own
    /// transaction ([`PostgresStore::publish_in`]).
    statements: Option<&'a StatementCache>,
    /// The clock's reading when the transaction began.
    pub now: Timestamp,
    /// Store-side policy.
    pub options: &'a StoreOptions,
    /// The keys credentials are sealed and opened with.
    pub keys: &'a SecretKeys,
    /// The gate of claim-time sweeps and probe searches.
    pub housekeeping: &'a Housekeeping,
}

impl<'a> Tx<'a> {
    /// The context of the transaction open on `client`, at store time `now`.
    pub(crate) fn new(
        client: &'a tokio_postgres::Client,
        statements: Option<&'a StatementCache>,
        store: &'a PostgresStore,
        now: Timestamp,
    ) -> Self {
        Tx {
            client,
            statements,
            now,
            options: &store.options,
            keys: &store.keys,
            housekeeping: &store.housekeeping,
        }
    }

    /// A statement prepared once per connection (planned at every run, see
    /// [`PostgresStore::open`]; the delivery path's transactions run its
    /// generic plan, see `generic_plans!`).
    pub(crate) async fn prepare_cached(
        &self,
        sql: &str,
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        match self.statements {
            Some(cache) => cache.prepare(self.client, sql).await,
            None => self.client.prepare(sql).await,
        }
    }
}

/// The settings a delivery claim's transaction starts with (ADR 0016), sent
/// with its `BEGIN`: its commit returns without waiting for its WAL to
/// reach the disk (`synchronous_commit = off`): the next fenced outcome's
/// synchronous commit flushes the claim with it, and a claim lost in a
/// crash only hands its deliveries out again, which at-least-once allows;
/// and the delivery path's plan settings (`generic_plans!`).
///
/// What it buys: claimers of one endpoint hold its flow-row lock for one
/// disk flush and one planning less. Public for the plan test.
pub const CLAIM_SETTINGS: &str = concat!("SET LOCAL synchronous_commit TO off; ", generic_plans!());

/// The delivery path's plan settings alone (see `generic_plans!`), for the
/// plan test.
#[cfg(test)]
pub(crate) const GENERIC_PLANS: &str = generic_plans!();

/// The `BEGIN` of a delivery-path transaction that commits as the server
/// is configured: keyless publishes, and outcome batches by default.
pub(crate) const BEGIN_GENERIC: &str = concat!("BEGIN; ", generic_plans!());

/// A transaction on a pooled connection that its user ends by sending
/// `COMMIT` itself, so the commit can go out pipelined with the last
/// statements instead of one round trip after them (a claim's flow-row
/// lock is then released by the server without waiting for the client,
/// ADR 0009). Dropped before [`PipelinedTx::ended`] (an error, a cancelled
/// future), it closes its connection instead of returning it to the pool,
/// and the server rolls the transaction back.
pub(crate) struct PipelinedTx {
    client: Option<deadpool_postgres::Object>,
}

impl PipelinedTx {
    /// A connection from the pool on which its user sends `BEGIN`, to
    /// pipeline it with the transaction's first statements.
    pub(crate) async fn connect(store: &PostgresStore) -> StoreResult<Self> {
        let client = store.client().await?;
        Ok(PipelinedTx {
            client: Some(client),
        })
    }

    /// The connection, while the transaction is open.
    pub(crate) fn client(&self) -> StoreResult<&deadpool_postgres::Object> {
        self.client
            .as_ref()
            .ok_or_else(|| StoreError::Backend("the transaction has ended".into()))
    }

    /// The user has committed: the connection goes back to the pool.
    pub(crate) fn ended(mut self) {
        drop(self.client.take());
    }
}

impl Drop for PipelinedTx {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Out of the pool and closed: the open transaction dies with it.
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

impl<'a> Deref for Tx<'a> {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &Self::Target {
        self.client
    }
}

/// Runs `$body` (an expression using the context `$t`, a [`Tx`]) in one
/// transaction from the pool and commits when it returns `Ok`. An async
/// closure cannot name the `Send` bound the trait's futures need, hence a
/// macro.
macro_rules! in_tx {
    ($store:expr, |$t:ident| $body:expr) => {{
        let mut client = $store.client().await?;
        let tx = client.transaction().await.map_err($crate::error::map)?;
        let out = {
            let $t = $crate::store::Tx::new(
                tx.client(),
                Some(&tx.statement_cache),
                $store,
                $store.now(),
            );
            $body.await?
        };
        tx.commit().await.map_err($crate::error::map)?;
        Ok::<_, control_plane_core::StoreError>(out)
    }};
}
pub(crate) use in_tx;

/// Refuses a store holding credentials sealed under keys it lacks.
async fn check_keys(store: &PostgresStore) -> StoreResult<()> {
    let client = store.client().await?;
    let rows = client.query(SEALED_KEY_IDS, &[]).await.db()?;
    let stored = rows
        .iter()
        .map(|r| r.col::<String>(0))
        .collect::<StoreResult<Vec<_>>>()?;
    store.keys.check_known(stored.iter().map(String::as_str))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn migration_lock_keys_differ_per_schema() {
        assert_ne!(migration_lock_key("a"), migration_lock_key("b"));
        assert_eq!(migration_lock_key("a"), migration_lock_key("a"));
    }

    /// A store on a schema of its own in the test database, with a pool of
    /// one connection, and a connection of its own to that database.
    pub(crate) async fn open_test_store() -> (PostgresStore, tokio_postgres::Client) {
        open_test_store_with(|_| {}).await
    }

    /// As [`open_test_store`], with `tweak` applied to its configuration.
    pub(crate) async fn open_test_store_with(
        tweak: impl FnOnce(&mut crate::PostgresConfig),
    ) -> (PostgresStore, tokio_postgres::Client) {
        let url = std::env::var("CONTROLPLANE_TEST_DATABASE_URL")
            .expect("CONTROLPLANE_TEST_DATABASE_URL names the test database");
        let schema = format!("cp_test_{}", uuid::Uuid::new_v4().simple());
        let mut config =
            crate::PostgresConfig::new(control_plane_store_kit::DatabaseUrl::new(&url));
        config.schema = Some(schema);
        config.pool_size = 1;
        config.listen = false;
        tweak(&mut config);
        let store = PostgresStore::open(config, Arc::new(control_plane_core::SystemClock))
            .await
            .unwrap();
        let (other, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        (store, other)
    }

    /// A [`PipelinedTx`] dropped before its user committed (an error, a
    /// cancelled claim) must not go back to the pool with its transaction,
    /// and the locks in it, still open.
    #[tokio::test]
    async fn a_pipelined_transaction_dropped_open_releases_its_locks() {
        let (store, other) = open_test_store().await;
        // The settings a claim changes, as the pool's connections start
        // with them (the server's defaults and the pool's own settings,
        // whatever the cluster was started with).
        let settings = "SELECT current_setting('synchronous_commit'), \
             current_setting('plan_cache_mode'), current_setting('enable_seqscan')";
        let read =
            |r: tokio_postgres::Row| -> (String, String, String) { (r.get(0), r.get(1), r.get(2)) };
        let before = read(
            store
                .pool
                .get()
                .await
                .unwrap()
                .query_one(settings, &[])
                .await
                .unwrap(),
        );
        assert_ne!(
            before.1, "force_generic_plan",
            "a fresh connection has the claim's setting already: this check could not fail"
        );
        let key = i64::from(uuid::Uuid::new_v4().as_fields().0);
        let tx = PipelinedTx::connect(&store).await.unwrap();
        let client = tx.client().unwrap();
        client
            .batch_execute(&format!("BEGIN; {CLAIM_SETTINGS}"))
            .await
            .unwrap();
        client
            .execute("SELECT pg_advisory_xact_lock($1)", &[&key])
            .await
            .unwrap();
        drop(tx);
        let mut free = false;
        for _ in 0..100 {
            let row = other
                .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key])
                .await
                .unwrap();
            if row.get::<_, bool>(0) {
                free = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(free, "the dropped transaction still holds its lock");
        // The pool (of one) hands out a connection outside any transaction:
        // every setting the claim changed reads as before it.
        let client = store.pool.get().await.unwrap();
        let after = read(client.query_one(settings, &[]).await.unwrap());
        assert_eq!(after, before, "a claim's settings outlived its transaction");
        other
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", store.schema()))
            .await
            .unwrap();
    }

    #[test]
    fn schema_names_are_checked() {
        assert!(valid_schema("cp_test_1"));
        assert!(!valid_schema("1abc"));
        assert!(!valid_schema("a;drop"));
        assert!(!valid_schema(""));
    }
}
