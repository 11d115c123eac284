//! Reading deliveries and events: by id, listings, counts by state.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::cache::SentEvent;
use crate::delivery::dead_letters::DEAD_LETTER_COLS;
use crate::error::DuckResultExt;
use crate::finished::{count_in_table, Counts};
use crate::live::{EndpointQueue, LiveRow};
use crate::store::Tx;
use crate::util::{list, RowExt};
use control_plane_core::{
    cut_by_time, AccountId, Delivery, DeliveryId, DeliveryListRequest, DeliveryState, Event,
    EventId, EventListRequest, Page, StoreError, StoreResult, TimeCut, Timestamp, TraceParent,
};
use control_plane_store_kit::columns::EVENT_COLS;
use duckdb::{params, OptionalExt, Row};
use std::collections::HashMap;

pub(super) const DELIVERY_COLS: &str =
    "d.id, d.account, d.endpoint_id, d.event_id, d.seq, d.state, d.attempts, \
     d.max_attempts, d.due_at, d.lease_expires_at, d.last_error, d.created_at, d.updated_at";

pub(super) fn row_to_delivery(r: &Row<'_>) -> duckdb::Result<Delivery> {
    Ok(Delivery {
        id: r.col(0)?,
        account: r.col(1)?,
        endpoint_id: r.col(2)?,
        event_id: r.col(3)?,
        seq: r.get(4)?,
        state: r.col(5)?,
        attempts: r.get(6)?,
        max_attempts: r.get(7)?,
        due_at: r.col(8)?,
        lease_expires_at: r.col(9)?,
        last_error: r.get(10)?,
        created_at: r.col(11)?,
        updated_at: r.col(12)?,
    })
}

pub(super) fn row_to_event(r: &Row<'_>) -> duckdb::Result<Event> {
    Ok(Event {
        id: r.col(0)?,
        account: r.col(1)?,
        event_type: r.get(2)?,
        body: r.get(3)?,
        idempotency_key: r.get(4)?,
        traceparent: r
            .get::<_, Option<String>>(6)?
            .and_then(|t| TraceParent::parse(&t)),
        created_at: r.col(5)?,
        example: r.get(7)?,
    })
}

pub(crate) fn event_get(t: &Tx<'_>, account: &AccountId, id: EventId) -> StoreResult<Event> {
    t.query_row(
        &format!("SELECT {EVENT_COLS} FROM events WHERE id = $1 AND account = $2"),
        params![id.to_string(), account.as_str()],
        row_to_event,
    )
    .optional()
    .db()?
    .ok_or_else(|| StoreError::not_found("event", id))
}

/// The event of `account` published with idempotency key `key`, if any.
pub(crate) fn event_by_key(
    t: &Tx<'_>,
    account: &AccountId,
    key: &str,
) -> StoreResult<Option<Event>> {
    t.query_row(
        &format!("SELECT {EVENT_COLS} FROM events WHERE account = $1 AND idempotency_key = $2"),
        params![account.as_str(), key],
        row_to_event,
    )
    .optional()
    .db()
}

/// Events of the request, newest first: before `before`, or exactly `at`.
pub(super) fn events_where(
    t: &Tx<'_>,
    req: &EventListRequest,
    before: Option<i64>,
    at: Option<i64>,
    limit: i64,
) -> StoreResult<Vec<Event>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE account = $1 AND ($2::VARCHAR IS NULL OR event_type = $2) \
             AND ($3::BIGINT IS NULL OR created_at >= $3) AND ($4::BIGINT IS NULL OR created_at < $4) \
             AND ($5::BIGINT IS NULL OR created_at < $5) AND ($6::BIGINT IS NULL OR created_at = $6) \
             ORDER BY created_at DESC, id DESC LIMIT $7"
        ))
        .db()?;
    let rows = st
        .query_map(
            params![
                req.account.as_str(),
                req.event_type,
                req.since.map(Timestamp::as_millis),
                req.until.map(Timestamp::as_millis),
                before,
                at,
                limit
            ],
            row_to_event,
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

pub(crate) fn event_list(t: &Tx<'_>, req: &EventListRequest) -> StoreResult<Page<Event>> {
    let rows = events_where(
        t,
        req,
        req.page.after(),
        None,
        i64::from(req.page.limit()) + 1,
    )?;
    match cut_by_time(rows, req.page.limit(), |e| e.created_at.as_millis()) {
        TimeCut::Last(items) => Ok(Page { items, next: None }),
        TimeCut::More {
            mut newer,
            boundary,
        } => {
            newer.extend(events_where(t, req, None, Some(boundary), i64::MAX)?);
            let older = events_where(t, req, Some(boundary), None, 1)?;
            Ok(Page {
                items: newer,
                next: (!older.is_empty()).then_some(boundary),
            })
        }
    }
}

pub(super) fn deliveries_of_event(t: &Tx<'_>, event: EventId) -> StoreResult<Vec<DeliveryId>> {
    let mut st = t
        .prepare("SELECT id FROM deliveries WHERE event_id = $1 ORDER BY endpoint_id")
        .db()?;
    let rows = st
        .query_map(params![event.to_string()], |r| r.col(0))
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

pub(crate) fn get(t: &Tx<'_>, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
    t.query_row(
        &format!("SELECT {DELIVERY_COLS} FROM deliveries d WHERE d.id = $1 AND d.account = $2"),
        params![id.to_string(), account.as_str()],
        row_to_delivery,
    )
    .optional()
    .db()?
    .ok_or_else(|| StoreError::not_found("delivery", id))
}

/// Deliveries of the request, newest first. Pending and leased ones come
/// from the writer's live index when it is kept, dead ones from the copies
/// in `dead_letters`, so that neither listing reads the finished history
/// (issue 54, ADR 0032).
pub(crate) fn list(t: &mut Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
    // The live index and the dead letters hold neither the event's type nor
    // the creation time: such a listing reads the table.
    if req.by_type_or_time() {
        let items = list_from_table(t, &req)?;
        return Ok(Page::from_overfetch(items, req.page.limit(), |d| d.seq));
    }
    let kept = match live_list(t, &req)? {
        Some(kept) => Some(kept),
        None => dead_list(t, &req)?,
    };
    let items = match kept {
        Some(kept) => {
            if t.check_against_table {
                let table = list_from_table(t, &req)?;
                if table != kept {
                    return Err(StoreError::Backend(format!(
                        "a listing from the live index or the dead letters differs from the \
                         deliveries table: kept {kept:?}, in the table {table:?}"
                    )));
                }
            }
            kept
        }
        None => list_from_table(t, &req)?,
    };
    Ok(Page::from_overfetch(items, req.page.limit(), |d| d.seq))
}

/// Dead letters in the columns of [`DELIVERY_COLS`].
const DEAD_LETTERS: &str = "SELECT id, account, endpoint_id, event_id, seq, 'dead', attempts, \
     max_attempts, due_at, lease_expires_at, last_error, created_at, updated_at FROM dead_letters";

/// One more than a page of the request's deliveries, newest first, from
/// `dead_letters` (migration 13); `None` when the request is not for dead
/// deliveries. An account's page is chosen in the writer's dead seqs
/// ([`crate::finished::FinishedTally::dead_page`]) and read as a range of
/// seqs: neither a top-N of every dead letter nor a lookup in `deliveries`,
/// which cost as much as the old scan (ADR 0032). A page of one endpoint or
/// event is a top-N of `dead_letters`. The postgres adapter pages its
/// partial index of dead rows instead.
fn dead_list(t: &mut Tx<'_>, req: &DeliveryListRequest) -> StoreResult<Option<Vec<Delivery>>> {
    if req.state != Some(DeliveryState::Dead) {
        return Ok(None);
    }
    if t.check_against_table {
        dead_letters_check(t)?;
    }
    let account = req.account.as_str();
    let mut page = if req.endpoint_id.is_none() && req.event_id.is_none() {
        let seqs = t.dead_page(req)?;
        let (Some(hi), Some(lo)) = (seqs.first(), seqs.last()) else {
            return Ok(Some(Vec::new()));
        };
        dead_letters_where(
            t,
            &format!("{DEAD_LETTERS} WHERE seq BETWEEN $2 AND $3 AND account = $1"),
            params![account, lo, hi],
        )?
    } else {
        dead_letters_where(
            t,
            &format!(
                "{DEAD_LETTERS} WHERE account = $1 AND ($2::VARCHAR IS NULL OR endpoint_id = $2) \
                 AND ($3::VARCHAR IS NULL OR event_id = $3) AND ($4::BIGINT IS NULL OR seq < $4) \
                 ORDER BY seq DESC LIMIT $5"
            ),
            params![
                account,
                req.endpoint_id.map(|e| e.to_string()),
                req.event_id.map(|e| e.to_string()),
                req.page.after(),
                i64::from(req.page.limit()) + 1
            ],
        )?
    };
    page.sort_unstable_by_key(|d| Reverse(d.seq));
    Ok(Some(page))
}

/// The dead letters `sql` ([`DEAD_LETTERS`] and a condition) selects.
fn dead_letters_where<P: duckdb::Params>(
    t: &Tx<'_>,
    sql: &str,
    params: P,
) -> StoreResult<Vec<Delivery>> {
    let mut st = t.prepare(sql).db()?;
    let rows = st.query_map(params, row_to_delivery).db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

/// Fails unless `dead_letters` holds exactly the dead rows of `deliveries`,
/// of every account: run at each dead listing when
/// [`crate::EmbeddedConfig::check_against_table`] is set.
fn dead_letters_check(t: &Tx<'_>) -> StoreResult<()> {
    let differ: i64 = t
        .query_row(
            &format!(
                "SELECT count(*) FROM ((SELECT {DEAD_LETTER_COLS} FROM dead_letters EXCEPT ALL \
                 SELECT {DEAD_LETTER_COLS} FROM deliveries WHERE state = 'dead') UNION ALL \
                 (SELECT {DEAD_LETTER_COLS} FROM deliveries WHERE state = 'dead' EXCEPT ALL \
                 SELECT {DEAD_LETTER_COLS} FROM dead_letters))"
            ),
            params![],
            |r| r.get(0),
        )
        .db()?;
    if differ > 0 {
        return Err(StoreError::Backend(format!(
            "the dead letters are out of step with the deliveries table: {differ} rows are in \
             one and not the other"
        )));
    }
    Ok(())
}

/// One more than a page of the request's deliveries, newest first, from
/// the live index; `None` when the request is not for a live state or the
/// index is not kept.
fn live_list(t: &mut Tx<'_>, req: &DeliveryListRequest) -> StoreResult<Option<Vec<Delivery>>> {
    let Some(state) = req.state.filter(|s| !s.is_final()) else {
        return Ok(None);
    };
    // A backlog past an endpoint's window is in the table only.
    let past_window = state == DeliveryState::Pending
        && t.live_queues()?.is_some_and(|queues| {
            queues.iter().any(|(e, q)| {
                q.overflow()
                    .is_some_and(|(account, _)| *account == req.account)
                    && req.endpoint_id.is_none_or(|want| want == *e)
            })
        });
    if past_window {
        return Ok(None);
    }
    let Some(rows) = t.live_rows()? else {
        return Ok(None);
    };
    let after = req.page.after();
    let mut found: Vec<&LiveRow> = rows
        .values()
        .filter(|l| {
            l.row.state == state
                && l.row.account == req.account
                && req.endpoint_id.is_none_or(|e| e == l.row.endpoint_id)
                && req.event_id.is_none_or(|e| e == l.event_id)
                && after.is_none_or(|a| l.row.seq < a)
        })
        .collect();
    let n = req.page.limit() as usize + 1;
    if found.len() > n {
        found.select_nth_unstable_by_key(n - 1, |l| Reverse(l.row.seq));
        found.truncate(n);
    }
    found.sort_unstable_by_key(|l| Reverse(l.row.seq));
    Ok(Some(found.into_iter().map(LiveRow::delivery).collect()))
}

/// One more than a page of the request's deliveries, newest first, from
/// the table, read in windows of sequence numbers going back from the
/// newest, each eight times as wide as the last, the last one down to the
/// lowest: DuckDB skips the row groups outside a window by their bounds
/// (ADR 0008), so that a page of recent deliveries does not scan the whole
/// history. A page that the windows do not fill reads, in all, about what
/// one scan would; with `since`, the windows stop at the first one that
/// reaches back before it (sequence numbers follow creation time: one
/// writer numbers deliveries as it creates them).
fn list_from_table(t: &Tx<'_>, req: &DeliveryListRequest) -> StoreResult<Vec<Delivery>> {
    let want = req.page.limit() as usize + 1;
    let top = t.last_seq().map_or(i64::MAX, |s| s.saturating_add(1));
    let mut hi = req.page.after().map_or(top, |a| a.min(top));
    let mut width: i64 = 4096;
    let mut found = Vec::new();
    loop {
        let lo = match hi.checked_sub(width) {
            Some(lo) if lo > 0 && top != i64::MAX => lo,
            _ => i64::MIN,
        };
        found.extend(table_window(t, req, (lo, hi), want - found.len())?);
        if found.len() >= want || lo == i64::MIN || reaches_before_since(t, req, lo)? {
            return Ok(found);
        }
        hi = lo;
        width = width.saturating_mul(8);
    }
}

/// Whether the deliveries from sequence number `lo` up include one created
/// before the request's `since` (`false` without one): no older window
/// can then hold a delivery of the listing.
fn reaches_before_since(t: &Tx<'_>, req: &DeliveryListRequest, lo: i64) -> StoreResult<bool> {
    let Some(since) = req.since else {
        return Ok(false);
    };
    let oldest: Option<i64> = t
        .query_row(
            "SELECT min(created_at) FROM deliveries WHERE seq >= $1 AND seq < $2",
            params![lo, lo.saturating_add(4096)],
            |r| r.get(0),
        )
        .db()?;
    Ok(oldest.is_some_and(|c| c < since.as_millis()))
}

/// The listing's statement over a window of sequence numbers (`$5` to
/// `$10`): without the event type and time conditions when the request
/// has none, so that the plain listing reads the deliveries table alone.
fn window_sql(req: &DeliveryListRequest) -> String {
    let by_type_or_time = if req.by_type_or_time() {
        "AND ($7::VARCHAR IS NULL OR d.event_id IN (SELECT e.id FROM events e WHERE e.account = $1 \
         AND e.event_type = $7)) AND ($8::BIGINT IS NULL OR d.created_at >= $8) \
         AND ($9::BIGINT IS NULL OR d.created_at < $9)"
    } else {
        "AND $7::VARCHAR IS NULL AND $8::BIGINT IS NULL AND $9::BIGINT IS NULL"
    };
    format!(
        "SELECT {DELIVERY_COLS} FROM deliveries d WHERE d.account = $1 \
         AND ($2::VARCHAR IS NULL OR d.state = $2) AND ($3::VARCHAR IS NULL OR d.endpoint_id = $3) \
         AND ($4::VARCHAR IS NULL OR d.event_id = $4) AND d.seq >= $5 AND d.seq < $10 \
         {by_type_or_time} ORDER BY d.seq DESC LIMIT $6"
    )
}

/// At most `n` of the request's deliveries with a sequence number in
/// `[lo, hi)`, newest first, from the table.
fn table_window(
    t: &Tx<'_>,
    req: &DeliveryListRequest,
    (lo, hi): (i64, i64),
    n: usize,
) -> StoreResult<Vec<Delivery>> {
    let mut st = t.prepare(&window_sql(req)).db()?;
    let rows = st
        .query_map(
            params![
                req.account.as_str(),
                req.state.map(DeliveryState::as_str),
                req.endpoint_id.map(|e| e.to_string()),
                req.event_id.map(|e| e.to_string()),
                lo,
                i64::try_from(n).unwrap_or(i64::MAX),
                req.event_type.as_deref(),
                req.since.map(Timestamp::as_millis),
                req.until.map(Timestamp::as_millis),
                hi
            ],
            row_to_delivery,
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

/// Deliveries by state, without zero counts, ordered by state: the sums of
/// [`count_by_account_and_state`].
pub(crate) fn count_by_state(t: &mut Tx<'_>) -> StoreResult<Vec<(DeliveryState, u64)>> {
    let mut by_state: BTreeMap<&'static str, (DeliveryState, u64)> = BTreeMap::new();
    for (_, state, n) in count_by_account_and_state(t)? {
        by_state.entry(state.as_str()).or_insert((state, 0)).1 += n;
    }
    Ok(by_state.into_values().collect())
}

/// Deliveries by account and state, without zero counts, ordered by
/// account then state. Live states are counted from the live set, finished
/// states from the tally the writer keeps as they change (issue 54):
/// neither reads the finished history, which grows without bound.
pub(crate) fn count_by_account_and_state(
    t: &mut Tx<'_>,
) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
    let mut counts = live_counts(t)?;
    counts.extend(t.finished_counts()?.iter().map(|(k, n)| (k.clone(), *n)));
    let mut out: Vec<(AccountId, DeliveryState, u64)> = counts
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|((account, state), n)| (account, state, n))
        .collect();
    out.sort_unstable_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
    Ok(out)
}

/// The live deliveries by account and state: from the rows the live index
/// keeps, or one scan of the live rows while it is not kept.
fn live_counts(t: &mut Tx<'_>) -> StoreResult<Counts> {
    let mut counts: HashMap<(AccountId, DeliveryState), u64> = HashMap::new();
    {
        let Some(rows) = t.live_rows()? else {
            return count_in_table(t, [DeliveryState::Pending, DeliveryState::Leased]);
        };
        for l in rows.values() {
            *counts
                .entry((l.row.account.clone(), l.row.state))
                .or_default() += 1;
        }
    }
    // And the pending deliveries past each endpoint's window.
    if let Some(queues) = t.live_queues()? {
        for (account, n) in queues.values().filter_map(EndpointQueue::overflow) {
            *counts
                .entry((account.clone(), DeliveryState::Pending))
                .or_default() += n;
        }
    }
    Ok(counts.into_iter().collect())
}

/// What a send needs of the events `ids`, from the writer's event cache
/// ([`crate::cache::EventCache`]); the ones it lacks are read in one
/// statement and kept.
pub(super) fn sent_events(
    t: &mut Tx<'_>,
    ids: impl Iterator<Item = EventId>,
) -> StoreResult<HashMap<EventId, std::sync::Arc<SentEvent>>> {
    let mut out = HashMap::new();
    let mut missing = Vec::new();
    for id in ids {
        if out.contains_key(&id) || missing.contains(&id) {
            continue;
        }
        match t.events.get(id) {
            Some(ev) => {
                out.insert(id, ev);
            }
            None => missing.push(id),
        }
    }
    // The tests check the cache against the table at every use.
    if t.check_against_table && !out.is_empty() {
        let kept: Vec<EventId> = out.keys().copied().collect();
        let table = read_sent_events(t, &kept)?;
        if kept
            .iter()
            .any(|id| table.get(id) != out.get(id).map(|e| &**e))
        {
            return Err(StoreError::Backend(
                "the event cache is out of step with the events table".into(),
            ));
        }
    }
    if !missing.is_empty() {
        for (id, ev) in read_sent_events(t, &missing)? {
            t.events.insert(id, ev.clone());
            out.insert(id, std::sync::Arc::new(ev));
        }
    }
    Ok(out)
}

fn read_sent_events(t: &Tx<'_>, ids: &[EventId]) -> StoreResult<HashMap<EventId, SentEvent>> {
    let mut st = t
        .prepare(
            "SELECT id, event_type, body, traceparent FROM events \
             WHERE id IN (SELECT unnest($1::VARCHAR[]))",
        )
        .db()?;
    let rows = st
        .query_map(params![list::text(ids)], |r| {
            let ev = SentEvent {
                event_type: r.get(1)?,
                body: r.get(2)?,
                traceparent: r.get(3)?,
            };
            Ok((r.col(0)?, ev))
        })
        .db()?;
    rows.collect::<Result<_, _>>().db()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use control_plane_core::Migrations;
    use control_plane_core::{DeliveryStore, EndpointId, ManualClock, PageRequest};
    use duckdb::Connection;

    use super::*;
    use crate::store::{migrate, MIGRATIONS};
    use crate::EmbeddedConfig;

    /// Version 13 copies the dead deliveries a file already holds into
    /// `dead_letters`, and nothing else: afterwards the dead-letter page
    /// (read from the copies, checked against the table) lists them as
    /// `deliveries` holds them, newest first, page by page.
    #[tokio::test]
    async fn migration_13_copies_every_dead_delivery_into_the_dead_letters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v12.duckdb");
        let mut conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE schema_version (version BIGINT NOT NULL)")
            .unwrap();
        for (version, sql) in &MIGRATIONS[..12] {
            conn.execute_batch(sql).unwrap();
            conn.execute("INSERT INTO schema_version VALUES ($1)", [version])
                .unwrap();
        }
        let insert =
            "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, \
                      max_attempts, due_at, last_error, created_at, updated_at) \
                      VALUES ($1, $2, $3, $4, $5, $6, 2, 2, 10, $7, 5, $8)";
        let endpoint = EndpointId::new().to_string();
        let rows = [
            ("a", 1, "dead", Some("503")),
            ("a", 2, "delivered", None),
            ("b", 3, "dead", None),
            ("a", 4, "pending", None),
            ("a", 5, "dead", Some("endpoint removed")),
            ("a", 6, "dead", Some("410")),
        ];
        for (account, seq, state, error) in rows {
            let (id, event) = (DeliveryId::new().to_string(), EventId::new().to_string());
            let params = params![id, account, endpoint, event, seq, state, error, 100 + seq];
            conn.execute(insert, params).unwrap();
        }
        // As the writer keeps it: at least every sequence number handed out.
        conn.execute_batch("UPDATE counters SET value = 6 WHERE name = 'delivery_seq'")
            .unwrap();
        migrate(&mut conn, Migrations::Apply).unwrap();
        drop(conn);

        let mut config = EmbeddedConfig::new(path);
        config.check_against_table = true;
        let store = crate::EmbeddedStore::open(config, Arc::new(ManualClock::default()))
            .await
            .unwrap();
        let dead = |page| DeliveryListRequest {
            state: Some(DeliveryState::Dead),
            ..DeliveryListRequest::all(AccountId::new("a").unwrap(), page)
        };
        let first = store
            .delivery_list(dead(PageRequest::first(2)))
            .await
            .unwrap();
        let seqs: Vec<i64> = first.items.iter().map(|d| d.seq).collect();
        assert_eq!(seqs, [6, 5]);
        assert_eq!(first.items[0].last_error.as_deref(), Some("410"));
        let get = store
            .delivery_get(&first.items[0].account, first.items[0].id)
            .await
            .unwrap();
        assert_eq!(first.items[0], get, "the copy is the row");
        let next = PageRequest::new(2, first.next).unwrap();
        let rest = store.delivery_list(dead(next)).await.unwrap();
        let seqs: Vec<i64> = rest.items.iter().map(|d| d.seq).collect();
        assert_eq!((seqs, rest.next), (vec![1], None));
    }

    /// A listing of all states reads the table in windows of sequence
    /// numbers back from the newest: an account whose deliveries are
    /// thousands of numbers apart (another account's in between) still
    /// gets every one of them, newest first, page by page, and another
    /// account's page stops where its rows do.
    #[tokio::test]
    async fn a_listing_reads_back_through_windows_until_the_page_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.duckdb");
        let mut conn = Connection::open(&path).unwrap();
        migrate(&mut conn, Migrations::Apply).unwrap();
        let insert = |account: &str, from: i64, to: i64| {
            format!(
                "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, \
                 max_attempts, due_at, created_at, updated_at) \
                 SELECT uuid()::VARCHAR, '{account}', '{}', uuid()::VARCHAR, i, 'delivered', 1, 5, 0, i, i \
                 FROM range({from}, {to}) t(i)",
                EndpointId::new()
            )
        };
        conn.execute_batch(&insert("a", 1, 4)).unwrap();
        conn.execute_batch(&insert("b", 4, 40_000)).unwrap();
        conn.execute_batch(&insert("a", 40_000, 40_002)).unwrap();
        conn.execute_batch("UPDATE counters SET value = 40001 WHERE name = 'delivery_seq'")
            .unwrap();
        drop(conn);
        let store =
            crate::EmbeddedStore::open(EmbeddedConfig::new(path), Arc::new(ManualClock::default()))
                .await
                .unwrap();
        let pages = |account: &'static str, per: u32| {
            let store = &store;
            async move {
                let (mut pages, mut after) = (Vec::new(), None);
                loop {
                    let req = DeliveryListRequest::all(
                        AccountId::new(account).unwrap(),
                        PageRequest::new(per, after).unwrap(),
                    );
                    let p = store.delivery_list(req).await.unwrap();
                    pages.push(p.items.iter().map(|d| d.seq).collect::<Vec<_>>());
                    match p.next {
                        Some(n) => after = Some(n),
                        None => return pages,
                    }
                }
            }
        };
        assert_eq!(
            pages("a", 2).await,
            [vec![40_001, 40_000], vec![3, 2], vec![1]]
        );
        assert_eq!(pages("a", 10).await, [vec![40_001, 40_000, 3, 2, 1]]);
        // By creation time (here the sequence number): within the newest
        // window, and across the gap.
        let by_time = |since: Option<i64>, until: Option<i64>| {
            let store = &store;
            async move {
                let mut req =
                    DeliveryListRequest::all(AccountId::new("a").unwrap(), PageRequest::first(10));
                req.since = since.map(Timestamp::from_millis);
                req.until = until.map(Timestamp::from_millis);
                let p = store.delivery_list(req).await.unwrap();
                p.items.iter().map(|d| d.seq).collect::<Vec<_>>()
            }
        };
        assert_eq!(by_time(Some(40_000), None).await, [40_001, 40_000]);
        assert_eq!(by_time(Some(2), None).await, [40_001, 40_000, 3, 2]);
        assert_eq!(by_time(None, Some(4)).await, [3, 2, 1]);
        assert_eq!(by_time(Some(2), Some(40_001)).await, [40_000, 3, 2]);
        let b = pages("b", 1000).await;
        assert_eq!(b.len(), 40);
        assert_eq!((b[0][0], b[39].last()), (39_999, Some(&4)));
        assert!(b.concat().windows(2).all(|w| w[0] == w[1] + 1));
    }
}
