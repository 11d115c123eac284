//! The embedded store: one DuckDB connection owned by one writer thread.
//!
//! Every call is a closure sent over a channel to that thread and runs in its
//! own transaction there, so there is exactly one writer: DuckDB's optimistic
//! concurrency never sees two transactions touch one row, and no
//! transaction-conflict error can reach a caller (ADR 0003). The connection
//! never runs on a tokio worker thread.

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use control_plane_core::Migrations;
use control_plane_core::{
    Clock, DeliveryId, DeliveryListRequest, EndpointId, StoreError, StoreOptions, StoreResult,
    Timestamp,
};
use control_plane_store_kit::migration::{self, Migration};
use control_plane_store_kit::sealing::SEALED_KEY_IDS;
use control_plane_store_kit::{Housekeeping, SecretKeys};
use duckdb::Connection;
use tokio::sync::oneshot;

use crate::cache::{
    Caches, CircuitCache, EventCache, FanOutCache, SchemaCache, SenderCache, SeqCache,
};
use crate::config::EmbeddedConfig;
use crate::error::DuckResultExt;
use crate::finished::{Counts, FinishedTally};
use crate::live::{EndpointQueue, LiveBounds, LiveIndex, LiveRow};

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
    (6, include_str!("migrations/0006_dashboard_sessions.sql")),
    (
        7,
        include_str!("migrations/0007_endpoint_filters_and_headers.sql"),
    ),
    (8, include_str!("migrations/0008_event_type_catalogue.sql")),
    (9, include_str!("migrations/0009_event_trace_context.sql")),
    (10, include_str!("migrations/0010_task_progress.sql")),
    (11, include_str!("migrations/0011_endpoint_oauth2.sql")),
    (12, include_str!("migrations/0012_attempt_rollup.sql")),
    (13, include_str!("migrations/0013_dead_letters.sql")),
    (14, include_str!("migrations/0014_example_events.sql")),
    (15, include_str!("migrations/0015_endpoint_retry.sql")),
    (16, include_str!("migrations/0016_portal_links.sql")),
    (17, include_str!("migrations/0017_endpoint_client_tls.sql")),
    (18, include_str!("migrations/0018_endpoint_transform.sql")),
];

/// Statements kept prepared: more than the adapter has, so none is evicted.
const STATEMENT_CACHE: usize = 256;

/// Durable counters (sequence numbers, log positions), kept in memory by the
/// writer: `(last value handed out, highest value reserved in the table)`.
/// A counter reserves [`COUNTER_BLOCK`] values at a time, saved in the
/// transaction that first uses the block, so most transactions write no
/// counter row; after a restart a counter goes on from its reservation, and
/// the values a crash left unused are skipped, never handed out twice.
type Counters = std::collections::BTreeMap<String, (i64, i64)>;

/// Values a counter reserves at a time.
const COUNTER_BLOCK: i64 = 1_000;

type Job = Box<dyn FnOnce(&mut Writer) + Send>;

/// Which queue of the writer a call waits in (ADR 0023).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A caller waiting on an answer: API requests (publishes, reads,
    /// operator actions).
    Request,
    /// The workers' own bookkeeping: claims, outcomes, leases, ticks,
    /// maintenance, usage.
    Work,
}

/// The writer's two queues: a request runs before queued work, and after
/// [`Lanes::REQUESTS_IN_A_ROW`] request(s) in a row one waiting piece of
/// work runs, so neither lane starves (ADR 0023: with more requests in a
/// row, deliveries fell behind publishes).
struct Lanes<J> {
    request: std::collections::VecDeque<J>,
    work: std::collections::VecDeque<J>,
    requests_in_a_row: usize,
}

impl<J> Default for Lanes<J> {
    fn default() -> Self {
        Lanes {
            request: std::collections::VecDeque::new(),
            work: std::collections::VecDeque::new(),
            requests_in_a_row: 0,
        }
    }
}

impl<J> Lanes<J> {
    const REQUESTS_IN_A_ROW: usize = 1;

    fn push(&mut self, lane: Lane, job: J) {
        match lane {
            Lane::Request => self.request.push_back(job),
            Lane::Work => self.work.push_back(job),
        }
    }

    fn is_empty(&self) -> bool {
        self.request.is_empty() && self.work.is_empty()
    }

    /// The job to run next.
    fn next(&mut self) -> Option<J> {
        let work_first = self.request.is_empty()
            || (!self.work.is_empty() && self.requests_in_a_row >= Self::REQUESTS_IN_A_ROW);
        if work_first {
            self.requests_in_a_row = 0;
            self.work.pop_front()
        } else {
            self.requests_in_a_row += 1;
            self.request.pop_front()
        }
    }
}

/// Runs the jobs of `rx` on `writer` by [`Lanes`] until every sender is gone
/// and every queued job has run.
fn run_jobs<W, J: FnOnce(&mut W)>(rx: &mpsc::Receiver<(Lane, J)>, writer: &mut W) {
    let mut lanes = Lanes::default();
    loop {
        if lanes.is_empty() {
            match rx.recv() {
                Ok((lane, job)) => lanes.push(lane, job),
                Err(_) => return,
            }
        }
        while let Ok((lane, job)) = rx.try_recv() {
            lanes.push(lane, job);
        }
        if let Some(job) = lanes.next() {
            job(writer);
        }
    }
}

/// The state the writer thread owns.
pub(crate) struct Writer {
    conn: Connection,
    clock: Arc<dyn Clock>,
    options: StoreOptions,
    keys: SecretKeys,
    counters: Counters,
    housekeeping: Housekeeping,
    seqs: SeqCache,
    caches: Caches,
    events: EventCache,
    live: LiveIndex,
    live_bounds: LiveBounds,
    finished: FinishedTally,
    check_against_table: bool,
}

/// One transaction on the writer, with the time it runs at.
pub(crate) struct Tx<'a> {
    tx: duckdb::Transaction<'a>,
    /// The clock's reading when the transaction began.
    pub now: Timestamp,
    /// Store-side policy.
    pub options: StoreOptions,
    /// The keys credentials are sealed and opened with.
    pub keys: &'a SecretKeys,
    counters: &'a mut Counters,
    dirty: Vec<&'static str>,
    /// The gate of claim-time sweeps and probe searches.
    pub housekeeping: &'a Housekeeping,
    /// Seqs of leased deliveries.
    pub seqs: &'a mut SeqCache,
    /// Schemas of published types.
    pub schemas: &'a mut SchemaCache,
    /// The endpoints publishes fan out to.
    pub fan_out: &'a mut FanOutCache,
    /// The endpoints' circuits.
    pub circuits: &'a mut CircuitCache,
    /// What claims read of endpoints.
    pub senders: &'a mut SenderCache,
    /// What sends need of events.
    pub events: &'a mut EventCache,
    /// The live queue's index: every write that changes a live delivery
    /// tells it, or [`LiveIndex::forget`]s it ([`Tx::live_mut`]).
    live: &'a mut LiveIndex,
    live_bounds: LiveBounds,
    /// Whether this transaction changed or built the index: if it fails,
    /// the index is thrown away.
    live_touched: &'a mut bool,
    /// The finished deliveries by account and state: every write that moves
    /// a delivery into or out of a finished state tells it
    /// ([`Tx::finished_mut`]).
    finished: &'a mut FinishedTally,
    /// As `live_touched`, for the tally.
    finished_touched: &'a mut bool,
    /// Whether what the writer keeps in memory is compared with the tables
    /// at every use ([`crate::EmbeddedConfig::check_against_table`]).
    pub check_against_table: bool,
}

impl<'a> Deref for Tx<'a> {
    type Target = duckdb::Transaction<'a>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl Tx<'_> {
    /// Runs one statement. Every statement of the adapter goes through the
    /// connection's statement cache (these three methods shadow the
    /// transaction's uncached ones): DuckDB parses, binds and plans a
    /// statement once per process, not once per call.
    pub fn execute<P: duckdb::Params>(&self, sql: &str, params: P) -> duckdb::Result<usize> {
        self.tx.prepare_cached(sql)?.execute(params)
    }

    /// The first row of a query, mapped by `f`; see [`Tx::execute`].
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> duckdb::Result<T>
    where
        P: duckdb::Params,
        F: FnOnce(&duckdb::Row<'_>) -> duckdb::Result<T>,
    {
        self.tx.prepare_cached(sql)?.query_row(params, f)
    }

    /// A cached prepared statement; see [`Tx::execute`].
    pub fn prepare(&self, sql: &str) -> duckdb::Result<duckdb::CachedStatement<'_>> {
        self.tx.prepare_cached(sql)
    }

    /// The next value of counter `name`: strictly increasing, also across
    /// restarts, its reservation durable with the transaction that uses it.
    pub fn next(&mut self, name: &'static str) -> i64 {
        let (value, reserved) = self.counters.entry(name.to_string()).or_insert((0, 0));
        *value += 1;
        if *value > *reserved {
            *reserved = value.saturating_add(COUNTER_BLOCK - 1);
            if !self.dirty.contains(&name) {
                self.dirty.push(name);
            }
        }
        *value
    }

    /// The live deliveries by endpoint, from the writer's index ([`LiveIndex`]);
    /// `None` while there are too many to keep in memory.
    pub fn live_queues(&mut self) -> StoreResult<Option<&HashMap<EndpointId, EndpointQueue>>> {
        // Building reads this transaction's own writes: it counts as a change.
        if !self.live.is_built() {
            *self.live_touched = true;
        }
        self.live.queues(
            &self.tx,
            self.now,
            self.live_bounds,
            self.check_against_table,
        )
    }

    /// Reads the next window of `endpoint`'s pending deliveries into the
    /// live index ([`LiveIndex::refill`]).
    pub fn live_refill(&mut self, endpoint: EndpointId) -> StoreResult<()> {
        *self.live_touched = true;
        self.live.refill(&self.tx, endpoint)
    }

    /// The row of every live delivery, from the writer's index; `None`
    /// while there are too many to keep in memory.
    pub fn live_rows(&mut self) -> StoreResult<Option<&HashMap<DeliveryId, LiveRow>>> {
        if self.live_queues()?.is_none() {
            return Ok(None);
        }
        Ok(self.live.rows())
    }

    /// The finished deliveries by account and state, from the writer's
    /// tally ([`FinishedTally`]), counted from the table first when needed.
    pub fn finished_counts(&mut self) -> StoreResult<&Counts> {
        // Counting reads this transaction's own writes: it counts as a change.
        if !self.finished.is_built() {
            *self.finished_touched = true;
        }
        self.finished.counts(&self.tx, self.check_against_table)
    }

    /// The seqs of a page of the request's dead letters, newest first
    /// ([`FinishedTally::dead_page`]).
    pub fn dead_page(&mut self, req: &DeliveryListRequest) -> StoreResult<Vec<i64>> {
        // Reading the table reads this transaction's own writes: a change.
        *self.finished_touched |= !self.finished.dead_is_built();
        let (account, before, n) = (&req.account, req.page.after(), req.page.limit() as usize);
        let check = self.check_against_table;
        self.finished
            .dead_page(&self.tx, account, before, n + 1, check)
    }

    /// The finished-delivery tally, to change along with the table.
    pub fn finished_mut(&mut self) -> &mut FinishedTally {
        *self.finished_touched = true;
        self.finished
    }

    /// The live index, to read.
    pub fn live(&self) -> &LiveIndex {
        self.live
    }

    /// The live index, to change along with the table.
    pub fn live_mut(&mut self) -> &mut LiveIndex {
        *self.live_touched = true;
        self.live
    }

    /// The highest delivery sequence number handed out so far (or
    /// reserved before a restart), `None` before the first.
    pub fn last_seq(&self) -> Option<i64> {
        self.counters.get("delivery_seq").map(|(value, _)| *value)
    }

    /// The next delivery sequence number.
    pub fn next_seq(&mut self) -> i64 {
        self.next("delivery_seq")
    }

    /// The next attempt-log position.
    pub fn next_attempt_id(&mut self) -> i64 {
        self.next("attempt_id")
    }

    fn commit(self) -> StoreResult<()> {
        for name in &self.dirty {
            let value = self
                .counters
                .get(*name)
                .map_or(0, |(_, reserved)| *reserved);
            self.execute(
                "UPDATE counters SET value = $1 WHERE name = $2",
                duckdb::params![value, name],
            )
            .db()?;
        }
        self.tx.commit().db()
    }
}

impl Writer {
    /// Runs `f` in one transaction: commits on `Ok`, rolls back on `Err`.
    pub fn tx<T>(&mut self, f: impl FnOnce(&mut Tx<'_>) -> StoreResult<T>) -> StoreResult<T> {
        let saved = self.counters.clone();
        let marks = self.caches.marks();
        let housekept = self.housekeeping.mark();
        let mut live_touched = false;
        let mut finished_touched = false;
        let now = self.clock.now();
        let result = (|| {
            let tx = self.conn.transaction().db()?;
            let mut t = Tx {
                tx,
                now,
                options: self.options,
                keys: &self.keys,
                counters: &mut self.counters,
                dirty: Vec::new(),
                housekeeping: &self.housekeeping,
                seqs: &mut self.seqs,
                schemas: &mut self.caches.schemas,
                fan_out: &mut self.caches.fan_out,
                circuits: &mut self.caches.circuits,
                senders: &mut self.caches.senders,
                events: &mut self.events,
                live: &mut self.live,
                live_bounds: self.live_bounds,
                live_touched: &mut live_touched,
                finished: &mut self.finished,
                finished_touched: &mut finished_touched,
                check_against_table: self.check_against_table,
            };
            let v = f(&mut t)?;
            t.commit()?;
            Ok(v)
        })();
        // A failed transaction may have left what it changed in memory but
        // not in the file; what it only read is still right (a refused
        // publish must not cost the next claim a rebuild).
        if result.is_err() {
            self.counters = saved;
            self.caches.reset_changed(marks);
            // The sweep or probe search it found due was rolled back too.
            self.housekeeping.restore(housekept);
            if live_touched {
                self.live.forget();
            }
            if finished_touched {
                self.finished.forget();
            }
        }
        result
    }
}

fn open_connection(path: &Path) -> StoreResult<Connection> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(StoreError::InvalidInput(format!(
                "the directory of the embedded store file {} does not exist; create it or set CONTROLPLANE_EMBEDDED_PATH",
                path.display()
            )));
        }
    }
    let conn = Connection::open(path).map_err(|e| match crate::error::map(e) {
        StoreError::Backend(m) => StoreError::Unavailable(format!(
            "cannot open the embedded store file {}: {m}",
            path.display()
        )),
        other => other,
    })?;
    keep_private(path)?;
    // Every statement of the adapter is small and runs on the one writer
    // thread: DuckDB's worker threads only add wake-ups (ADR 0028 measured
    // 10 % more publishes with one thread).
    conn.execute_batch("SET threads = 1").db()?;
    Ok(conn)
}

/// Makes the store's file and its write-ahead log readable and writable by
/// this user only (mode 0600): they hold signing secrets and payloads,
/// and DuckDB creates them with the process's umask.
fn keep_private(path: &Path) -> StoreResult<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut wal = path.as_os_str().to_owned();
    wal.push(".wal");
    for file in [path.to_path_buf(), std::path::PathBuf::from(wal)] {
        if !file.exists() {
            continue;
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot make the embedded store file {} private (mode 0600): {e}",
                file.display()
            ))
        })?;
    }
    Ok(())
}

pub(crate) fn migrate(conn: &mut Connection, policy: Migrations) -> StoreResult<()> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .db()?;
    let current: i64 = conn
        .query_row(
            "SELECT coalesce(max(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .db()?;
    for (version, sql) in
        migration::pending("the embedded store file", current, MIGRATIONS, policy)?
    {
        let tx = conn.transaction().db()?;
        tx.execute_batch(sql).db()?;
        tx.execute("INSERT INTO schema_version VALUES ($1)", [version])
            .db()?;
        tx.commit().db()?;
    }
    Ok(())
}

/// The embedded adapter. Cheap to share behind an `Arc`; dropping the last
/// handle finishes queued calls, closes the file and releases its lock.
pub struct EmbeddedStore {
    pub(crate) wakeup: control_plane_store_kit::Wakeup,
    jobs: Option<mpsc::Sender<(Lane, Job)>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store file, migrates it, and starts the
    /// writer thread.
    ///
    /// # Errors
    /// `Unavailable` when another process holds the file (DuckDB allows one
    /// writer process per file) or it cannot be opened; `InvalidInput` when
    /// its directory does not exist.
    pub async fn open(config: EmbeddedConfig, clock: Arc<dyn Clock>) -> StoreResult<Self> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (jobs, rx) = mpsc::channel::<(Lane, Job)>();
        let thread = std::thread::Builder::new()
            .name("embedded-store-writer".into())
            .spawn(move || {
                let writer = (|| {
                    let mut conn = open_connection(&config.path)?;
                    migrate(&mut conn, config.options.migrations)?;
                    check_keys(&conn, &config.keys)?;
                    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                    let mut counters = Counters::new();
                    {
                        let mut st = conn.prepare("SELECT name, value FROM counters").db()?;
                        let rows = st
                            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                            .db()?;
                        for row in rows {
                            let (name, value) = row.db()?;
                            counters.insert(name, (value, value));
                        }
                    }
                    Ok(Writer {
                        conn,
                        clock,
                        options: config.options,
                        keys: config.keys,
                        counters,
                        housekeeping: Housekeeping::default(),
                        seqs: SeqCache::default(),
                        caches: Caches::default(),
                        events: EventCache::default(),
                        live: LiveIndex::default(),
                        live_bounds: LiveBounds {
                            limit: config.live_index_limit,
                            window: config.live_window.max(1),
                        },
                        finished: FinishedTally::default(),
                        check_against_table: config.check_against_table,
                    })
                })();
                let mut writer = match writer {
                    Ok(w) => {
                        let _ = ready_tx.send(Ok(()));
                        w
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                run_jobs(&rx, &mut writer);
                // Dropping the writer closes the connection, checkpoints the
                // WAL and releases the file lock.
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the writer thread: {e}")))?;
        let ready = ready_rx.await.map_err(|_| {
            StoreError::Unavailable("the embedded store writer stopped while opening".into())
        });
        match ready.and_then(|r| r) {
            Ok(()) => Ok(EmbeddedStore {
                wakeup: control_plane_store_kit::Wakeup::default(),
                jobs: Some(jobs),
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = thread.join();
                Err(e)
            }
        }
    }

    /// Runs `f` on the writer thread and waits for its result. A call
    /// cancelled after it was queued still runs to completion.
    pub(crate) async fn call<T, F>(&self, lane: Lane, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Writer) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("the embedded store is closed".into()))?;
        let job: Job = Box::new(move |w: &mut Writer| {
            let _ = tx.send(f(w));
        });
        jobs.send((lane, job))
            .map_err(|_| StoreError::Unavailable("the embedded store writer has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("the embedded store writer has stopped".into()))?
    }

    /// Runs `f` in one transaction on the writer thread, in the request lane.
    pub(crate) async fn tx<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.call(Lane::Request, move |w| w.tx(f)).await
    }

    /// [`EmbeddedStore::tx`] in the work lane: for the workers' calls, which
    /// no one is waiting on an answer for.
    pub(crate) async fn work_tx<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.call(Lane::Work, move |w| w.tx(f)).await
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses a store holding credentials sealed under keys `keys` lacks.
pub(crate) fn check_keys(conn: &duckdb::Connection, keys: &SecretKeys) -> StoreResult<()> {
    let mut st = conn.prepare(SEALED_KEY_IDS).db()?;
    let ids = st
        .query_map([], |r| r.get::<_, String>(0))
        .db()?
        .collect::<Result<Vec<_>, _>>()
        .db()?;
    keys.check_known(ids.iter().map(String::as_str))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use control_plane_core::Check;
    use duckdb::params;

    use super::*;

    /// A store on a new file in `dir` with one endpoint of account `a`,
    /// and the event type `order.paid`, whose payloads must have an `id`
    /// when `schema` is set.
    pub(crate) async fn store_with_endpoint(
        dir: &tempfile::TempDir,
        schema: bool,
    ) -> (EmbeddedStore, control_plane_core::AccountId) {
        use control_plane_core::{
            AccountId, CatalogueStore, EndpointCreateRequest, EndpointStore, EventTypePut,
            ManualClock, Secret,
        };
        let config = EmbeddedConfig {
            check_against_table: true,
            ..EmbeddedConfig::new(dir.path().join("s.duckdb"))
        };
        let store = EmbeddedStore::open(config, Arc::new(ManualClock::default()))
            .await
            .unwrap();
        let account = AccountId::new("a").unwrap();
        let req = EndpointCreateRequest::new(
            account.clone(),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        store.endpoint_create(req.checked().unwrap()).await.unwrap();
        if schema {
            let mut put = EventTypePut::new(account.clone(), "order.paid", "Paid");
            put.schema = Some(serde_json::json!({"type": "object", "required": ["id"]}));
            store.event_type_put(put.checked().unwrap()).await.unwrap();
        }
        (store, account)
    }

    /// A transaction that found the housekeeping due and then failed gives
    /// the turn back: the next one finds it due at the same moment.
    #[tokio::test]
    async fn a_failed_transaction_gives_back_the_housekeeping_turn() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store_with_endpoint(&dir, false).await;
        let (failed, again) = store
            .call(Lane::Work, |w| {
                let failed = w.tx(|t| -> StoreResult<()> {
                    assert!(t.housekeeping.due(t.now));
                    Err(StoreError::Backend("rolled back".into()))
                });
                let again = w.tx(|t| Ok(t.housekeeping.due(t.now)))?;
                Ok((failed.is_err(), again))
            })
            .await
            .unwrap();
        assert!(failed);
        assert!(again, "the rolled-back turn is due again");
    }

    /// A queued request runs before queued work, then requests and work
    /// alternate while both wait; every job runs, also after the senders left.
    #[test]
    fn requests_go_first_and_work_is_never_starved() {
        type Recorded = Box<dyn FnOnce(&mut Vec<String>) + Send>;
        let (tx, rx) = mpsc::channel::<(Lane, Recorded)>();
        let job =
            |name: String| -> Recorded { Box::new(move |ran: &mut Vec<String>| ran.push(name)) };
        for i in 0..3 {
            tx.send((Lane::Work, job(format!("w{i}")))).unwrap();
        }
        for i in 0..6 {
            tx.send((Lane::Request, job(format!("r{i}")))).unwrap();
        }
        drop(tx);
        let mut ran = Vec::new();
        run_jobs(&rx, &mut ran);
        assert_eq!(
            ran,
            ["r0", "w0", "r1", "w1", "r2", "w2", "r3", "r4", "r5"],
            "a request first, then one of each while both wait, then the rest"
        );
    }

    /// A failed call throws the live index away only when it changed it:
    /// a publish refused before it wrote anything keeps it; a batch whose
    /// second event breaks its schema had already indexed the first, so the
    /// index goes, and the next claim rebuilds it without the rolled-back
    /// delivery.
    #[tokio::test]
    async fn a_failed_call_drops_the_live_index_only_when_it_changed_it() {
        use control_plane_core::{ClaimRequest, DeliveryStore, EventStore, PublishRequest};
        let dir = tempfile::tempdir().unwrap();
        let (store, account) = store_with_endpoint(&dir, true).await;
        let event =
            |payload| PublishRequest::new(account.clone(), "order.paid".to_string(), payload);
        let built = || store.call(Lane::Work, |w| Ok(w.live.is_built()));
        let claim =
            || store.delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(30)).unwrap());

        store
            .event_publish_batch(
                control_plane_core::Checked::all(vec![event(serde_json::json!({"id": 1}))])
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(claim().await.unwrap().len(), 1);
        assert!(built().await.unwrap(), "the claim built the index");

        let refused = store
            .event_publish_batch(
                control_plane_core::Checked::all(vec![event(serde_json::json!({"no": "id"}))])
                    .unwrap(),
            )
            .await;
        assert!(refused.is_err());
        assert!(
            built().await.unwrap(),
            "a refusal that wrote nothing keeps it"
        );

        let half = store
            .event_publish_batch(
                control_plane_core::Checked::all(vec![
                    event(serde_json::json!({"id": 2})),
                    event(serde_json::json!({"no": "id"})),
                ])
                .unwrap(),
            )
            .await;
        assert!(half.is_err());
        assert!(
            !built().await.unwrap(),
            "the failed batch had indexed its first event"
        );
        assert!(
            claim().await.unwrap().is_empty(),
            "the rebuilt index holds nothing of the rolled-back batch"
        );
        assert!(built().await.unwrap());
    }

    /// Version 5 rebuilds the tasks table (its key becomes `(account, id)`):
    /// a file written by version 4 keeps every task, and afterwards another
    /// account may use the same id while the same account still may not.
    #[test]
    fn migration_5_keeps_tasks_and_scopes_their_ids_by_account() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("v4.duckdb")).unwrap();
        conn.execute_batch("CREATE TABLE schema_version (version BIGINT NOT NULL)")
            .unwrap();
        for (version, sql) in &MIGRATIONS[..4] {
            conn.execute_batch(sql).unwrap();
            conn.execute("INSERT INTO schema_version VALUES ($1)", [version])
                .unwrap();
        }
        let insert = "INSERT INTO tasks (id, account, kind, payload, state, attempts, max_attempts, run_at, \
                      seq, created_at, updated_at) VALUES ($1, $2, 'k', '{}', 'pending', 0, 5, 0, $3, 0, 0)";
        conn.execute(insert, params!["t1", "a", 1]).unwrap();
        conn.execute(insert, params!["t2", "a", 2]).unwrap();
        assert!(
            conn.execute(insert, params!["t1", "b", 3]).is_err(),
            "before version 5 ids are global"
        );

        migrate(&mut conn, Migrations::Apply).unwrap();

        let kept: Vec<(String, String, i64)> = conn
            .prepare("SELECT account, id, seq FROM tasks ORDER BY seq")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            kept,
            vec![("a".into(), "t1".into(), 1), ("a".into(), "t2".into(), 2)]
        );
        conn.execute(insert, params!["t1", "b", 3]).unwrap();
        assert!(conn.execute(insert, params!["t1", "a", 4]).is_err());
        let version: i64 = conn
            .query_row("SELECT max(version) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        // The newest migration's version: numbers are reserved per branch,
        // so the list may have a gap until the branches meet.
        assert_eq!(Some(version), MIGRATIONS.last().map(|(v, _)| *v));
    }
}
