//! Reading deliveries and events: by id, listings, counts by state.

use super::*;

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

pub(crate) fn list(t: &Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
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
    let items = rows.collect::<Result<Vec<_>, _>>().db()?;
    Ok(Page::from_overfetch(items, req.page.limit(), |d| d.seq))
}

pub(crate) fn count_by_state(t: &Tx<'_>) -> StoreResult<Vec<(DeliveryState, u64)>> {
    let mut st = t
        .prepare("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY state")
        .db()?;
    let rows = st
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .db()?;
    let mut out = Vec::new();
    for r in rows {
        let (s, n) = r.db()?;
        out.push((s.parse()?, u64::try_from(n).unwrap_or(0)));
    }
    Ok(out)
}

pub(crate) fn count_by_account_and_state(
    t: &Tx<'_>,
) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
    let mut st = t
        .prepare(
            "SELECT account, state, count(*) FROM deliveries GROUP BY account, state ORDER BY account, state",
        )
        .db()?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .db()?;
    let mut out = Vec::new();
    for r in rows {
        let (a, s, n) = r.db()?;
        out.push((
            AccountId::new(a)?,
            s.parse()?,
            u64::try_from(n).unwrap_or(0),
        ));
    }
    Ok(out)
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
    // Debug builds check the cache against the table at every use.
    if cfg!(debug_assertions) && !out.is_empty() {
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
