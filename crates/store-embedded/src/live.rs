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
//! Beside it, the writer counts the finished deliveries by account and
//! state ([`crate::finished::FinishedTally`]), so that counting deliveries
//! by state reads the live rows from the index and never scans the finished
//! history (issue 54).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use control_plane_core::LeaseRow;
use control_plane_core::{
    Delivery, DeliveryId, DeliveryState, EndpointId, EventId, StoreError, StoreResult, Timestamp,
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

    fn remove(&mut self, seq: i64) {
        if let Some((due, id)) = self.pending.remove(&seq) {
            self.due.remove(&(due, seq, id));
        }
        self.leased.remove(&seq);
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.leased.is_empty()
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
        /// Live deliveries kept at most.
        limit: usize,
    },
}

impl LiveIndex {
    /// How long a store with too many live deliveries scans the table
    /// before trying to build the index again.
    const RETRY_MS: i64 = 60_000;

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
            limit,
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
                    q.pending.insert(seq, (due_at, id));
                    q.due.insert((due_at, seq, id));
                    true
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
        if *len > *limit {
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
        limit: usize,
        check: bool,
    ) -> StoreResult<Option<&HashMap<EndpointId, EndpointQueue>>> {
        let now = now.as_millis();
        let build = match self {
            LiveIndex::Stale => true,
            LiveIndex::TooBig { retry_at } => *retry_at <= now,
            LiveIndex::Built { .. } => false,
        };
        if build {
            *self = Self::build(conn, now, limit)?;
        } else if check {
            if let Err(e) = self.check(conn, now, limit) {
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

    /// Rebuilds an index from the table and compares it with the kept one.
    /// The conformance suite sets [`crate::EmbeddedConfig::check_against_table`],
    /// so every contract that claims also checks that each write kept the
    /// index in step; a store a person runs does not pay a scan per use.
    fn check(&self, conn: &duckdb::Connection, now: i64, limit: usize) -> StoreResult<()> {
        if !self.is_built() {
            return Ok(());
        }
        let table = Self::build(conn, now, limit)?;
        if table.is_built() && table != *self {
            let mut both = format!("kept {self:?}, in the table {table:?}");
            both.truncate(4_000);
            return Err(StoreError::Backend(format!(
                "the live index is out of step with the deliveries table: {both}"
            )));
        }
        Ok(())
    }

    fn build(conn: &duckdb::Connection, now: i64, limit: usize) -> StoreResult<LiveIndex> {
        let mut st = conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLS}, {LIVE_EXTRA_COLS} FROM deliveries WHERE state IN ('pending', 'leased')"
            ))
            .db()?;
        let mut rows = st.query(params![]).db()?;
        let mut index = LiveIndex::Built {
            queues: HashMap::new(),
            rows: HashMap::new(),
            len: 0,
            limit,
        };
        while let Some(r) = rows.next().db()? {
            index.put(LiveRow::read(r).db()?);
            if let LiveIndex::TooBig { .. } = index {
                return Ok(LiveIndex::TooBig {
                    retry_at: now.saturating_add(Self::RETRY_MS),
                });
            }
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use control_plane_core::{AccountId, LeaseToken};

    use super::*;

    fn built() -> LiveIndex {
        LiveIndex::Built {
            queues: HashMap::new(),
            rows: HashMap::new(),
            len: 0,
            limit: 1_000,
        }
    }

    fn queue(index: &LiveIndex, e: EndpointId) -> Option<&EndpointQueue> {
        match index {
            LiveIndex::Built { queues, .. } => queues.get(&e),
            _ => None,
        }
    }

    fn live(row: LeaseRow) -> LiveRow {
        LiveRow {
            row,
            event_id: EventId::new(),
            created_at: Timestamp::from_millis(0),
            last_error: None,
            updated_at: Timestamp::from_millis(0),
        }
    }

    fn pending_row(e: EndpointId, seq: i64, id: DeliveryId, due: i64) -> LiveRow {
        live(LeaseRow {
            id,
            seq,
            account: AccountId::new("a").unwrap(),
            endpoint_id: e,
            attempts: 0,
            max_attempts: 8,
            due_at: Timestamp::from_millis(due),
            state: DeliveryState::Pending,
            lease_token: None,
            lease_expires_at: None,
            last_outcome: None,
        })
    }

    fn leased_row(e: EndpointId, seq: i64, id: DeliveryId, expires: i64) -> LeaseRow {
        LeaseRow {
            id,
            seq,
            account: AccountId::new("a").unwrap(),
            endpoint_id: e,
            attempts: 1,
            max_attempts: 8,
            due_at: Timestamp::from_millis(0),
            state: DeliveryState::Leased,
            lease_token: Some(LeaseToken::new()),
            lease_expires_at: Some(Timestamp::from_millis(expires)),
            last_outcome: None,
        }
    }

    /// Pending deliveries are served by due time then seq; a lease takes
    /// one out of the due set, keeps its row, and counts until it expires;
    /// a finished one leaves the endpoint, and an endpoint with nothing live
    /// is dropped.
    #[test]
    fn deliveries_move_between_due_leased_and_gone() {
        let e = EndpointId::new();
        let (a, b, c) = (DeliveryId::new(), DeliveryId::new(), DeliveryId::new());
        let mut index = built();
        let first = pending_row(e, 1, a, 100);
        index.put(first.clone());
        index.put(pending_row(e, 2, b, 50));
        index.put(pending_row(e, 3, c, 500));
        assert_eq!(
            index.pending(a),
            Some(&first),
            "a pending row is kept whole"
        );
        let q = queue(&index, e).unwrap();
        let due: Vec<i64> = q.due_at(100).map(|(_, seq, _)| *seq).collect();
        assert_eq!(due, [2, 1], "due by time, the later one not yet");
        assert_eq!(
            q.due_head(100),
            Some((100, 1, a)),
            "the head is the lowest seq"
        );

        let row = leased_row(e, 1, a, 1_000);
        index.moved(&row, None, Timestamp::from_millis(0));
        assert_eq!(index.leased(a), Some(&row));
        assert_eq!(index.pending(a), None);
        let q = queue(&index, e).unwrap();
        assert_eq!(q.due_at(100).count(), 1);
        assert_eq!(q.in_flight(999), 1);
        assert_eq!(q.in_flight(1_000), 0, "an expired lease is not in flight");
        assert_eq!(
            q.due_head(1_000),
            None,
            "a leased head holds an ordered endpoint"
        );
        assert!(index.may_have_expired(Timestamp::from_millis(1_000)));
        assert!(!index.may_have_expired(Timestamp::from_millis(999)));

        index.extend(
            a,
            Timestamp::from_millis(2_000),
            Timestamp::from_millis(1_500),
        );
        assert_eq!(queue(&index, e).unwrap().in_flight(1_500), 1);
        assert_eq!(
            index.leased(a).and_then(|r| r.lease_expires_at),
            Some(Timestamp::from_millis(2_000))
        );

        let mut retry = row.clone();
        retry.state = DeliveryState::Pending;
        retry.due_at = Timestamp::from_millis(700);
        index.moved(
            &retry,
            Some(Some("503".to_string())),
            Timestamp::from_millis(0),
        );
        let kept = index.pending(a).expect("pending again");
        assert_eq!(
            (kept.event_id, kept.last_error.as_deref()),
            (first.event_id, Some("503")),
            "a move keeps the event and takes the new error"
        );
        assert_eq!(
            queue(&index, e).unwrap().in_flight(0),
            0,
            "a retry frees the lease"
        );
        assert_eq!(index.leased(a), None);
        for id in [a, b, c] {
            let mut done = index.pending(id).expect("pending").row.clone();
            done.state = DeliveryState::Delivered;
            index.moved(&done, None, Timestamp::from_millis(0));
        }
        assert!(queue(&index, e).is_none());
        let LiveIndex::Built { len, .. } = index else {
            panic!("still built")
        };
        assert_eq!(len, 0);
    }

    /// Changes to a stale index are dropped: it is rebuilt from the table.
    #[test]
    fn a_stale_index_ignores_changes_until_rebuilt() {
        let mut index = built();
        index.forget();
        let (e, id) = (EndpointId::new(), DeliveryId::new());
        index.put(pending_row(e, 1, id, 0));
        index.put(live(leased_row(e, 2, DeliveryId::new(), 10)));
        assert_eq!(index, LiveIndex::Stale);
        assert!(!index.is_built());
        assert!(index.may_have_expired(Timestamp::from_millis(0)));
    }

    /// A move of a delivery the kept index does not hold means it is out of
    /// step: it is dropped, to be rebuilt from the table.
    #[test]
    fn a_move_of_an_unknown_delivery_drops_the_index() {
        let mut index = built();
        let row = leased_row(EndpointId::new(), 1, DeliveryId::new(), 10);
        index.moved(&row, None, Timestamp::from_millis(0));
        assert_eq!(index, LiveIndex::Stale);
    }
}
