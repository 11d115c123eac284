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

use control_plane_core::migration::{self, Migration, Migrations};
use control_plane_core::{
    Clock, EndpointId, Housekeeping, SecretKeys, StoreError, StoreOptions, StoreResult, Timestamp,
};
use duckdb::Connection;
use tokio::sync::oneshot;

use crate::cache::{
    Caches, CircuitCache, EventCache, FanOutCache, SchemaCache, SenderCache, SeqCache,
};
use crate::config::EmbeddedConfig;
use crate::error::DuckResultExt;
use crate::live::{EndpointQueue, LiveIndex};

const MIGRATIONS: &[Migration] = &[
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

/// A call queued for the writer.
enum Job {
    /// Runs on its own: it opens and ends its transactions itself.
    Alone(Box<dyn FnOnce(&mut Writer) + Send>),
    /// A transaction's body, which may share one DuckDB transaction with the
    /// parts queued beside it ([`Writer::run_parts`]).
    Part(Box<dyn Part>),
}

/// At most this many calls share one transaction.
const PARTS_PER_TRANSACTION: usize = 32;

/// One call's transaction body and where its answer goes. A part may run
/// twice: when another part of its group fails, the group's transaction is
/// rolled back and each part runs again in a transaction of its own.
trait Part: Send {
    /// Runs the body in `t`, keeping its value for [`Part::answer`].
    fn run(&mut self, t: &mut Tx<'_>) -> StoreResult<()>;
    /// Answers the caller: the kept value when its transaction committed
    /// (`Ok`), else the error.
    fn answer(self: Box<Self>, committed: StoreResult<()>);
}

/// A body `F` with its caller's reply channel.
struct Reply<T, F> {
    body: F,
    value: Option<T>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Part for Reply<T, F>
where
    T: Send,
    F: Fn(&mut Tx<'_>) -> StoreResult<T> + Send,
{
    fn run(&mut self, t: &mut Tx<'_>) -> StoreResult<()> {
        self.value = Some((self.body)(t)?);
        Ok(())
    }

    fn answer(self: Box<Self>, committed: StoreResult<()>) {
        let Reply { value, reply, .. } = *self;
        let answer = committed.and_then(|()| {
            value.ok_or_else(|| {
                StoreError::Backend("a call's transaction committed without its answer".into())
            })
        });
        let _ = reply.send(answer);
    }
}

/// What [`run_jobs`] needs of a queued call.
trait Queued<W>: Sized {
    /// Whether it may share a transaction with the calls beside it.
    fn shares(&self) -> bool;
    /// Runs `jobs`: one that does not share, or several that do.
    fn run(jobs: Vec<Self>, writer: &mut W);
}

impl Queued<Writer> for Job {
    fn shares(&self) -> bool {
        matches!(self, Job::Part(_))
    }

    fn run(jobs: Vec<Self>, writer: &mut Writer) {
        let mut parts = Vec::with_capacity(jobs.len());
        for job in jobs {
            match job {
                Job::Alone(f) => f(writer),
                Job::Part(p) => parts.push(p),
            }
        }
        if !parts.is_empty() {
            writer.run_parts(parts);
        }
    }
}

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

    /// Whether the next job comes from the work lane.
    fn work_first(&self) -> bool {
        self.request.is_empty()
            || (!self.work.is_empty() && self.requests_in_a_row >= Self::REQUESTS_IN_A_ROW)
    }

    /// The job [`Lanes::next`] would return.
    fn peek(&self) -> Option<&J> {
        if self.work_first() {
            self.work.front()
        } else {
            self.request.front()
        }
    }

    /// The job to run next.
    fn next(&mut self) -> Option<J> {
        if self.work_first() {
            self.requests_in_a_row = 0;
            self.work.pop_front()
        } else {
            self.requests_in_a_row += 1;
            self.request.pop_front()
        }
    }
}

/// Runs the jobs of `rx` on `writer` by [`Lanes`] until every sender is gone
/// and every queued job has run. Jobs that share ([`Queued::shares`]) and
/// come next in a row, up to [`PARTS_PER_TRANSACTION`], run together.
fn run_jobs<W, J: Queued<W>>(rx: &mpsc::Receiver<(Lane, J)>, writer: &mut W) {
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
        let Some(first) = lanes.next() else {
            continue;
        };
        let mut jobs = vec![first];
        while jobs.len() < PARTS_PER_TRANSACTION
            && jobs.iter().all(Queued::shares)
            && lanes.peek().is_some_and(Queued::shares)
        {
            jobs.extend(lanes.next());
        }
        J::run(jobs, writer);
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
    live_limit: usize,
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
    live_limit: usize,
    /// Whether this transaction changed or built the index: if it fails,
    /// the index is thrown away.
    live_touched: &'a mut bool,
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
        self.live.queues(&self.tx, self.now, self.live_limit)
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
        let mut live_touched = false;
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
                live_limit: self.live_limit,
                live_touched: &mut live_touched,
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
            if live_touched {
                self.live.forget();
            }
        }
        result
    }

    /// Runs the bodies of `parts` in one transaction and answers each after
    /// its commit: one commit for the calls that waited together. DuckDB
    /// has no savepoints, so when one part fails the whole transaction rolls
    /// back (with what it changed in memory, as in [`Writer::tx`]) and every
    /// part runs again in a transaction of its own; the failing one answers
    /// its own error, and the others are not held to it.
    fn run_parts(&mut self, mut parts: Vec<Box<dyn Part>>) {
        if parts.len() > 1 {
            let together = self.tx(|t| parts.iter_mut().try_for_each(|p| p.run(t)));
            if together.is_ok() {
                for p in parts {
                    p.answer(Ok(()));
                }
                return;
            }
        }
        for mut p in parts {
            let alone = self.tx(|t| p.run(t));
            p.answer(alone);
        }
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

fn migrate(conn: &mut Connection, policy: Migrations) -> StoreResult<()> {
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
    pub(crate) wakeup: control_plane_core::Wakeup,
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
                    crate::endpoint::check_keys(&conn, &config.keys)?;
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
                        live_limit: config.live_index_limit,
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
                wakeup: control_plane_core::Wakeup::default(),
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
        let job = Job::Alone(Box::new(move |w: &mut Writer| {
            let _ = tx.send(f(w));
        }));
        self.queue(lane, job, rx).await
    }

    /// Queues `job` in `lane` and waits for its answer on `rx`.
    async fn queue<T>(
        &self,
        lane: Lane,
        job: Job,
        rx: oneshot::Receiver<StoreResult<T>>,
    ) -> StoreResult<T> {
        let stopped = || StoreError::Unavailable("the embedded store writer has stopped".into());
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("the embedded store is closed".into()))?;
        jobs.send((lane, job)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Runs `f` in a transaction on the writer thread, in `lane`. The
    /// transaction may be shared with the calls queued beside this one
    /// ([`Writer::run_parts`]), so `f` may run twice: it is `Fn`, and it
    /// keeps nothing outside `Tx`. It is answered only after its commit.
    async fn part<T, F>(&self, lane: Lane, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&mut Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let part = Reply {
            body: f,
            value: None,
            reply,
        };
        self.queue(lane, Job::Part(Box::new(part)), rx).await
    }

    /// Runs `f` in a transaction on the writer thread, in the request lane
    /// (see [`EmbeddedStore::part`]).
    pub(crate) async fn tx<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&mut Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.part(Lane::Request, f).await
    }

    /// [`EmbeddedStore::tx`] in the work lane: for the workers' calls, which
    /// no one is waiting on an answer for.
    pub(crate) async fn work_tx<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&mut Tx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.part(Lane::Work, f).await
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use duckdb::params;

    use super::*;

    /// A job of the lane tests: its name, and whether it shares.
    struct Named(String, bool);

    impl Queued<Vec<String>> for Named {
        fn shares(&self) -> bool {
            self.1
        }

        /// Records the names of the jobs that ran together, joined by `+`.
        fn run(jobs: Vec<Self>, ran: &mut Vec<String>) {
            let names: Vec<String> = jobs.into_iter().map(|j| j.0).collect();
            ran.push(names.join("+"));
        }
    }

    /// Queues `jobs` (lane, name, shares) at once and runs them.
    fn ran(jobs: &[(Lane, String, bool)]) -> Vec<String> {
        let (tx, rx) = mpsc::channel::<(Lane, Named)>();
        for (lane, name, shares) in jobs {
            tx.send((*lane, Named(name.clone(), *shares))).unwrap();
        }
        drop(tx);
        let mut ran = Vec::new();
        run_jobs(&rx, &mut ran);
        ran
    }

    /// A queued request runs before queued work, then requests and work
    /// alternate while both wait; every job runs, also after the senders left.
    #[test]
    fn requests_go_first_and_work_is_never_starved() {
        let mut jobs: Vec<(Lane, String, bool)> = (0..3)
            .map(|i| (Lane::Work, format!("w{i}"), false))
            .collect();
        jobs.extend((0..6).map(|i| (Lane::Request, format!("r{i}"), false)));
        assert_eq!(
            ran(&jobs),
            ["r0", "w0", "r1", "w1", "r2", "w2", "r3", "r4", "r5"],
            "a request first, then one of each while both wait, then the rest"
        );
    }

    /// Calls that share and come next in the lanes' order run together, up
    /// to the limit; one that does not share runs alone and ends a group.
    #[test]
    fn queued_parts_run_together_in_the_lanes_order() {
        let job = |lane, name: &str, shares| (lane, name.to_string(), shares);
        let jobs = [
            job(Lane::Work, "w0", true),
            job(Lane::Work, "w1", true),
            job(Lane::Work, "w2", false),
            job(Lane::Request, "r0", true),
            job(Lane::Request, "r1", true),
            job(Lane::Request, "r2", false),
            job(Lane::Request, "r3", true),
            job(Lane::Request, "r4", true),
        ];
        assert_eq!(
            ran(&jobs),
            ["r0+w0+r1+w1", "r2", "w2", "r3+r4"],
            "grouped in the order the lanes hand them out"
        );
        let many: Vec<_> = (0..PARTS_PER_TRANSACTION + 3)
            .map(|i| (Lane::Work, i.to_string(), true))
            .collect();
        let groups: Vec<usize> = ran(&many).iter().map(|g| g.split('+').count()).collect();
        assert_eq!(groups, [PARTS_PER_TRANSACTION, 3]);
    }

    /// Parts that share a transaction commit together; when one fails the
    /// rest are not held to it: each runs again alone, the others commit,
    /// and the failing one answers its own error.
    #[tokio::test]
    async fn a_failing_part_rolls_back_its_group_and_the_others_run_alone() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let config = EmbeddedConfig::new(dir.path().join("s.duckdb"));
        let store =
            EmbeddedStore::open(config, Arc::new(control_plane_core::ManualClock::default()))
                .await
                .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let answers = store
            .call(Lane::Work, move |w| {
                let (a, ra) = oneshot::channel();
                let (b, rb) = oneshot::channel();
                let (c, rc) = oneshot::channel();
                let insert = |name: &'static str, reply| -> Box<dyn Part> {
                    let counted = counted.clone();
                    Box::new(Reply {
                        body: move |t: &mut Tx<'_>| {
                            counted.fetch_add(1, Ordering::SeqCst);
                            t.execute(
                                "INSERT INTO counters (name, value) VALUES ($1, 1)",
                                params![name],
                            )
                            .db()
                        },
                        value: None,
                        reply,
                    })
                };
                let fails = Box::new(Reply {
                    body: |t: &mut Tx<'_>| -> StoreResult<usize> {
                        t.execute("INSERT INTO counters (name, value) VALUES ('b', 1)", [])
                            .db()?;
                        Err(StoreError::InvalidInput("refused after writing".into()))
                    },
                    value: None,
                    reply: b,
                });
                w.run_parts(vec![insert("a", a), fails, insert("c", c)]);
                Ok((ra, rb, rc))
            })
            .await
            .unwrap();
        assert_eq!(answers.0.await.unwrap().unwrap(), 1);
        assert!(matches!(
            answers.1.await.unwrap(),
            Err(StoreError::InvalidInput(_))
        ));
        assert_eq!(answers.2.await.unwrap().unwrap(), 1);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "a in the group and alone, c alone: the group stopped at b"
        );
        let kept: Vec<String> = store
            .tx(|t| {
                let mut st = t
                    .prepare(
                        "SELECT name FROM counters WHERE name IN ('a', 'b', 'c') ORDER BY name",
                    )
                    .db()?;
                let rows = st.query_map([], |r| r.get(0)).db()?;
                rows.collect::<Result<_, _>>().db()
            })
            .await
            .unwrap();
        assert_eq!(kept, ["a", "c"], "b's write rolled back, a and c kept once");
    }

    /// Calls queued together commit in one transaction (DuckDB's
    /// `txid_current()` is the same for all of them), each is answered, and
    /// the later ones see what the earlier ones wrote; a call queued alone
    /// gets a transaction of its own.
    #[tokio::test]
    async fn calls_queued_together_share_a_transaction_and_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let config = EmbeddedConfig::new(dir.path().join("s.duckdb"));
        let store = Arc::new(
            EmbeddedStore::open(config, Arc::new(control_plane_core::ManualClock::default()))
                .await
                .unwrap(),
        );
        let insert = |store: Arc<EmbeddedStore>, i: i64| async move {
            store
                .tx(move |t| {
                    t.execute(
                        "INSERT INTO counters (name, value) VALUES ($1, $2)",
                        params![format!("n{i}"), i],
                    )
                    .db()?;
                    t.query_row(
                        "SELECT txid_current(), (SELECT count(*) FROM counters WHERE name LIKE 'n%')",
                        [],
                        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                    )
                    .db()
                })
                .await
        };
        // Hold the writer so that the calls below queue behind it.
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let blocker = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .call(Lane::Work, move |_| {
                        held.recv().ok();
                        Ok(())
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let calls: Vec<_> = (0..4)
            .map(|i| tokio::spawn(insert(store.clone(), i)))
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        hold.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await.unwrap().unwrap());
        }
        let mut seen: Vec<i64> = answers.iter().map(|a| a.1).collect();
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3, 4], "each saw the ones before it");
        assert!(
            answers.iter().all(|a| a.0 == answers[0].0),
            "one transaction: {answers:?}"
        );
        let alone = insert(store.clone(), 9).await.unwrap();
        assert_ne!(alone.0, answers[0].0, "a later call, a new transaction");
        assert_eq!(alone.1, 5, "the group committed");
    }

    /// A failed call throws the live index away only when it changed it:
    /// a publish refused before it wrote anything keeps it; a batch whose
    /// second event breaks its schema had already indexed the first, so the
    /// index goes, and the next claim rebuilds it without the rolled-back
    /// delivery.
    #[tokio::test]
    async fn a_failed_call_drops_the_live_index_only_when_it_changed_it() {
        use control_plane_core::{
            AccountId, CatalogueStore, ClaimRequest, DeliveryStore, EndpointCreateRequest,
            EndpointStore, EventStore, EventTypePut, ManualClock, PublishRequest, Secret,
        };
        let dir = tempfile::tempdir().unwrap();
        let config = EmbeddedConfig::new(dir.path().join("s.duckdb"));
        let store = EmbeddedStore::open(config, Arc::new(ManualClock::default()))
            .await
            .unwrap();
        let account = AccountId::new("a").unwrap();
        let req = EndpointCreateRequest::new(
            account.clone(),
            "https://example.com/hook",
            Secret::new("whsec_dGVzdA=="),
        );
        store.endpoint_create(req).await.unwrap();
        let mut put = EventTypePut::new(account.clone(), "order.paid", "Paid");
        put.schema = Some(serde_json::json!({"type": "object", "required": ["id"]}));
        store.event_type_put(put).await.unwrap();
        let event =
            |payload| PublishRequest::new(account.clone(), "order.paid".to_string(), payload);
        let built = || store.call(Lane::Work, |w| Ok(w.live.is_built()));
        let claim = || store.delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(30)));

        store
            .event_publish_batch(vec![event(serde_json::json!({"id": 1}))])
            .await
            .unwrap();
        assert_eq!(claim().await.unwrap().len(), 1);
        assert!(built().await.unwrap(), "the claim built the index");

        let refused = store
            .event_publish_batch(vec![event(serde_json::json!({"no": "id"}))])
            .await;
        assert!(refused.is_err());
        assert!(
            built().await.unwrap(),
            "a refusal that wrote nothing keeps it"
        );

        let half = store
            .event_publish_batch(vec![
                event(serde_json::json!({"id": 2})),
                event(serde_json::json!({"no": "id"})),
            ])
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
        assert_eq!(version, MIGRATIONS.len() as i64);
    }
}
