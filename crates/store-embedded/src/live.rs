//! The live queue's index, kept in the writer's memory (ADR 0028): per
//! endpoint, its pending deliveries in order of service and its leased ones
//! with their expiry. A claim reads the endpoints' fair shares from it
//! instead of scanning and grouping every live row of `deliveries`, which
//! was a third of each claim and grew with the backlog.
//!
//! It also keeps the row of every live delivery ([`LiveRow`]): as the lease
//! check reads it, so recording an outcome reads nothing from the table, and
//! with the columns a claim returns, so a claim reads nothing back either.
//!
//! DuckDB stays the truth. The index is built from it at its first use,
//! follows every write of the hot paths (publish, lease, extend, release,
//! outcome, lease expiry) in the same transaction, and is thrown away and
//! rebuilt from the table after anything else changes live rows (replays,
//! endpoint removal) or a transaction that changed it fails. Past its limit
//! ([`crate::EmbeddedConfig::live_index_limit`]) of live deliveries it is
//! not kept, and claims scan the table as before.
//!
//! A backlog that waits (a disabled endpoint, an open circuit, a poll
//! endpoint nobody reads) is kept only up to a window per endpoint
//! ([`crate::EmbeddedConfig::live_window`]) of its lowest pending sequence
//! numbers; the rest stays in the table, counted ([`Overflow`]), and is read
//! in a window at a time when a claim or a poll of that endpoint reaches
//! it. So one tenant's waiting backlog neither fills the writer's memory nor
//! pushes every other tenant's claims back to scanning the table.
//!
//! Beside it, the writer counts the finished deliveries by account and
//! state ([`crate::finished::FinishedTally`]), so that counting deliveries
//! by state reads the live rows from the index and never scans the finished
//! history (issue 54).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use control_plane_core::LeaseRow;
use control_plane_core::{
    AccountId, Delivery, DeliveryId, DeliveryState, EndpointId, EventId, StoreError, StoreResult,
    Timestamp,
};
use duckdb::params;

use crate::error::DuckResultExt;
use crate::util::RowExt;

/// A delivery's row as the lease check reads it ([`LeaseRow`]).
pub(crate) const LEASE_COLS: &str =
    "id, account, endpoint_id, attempts, max_attempts, due_at, state, lease_token, \
     lease_expires_at, last_outcome, seq";

pub(crate) fn row_to_lease_row(r: &duckdb::Row<'_>) -> duckdb::Result<LeaseRow> {
    Ok(LeaseRow {
        id: r.col(0)?,
        account: r.col(1)?,
        endpoint_id: r.col(2)?,
        attempts: r.get(3)?,
        max_attempts: r.get(4)?,
        due_at: r.col(5)?,
        state: r.col(6)?,
        lease_token: r.col(7)?,
        lease_expires_at: r.col(8)?,
        last_outcome: r.get(9)?,
        seq: r.get(10)?,
    })
}

/// A live delivery as the index keeps it: its row as the lease check reads
/// it, and the columns beside it that a claim hands out, so that a claim
/// reads nothing back from the table, and a listing of live deliveries
/// reads nothing at all. Equal to what the table holds after every write
/// (checked when [`crate::EmbeddedConfig::check_against_table`] is set).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LiveRow {
    pub row: LeaseRow,
    pub event_id: EventId,
    pub created_at: Timestamp,
    pub last_error: Option<String>,
    pub updated_at: Timestamp,
}

/// The columns a [`LiveRow`] is read from: [`LEASE_COLS`], then these.
const LIVE_EXTRA_COLS: &str = "event_id, created_at, last_error, updated_at";

impl LiveRow {
    fn read(r: &duckdb::Row<'_>) -> duckdb::Result<Self> {
        Ok(LiveRow {
            row: row_to_lease_row(r)?,
            event_id: r.col(11)?,
            created_at: r.col(12)?,
            last_error: r.get(13)?,
            updated_at: r.col(14)?,
        })
    }

    /// The delivery as the table holds it.
    pub fn delivery(&self) -> Delivery {
        let row = &self.row;
        Delivery {
            id: row.id,
            account: row.account.clone(),
            endpoint_id: row.endpoint_id,
            event_id: self.event_id,
            seq: row.seq,
            state: row.state,
            attempts: row.attempts,
            max_attempts: row.max_attempts,
            due_at: row.due_at,
            lease_expires_at: row.lease_expires_at,
            last_error: self.last_error.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// An endpoint's pending deliveries past its window, left in the table:
/// every pending one with a seq above `after`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Overflow {
    /// The highest pending seq the index keeps.
    after: i64,
    /// How many pending deliveries are past it.
    n: u64,
    /// The earliest due time among them.
    min_due: i64,
    /// The endpoint's account, for counts by account.
    account: AccountId,
}

/// One endpoint's live deliveries.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct EndpointQueue {
    /// Pending, in order of service: `(due_at, seq, id)`.
    due: BTreeSet<(i64, i64, DeliveryId)>,
    /// Pending, by seq: `(due_at, id)`.
    pending: BTreeMap<i64, (i64, DeliveryId)>,
    /// Leased, by seq: the lease's expiry (also when it has passed and the
    /// sweep has not freed it yet).
    leased: BTreeMap<i64, i64>,
    /// Its pending deliveries past the window, when there are any.
    overflow: Option<Overflow>,
}

impl EndpointQueue {
    /// Pending deliveries due at `now`, oldest first.
    pub fn due_at(&self, now: i64) -> impl Iterator<Item = &(i64, i64, DeliveryId)> {
        self.due.iter().take_while(move |(due, ..)| *due <= now)
    }

    /// Pending deliveries by seq, lowest first: `(seq, id)`.
    pub fn pending_by_seq(&self) -> impl Iterator<Item = (i64, DeliveryId)> + '_ {
        self.pending.iter().map(|(seq, (_, id))| (*seq, *id))
    }

    /// Leases that have not expired at `now`.
    pub fn in_flight(&self, now: i64) -> usize {
        self.leased.values().filter(|exp| **exp > now).count()
    }

    /// The head of an ordered endpoint (its oldest pending or leased
    /// delivery) when it is pending and due at `now`: `(due_at, seq, id)`.
    pub fn due_head(&self, now: i64) -> Option<(i64, i64, DeliveryId)> {
        let (seq, (due, id)) = self.pending.first_key_value()?;
        let leased_first = self.leased.first_key_value().is_some_and(|(l, _)| l < seq);
        (!leased_first && *due <= now).then_some((*due, *seq, *id))
    }

    /// Keeps pending delivery `seq` (due at `due`) in the window.
    fn insert_pending(&mut self, seq: i64, due: i64, id: DeliveryId) {
        self.pending.insert(seq, (due, id));
        self.due.insert((due, seq, id));
    }

    /// Whether pending delivery `seq` of `account`, due at `due`, goes past
    /// the window (then it is counted there): when the endpoint already
    /// overflows below it, or when its window holds `window` pending ones,
    /// all of them below it. A delivery below the window's top (a retry)
    /// stays in the window.
    fn overflows(&mut self, seq: i64, due: i64, window: usize, account: &AccountId) -> bool {
        if let Some(o) = self.overflow.as_mut() {
            if seq <= o.after {
                return false;
            }
            o.n += 1;
            o.min_due = o.min_due.min(due);
            return true;
        }
        match self.pending.last_key_value() {
            Some((&last, _)) if self.pending.len() >= window && seq > last => {
                self.overflow = Some(Overflow {
                    after: last,
                    n: 1,
                    min_due: due,
                    account: account.clone(),
                });
                true
            }
            _ => false,
        }
    }

    fn remove(&mut self, seq: i64) {
        if let Some((due, id)) = self.pending.remove(&seq) {
            self.due.remove(&(due, seq, id));
        }
        self.leased.remove(&seq);
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.leased.is_empty() && self.overflow.is_none()
    }

    /// Whether a claim of up to `take` at `now` needs more of this
    /// endpoint's deliveries read into the window first: the ones it holds
    /// are due in the same order as in the table (`due_at`, then seq) only
    /// while none past the window is due before the last one taken.
    pub fn short_for_claim(&self, now: i64, take: usize) -> bool {
        let Some(o) = &self.overflow else {
            return false;
        };
        if o.min_due > now {
            return false;
        }
        match self.due_at(now).nth(take.saturating_sub(1)) {
            Some((due, ..)) => *due > o.min_due,
            None => true,
        }
    }

    /// Whether a read of the `take` lowest pending seqs needs more of this
    /// endpoint's deliveries read into the window first.
    pub fn short_for_seqs(&self, take: usize) -> bool {
        self.overflow.is_some() && self.pending.len() < take
    }

    /// Pending deliveries past the window, `(account, how many)`.
    pub fn overflow(&self) -> Option<(&AccountId, u64)> {
        self.overflow.as_ref().map(|o| (&o.account, o.n))
    }
}

/// The index, or why there is none.
#[derive(Debug, Default, PartialEq)]
pub(crate) enum LiveIndex {
    /// To be built from the table before its next use.
    #[default]
    Stale,
    /// Too many live deliveries to keep in memory; tried again at this
    /// time (milliseconds).
    TooBig { retry_at: i64 },
    /// In step with the table.
    Built {
        queues: HashMap<EndpointId, EndpointQueue>,
        /// The row of each live delivery.
        rows: HashMap<DeliveryId, LiveRow>,
        len: usize,
        /// Live deliveries kept at most, and pending ones per endpoint
        /// before the rest overflows.
        bounds: LiveBounds,
    },
}

/// How much the index keeps ([`crate::EmbeddedConfig::live_index_limit`],
/// [`crate::EmbeddedConfig::live_window`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LiveBounds {
    pub limit: usize,
    pub window: usize,
}

impl LiveIndex {
    /// How long a store with too many live deliveries scans the table
    /// before trying to build the index again.
    const RETRY_MS: i64 = 60_000;

    /// A kept index with nothing in it, keeping at most `bounds`.
    fn empty(bounds: LiveBounds) -> LiveIndex {
        LiveIndex::Built {
            queues: HashMap::new(),
            rows: HashMap::new(),
            len: 0,
            bounds,
        }
    }

    /// The index is no longer in step: rebuilt before its next use.
    pub fn forget(&mut self) {
        *self = LiveIndex::Stale;
    }

    /// Records `live` as its row now says: pending, leased, or finished
    /// (then it leaves the index).
    pub fn put(&mut self, live: LiveRow) {
        let (endpoint, seq, id) = (live.row.endpoint_id, live.row.seq, live.row.id);
        self.change(endpoint, seq, id, Some(live));
    }

    /// Records that `row`'s delivery moved to the state `row` says at
    /// `at`, keeping what the index holds beside it; `last_error` is its new
    /// last error (`None`: unchanged). A delivery the kept index does not
    /// hold means it is out of step: it is rebuilt before its next use.
    pub fn moved(&mut self, row: &LeaseRow, last_error: Option<Option<String>>, at: Timestamp) {
        let LiveIndex::Built { rows, .. } = self else {
            return;
        };
        let Some(kept) = rows.get(&row.id) else {
            self.forget();
            return;
        };
        // A finished delivery only leaves: nothing of it is copied.
        let live = (!row.state.is_final()).then(|| LiveRow {
            row: row.clone(),
            event_id: kept.event_id,
            created_at: kept.created_at,
            last_error: last_error.unwrap_or_else(|| kept.last_error.clone()),
            updated_at: at,
        });
        self.change(row.endpoint_id, row.seq, row.id, live);
    }

    /// The row of leased delivery `id`; `None` when it is not leased, or
    /// the index is not kept.
    pub fn leased(&self, id: DeliveryId) -> Option<&LeaseRow> {
        self.row(id, DeliveryState::Leased).map(|l| &l.row)
    }

    /// The row of pending delivery `id`; `None` when it is not pending, or
    /// the index is not kept.
    pub fn pending(&self, id: DeliveryId) -> Option<&LiveRow> {
        self.row(id, DeliveryState::Pending)
    }

    fn row(&self, id: DeliveryId, state: DeliveryState) -> Option<&LiveRow> {
        match self {
            LiveIndex::Built { rows, .. } => rows.get(&id).filter(|l| l.row.state == state),
            _ => None,
        }
    }

    /// Whether the index is kept (and so holds every live row).
    pub fn is_built(&self) -> bool {
        matches!(self, LiveIndex::Built { .. })
    }

    /// The row of every live delivery; `None` when the index is not kept.
    pub fn rows(&self) -> Option<&HashMap<DeliveryId, LiveRow>> {
        match self {
            LiveIndex::Built { rows, .. } => Some(rows),
            _ => None,
        }
    }

    /// Takes delivery `seq` of `endpoint` out of the index, then puts `live`
    /// back in when it is pending or leased.
    fn change(&mut self, endpoint: EndpointId, seq: i64, id: DeliveryId, live: Option<LiveRow>) {
        let LiveIndex::Built {
            queues,
            rows,
            len,
            bounds,
        } = self
        else {
            return;
        };
        let q = queues.entry(endpoint).or_default();
        let before = q.pending.len() + q.leased.len();
        q.remove(seq);
        rows.remove(&id);
        if let Some(live) = live {
            let kept = match live.row.state {
                DeliveryState::Pending => {
                    let due_at = live.row.due_at.as_millis();
                    let past = q.overflows(seq, due_at, bounds.window, &live.row.account);
                    if !past {
                        q.insert_pending(seq, due_at, id);
                    }
                    !past
                }
                DeliveryState::Leased => {
                    let expires_at = live.row.lease_expires_at.map_or(0, Timestamp::as_millis);
                    q.leased.insert(seq, expires_at);
                    true
                }
                _ => false,
            };
            if kept {
                rows.insert(id, live);
            }
        }
        let after = q.pending.len() + q.leased.len();
        if q.is_empty() {
            queues.remove(&endpoint);
        }
        *len = (*len + after).saturating_sub(before);
        if *len > bounds.limit {
            *self = LiveIndex::TooBig { retry_at: 0 };
        }
    }

    /// The lease of delivery `id` now runs until `expires_at`, extended at
    /// `at`.
    pub fn extend(&mut self, id: DeliveryId, expires_at: Timestamp, at: Timestamp) {
        if let LiveIndex::Built { queues, rows, .. } = self {
            if let Some(live) = rows.get_mut(&id) {
                live.updated_at = at;
                let row = &mut live.row;
                row.lease_expires_at = Some(expires_at);
                if let Some(exp) = queues
                    .get_mut(&row.endpoint_id)
                    .and_then(|q| q.leased.get_mut(&row.seq))
                {
                    *exp = expires_at.as_millis();
                }
            }
        }
    }

    /// The queues by endpoint, built from the table first when needed, and
    /// compared with it when `check` is set; `None` while there are too
    /// many live deliveries to keep.
    pub fn queues(
        &mut self,
        conn: &duckdb::Connection,
        now: Timestamp,
        bounds: LiveBounds,
        check: bool,
    ) -> StoreResult<Option<&HashMap<EndpointId, EndpointQueue>>> {
        let now = now.as_millis();
        let build = match self {
            LiveIndex::Stale => true,
            LiveIndex::TooBig { retry_at } => *retry_at <= now,
            LiveIndex::Built { .. } => false,
        };
        if build {
            *self = Self::build(conn, now, bounds)?;
        } else if check {
            if let Err(e) = self.check(conn, now) {
                self.forget();
                return Err(e);
            }
        }
        Ok(match self {
            LiveIndex::Built { queues, .. } => Some(queues),
            _ => None,
        })
    }

    /// Whether a lease may have expired by `now` (`true` when unknown).
    pub fn may_have_expired(&self, now: Timestamp) -> bool {
        match self {
            LiveIndex::Built { queues, .. } => queues
                .values()
                .any(|q| q.leased.values().any(|exp| *exp <= now.as_millis())),
            _ => true,
        }
    }

    /// Rebuilds an index from the table, every live row in it, cuts each
    /// endpoint's pending rows where the kept one's window ends
    /// ([`LiveIndex::cut_like`]), and compares the two. The conformance
    /// suite sets [`crate::EmbeddedConfig::check_against_table`], so every
    /// contract that claims also checks that each write kept the index in
    /// step; a store a person runs does not pay a scan per use.
    fn check(&self, conn: &duckdb::Connection, now: i64) -> StoreResult<()> {
        let LiveIndex::Built { queues, bounds, .. } = self else {
            return Ok(());
        };
        let whole = LiveBounds {
            limit: usize::MAX,
            window: usize::MAX,
        };
        let mut table = Self::build(conn, now, whole)?;
        table.cut_like(queues, *bounds);
        if table != *self {
            let mut both = format!("kept {self:?}, in the table {table:?}");
            both.truncate(4_000);
            return Err(StoreError::Backend(format!(
                "the live index is out of step with the deliveries table: {both}"
            )));
        }
        Ok(())
    }

    /// Moves the pending rows of each endpoint that `kept` holds with an
    /// overflow past that overflow's `after` out of this (whole) index into
    /// an [`Overflow`] of its own, and takes `bounds`: the index the kept
    /// one should be.
    fn cut_like(&mut self, kept: &HashMap<EndpointId, EndpointQueue>, kept_bounds: LiveBounds) {
        let LiveIndex::Built {
            queues,
            rows,
            len,
            bounds,
        } = self
        else {
            return;
        };
        *bounds = kept_bounds;
        for (endpoint, k) in kept {
            let (Some(o), Some(q)) = (&k.overflow, queues.get_mut(endpoint)) else {
                continue;
            };
            let past = q.pending.split_off(&(o.after + 1));
            let Some(min_due) = past.values().map(|(due, _)| *due).min() else {
                continue;
            };
            for (seq, (due, id)) in &past {
                q.due.remove(&(*due, *seq, *id));
                rows.remove(id);
            }
            *len = len.saturating_sub(past.len());
            q.overflow = Some(Overflow {
                after: o.after,
                n: past.len() as u64,
                min_due,
                account: o.account.clone(),
            });
        }
    }

    /// Builds the index from the table: every leased row, and each
    /// endpoint's pending rows up to its window by seq, the rest counted
    /// as its [`Overflow`].
    fn build(conn: &duckdb::Connection, now: i64, bounds: LiveBounds) -> StoreResult<LiveIndex> {
        let window = i64::try_from(bounds.window).unwrap_or(i64::MAX);
        let mut st = conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLS}, {LIVE_EXTRA_COLS} FROM deliveries WHERE state IN ('pending', 'leased') \
                 QUALIFY state = 'leased' OR row_number() OVER (PARTITION BY endpoint_id, state ORDER BY seq) <= $1"
            ))
            .db()?;
        let mut rows = st.query(params![window]).db()?;
        let mut index = LiveIndex::empty(bounds);
        while let Some(r) = rows.next().db()? {
            index.put(LiveRow::read(r).db()?);
            if let LiveIndex::TooBig { .. } = index {
                return Ok(LiveIndex::TooBig {
                    retry_at: now.saturating_add(Self::RETRY_MS),
                });
            }
        }
        if let LiveIndex::Built { queues, .. } = &mut index {
            let mut st = conn.prepare_cached(OVERFLOWS).db()?;
            let mut past = st.query(params![window]).db()?;
            while let Some(r) = past.next().db()? {
                let endpoint: EndpointId = r.col(0).db()?;
                let Some(q) = queues.get_mut(&endpoint) else {
                    continue;
                };
                let Some((&after, _)) = q.pending.last_key_value() else {
                    continue;
                };
                q.overflow = Some(Overflow {
                    after,
                    n: r.get::<_, i64>(2).db()?.unsigned_abs(),
                    min_due: r.get(3).db()?,
                    account: r.col(1).db()?,
                });
            }
        }
        Ok(index)
    }

    /// Reads the next window of pending deliveries of `endpoint` past the
    /// one kept (ADR 0028), and counts what is left past it. Nothing to
    /// do when the endpoint does not overflow.
    pub fn refill(&mut self, conn: &duckdb::Connection, endpoint: EndpointId) -> StoreResult<()> {
        let LiveIndex::Built {
            queues,
            rows,
            len,
            bounds,
        } = self
        else {
            return Ok(());
        };
        let Some(q) = queues.get_mut(&endpoint) else {
            return Ok(());
        };
        let Some(o) = q.overflow.take() else {
            return Ok(());
        };
        let window = i64::try_from(bounds.window).unwrap_or(i64::MAX);
        let mut st = conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLS}, {LIVE_EXTRA_COLS} FROM deliveries \
                 WHERE endpoint_id = $1 AND state = 'pending' AND seq > $2 ORDER BY seq LIMIT $3"
            ))
            .db()?;
        let mut found = st
            .query(params![endpoint.to_string(), o.after, window])
            .db()?;
        let mut after = o.after;
        while let Some(r) = found.next().db()? {
            let live = LiveRow::read(r).db()?;
            let (seq, id) = (live.row.seq, live.row.id);
            after = after.max(seq);
            q.insert_pending(seq, live.row.due_at.as_millis(), id);
            rows.insert(id, live);
            *len += 1;
        }
        let (n, min_due): (i64, Option<i64>) = conn
            .query_row(
                "SELECT count(*), min(due_at) FROM deliveries \
                 WHERE endpoint_id = $1 AND state = 'pending' AND seq > $2",
                params![endpoint.to_string(), after],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .db()?;
        if let (true, Some(min_due)) = (n > 0, min_due) {
            q.overflow = Some(Overflow {
                after,
                n: n.unsigned_abs(),
                min_due,
                account: o.account,
            });
        }
        if *len > bounds.limit {
            *self = LiveIndex::TooBig { retry_at: 0 };
        }
        Ok(())
    }
}

/// Per endpoint whose pending rows pass the window `$1` (by seq): its
/// account, how many pass it, and the earliest due time among them.
const OVERFLOWS: &str = "SELECT endpoint_id, any_value(account), count(*), min(due_at) FROM \
     (SELECT endpoint_id, account, due_at, row_number() OVER (PARTITION BY endpoint_id ORDER BY seq) AS n \
     FROM deliveries WHERE state = 'pending') WHERE n > $1 GROUP BY endpoint_id";

#[cfg(test)]
mod tests;
