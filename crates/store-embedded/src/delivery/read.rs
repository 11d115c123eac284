//! Reading deliveries and events: by id, listings, counts by state.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::*;
use crate::live::{count_in_table, Counts};

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
    })
}

pub(super) const EVENT_COLS: &str =
    "id, account, event_type, body, idempotency_key, created_at, traceparent";

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
/// from the writer's live index when it is kept, so listing the queue reads
/// nothing of the finished history (issue 54).
pub(crate) fn list(t: &mut Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
    let items = match live_list(t, &req)? {
        Some(kept) => {
            if t.check_against_table {
                let table = list_from_table(t, &req)?;
                if table != kept {
                    return Err(StoreError::Backend(format!(
                        "a listing from the live index differs from the table: \
                         kept {kept:?}, in the table {table:?}"
                    )));
                }
            }
            kept
        }
        None => list_from_table(t, &req)?,
    };
    Ok(Page::from_overfetch(items, req.page.limit(), |d| d.seq))
}

/// One more than a page of the request's deliveries, newest first, from
/// the live index; `None` when the request is not for a live state or the
/// index is not kept.
fn live_list(t: &mut Tx<'_>, req: &DeliveryListRequest) -> StoreResult<Option<Vec<Delivery>>> {
    let Some(state) = req.state.filter(|s| !s.is_final()) else {
        return Ok(None);
    };
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
/// the table.
fn list_from_table(t: &Tx<'_>, req: &DeliveryListRequest) -> StoreResult<Vec<Delivery>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {DELIVERY_COLS} FROM deliveries d WHERE d.account = $1 \
             AND ($2::VARCHAR IS NULL OR d.state = $2) AND ($3::VARCHAR IS NULL OR d.endpoint_id = $3) \
             AND ($4::VARCHAR IS NULL OR d.event_id = $4) AND ($5::BIGINT IS NULL OR d.seq < $5) \
             ORDER BY d.seq DESC LIMIT $6"
        ))
        .db()?;
    let rows = st
        .query_map(
            params![
                req.account.as_str(),
                req.state.map(DeliveryState::as_str),
                req.endpoint_id.map(|e| e.to_string()),
                req.event_id.map(|e| e.to_string()),
                req.page.after(),
                i64::from(req.page.limit()) + 1
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
    let Some(rows) = t.live_rows()? else {
        return count_in_table(t, [DeliveryState::Pending, DeliveryState::Leased]);
    };
    let mut counts: HashMap<(&AccountId, DeliveryState), u64> = HashMap::new();
    for l in rows.values() {
        *counts.entry((&l.row.account, l.row.state)).or_default() += 1;
    }
    Ok(counts
        .into_iter()
        .map(|((account, state), n)| ((account.clone(), state), n))
        .collect())
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
