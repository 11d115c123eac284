//! Reading deliveries and events: by id, listings, counts by state.

use crate::error::PgResultExt;
use crate::store::Tx;
use crate::util::RowExt;
use control_plane_core::{
    cut_by_time, AccountId, Delivery, DeliveryId, DeliveryListRequest, DeliveryState, Event,
    EventId, EventListRequest, Page, StoreError, StoreResult, TimeCut, Timestamp, TraceParent,
};
use control_plane_store_kit::columns::EVENT_COLS;
use tokio_postgres::Row;

/// A delivery with its state: the immutable row `d`, and its live row `l`
/// while it is pending or leased or its finished row `x` once it is
/// delivered or dead (ADR 0020). One of the two always exists: every change
/// moves a delivery between them inside one transaction.
pub(super) const DELIVERY_FROM: &str = "deliveries d \
     LEFT JOIN delivery_queue l ON l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
     LEFT JOIN delivery_done x ON x.delivery_id = d.id";

/// The columns of [`row_to_delivery`] over [`DELIVERY_FROM`].
pub(super) const DELIVERY_COLS: &str = "d.id, d.account, d.endpoint_id, d.event_id, d.seq, \
     coalesce(l.state, x.state), coalesce(l.attempts, x.attempts), \
     coalesce(l.max_attempts, x.max_attempts), coalesce(l.due_at, x.due_at), l.lease_expires_at, \
     coalesce(l.last_error, x.last_error), d.created_at, coalesce(l.updated_at, x.finished_at)";

/// The state of a row of [`DELIVERY_FROM`], `NULL` for none.
pub(super) const STATE_OF: &str = "coalesce(l.state, x.state)";

pub(super) fn row_to_delivery(r: &Row) -> StoreResult<Delivery> {
    Ok(Delivery {
        id: r.col(0)?,
        account: r.col(1)?,
        endpoint_id: r.col(2)?,
        event_id: r.col(3)?,
        seq: r.col(4)?,
        state: r.col(5)?,
        attempts: r.col(6)?,
        max_attempts: r.col(7)?,
        due_at: r.col(8)?,
        lease_expires_at: r.col(9)?,
        last_error: r.col(10)?,
        created_at: r.col(11)?,
        updated_at: r.col(12)?,
    })
}

pub(super) fn row_to_event(r: &Row) -> StoreResult<Event> {
    Ok(Event {
        id: r.col(0)?,
        account: r.col(1)?,
        event_type: r.col(2)?,
        body: r.col(3)?,
        idempotency_key: r.col(4)?,
        traceparent: r
            .col::<Option<String>>(6)?
            .and_then(|t| TraceParent::parse(&t)),
        created_at: r.col(5)?,
        example: r.col(7)?,
    })
}

pub(crate) async fn event_get(t: &Tx<'_>, account: &AccountId, id: EventId) -> StoreResult<Event> {
    let row = t
        .query_opt(
            &format!("SELECT {EVENT_COLS} FROM events WHERE id = $1 AND account = $2"),
            &[&id.0, &account.as_str()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("event", id))?;
    row_to_event(&row)
}

/// The event of `account` published with idempotency key `key`, if any.
pub(crate) async fn event_by_key(
    t: &Tx<'_>,
    account: &AccountId,
    key: &str,
) -> StoreResult<Option<Event>> {
    t.query_opt(
        &format!("SELECT {EVENT_COLS} FROM events WHERE account = $1 AND idempotency_key = $2"),
        &[&account.as_str(), &key],
    )
    .await
    .db()?
    .map(|row| row_to_event(&row))
    .transpose()
}

/// Events of the request, newest first: before `before`, or exactly `at`.
pub(super) async fn events_where(
    t: &Tx<'_>,
    req: &EventListRequest,
    before: Option<i64>,
    at: Option<i64>,
    limit: i64,
) -> StoreResult<Vec<Event>> {
    let rows = t
        .query(
            &format!(
                "SELECT {EVENT_COLS} FROM events WHERE account = $1 AND ($2::text IS NULL OR event_type = $2) \
                 AND ($3::bigint IS NULL OR created_at >= $3) AND ($4::bigint IS NULL OR created_at < $4) \
                 AND ($5::bigint IS NULL OR created_at < $5) AND ($6::bigint IS NULL OR created_at = $6) \
                 ORDER BY created_at DESC, id DESC LIMIT $7"
            ),
            &[
                &req.account.as_str(),
                &req.event_type,
                &req.since.map(Timestamp::as_millis),
                &req.until.map(Timestamp::as_millis),
                &before,
                &at,
                &limit,
            ],
        )
        .await
        .db()?;
    rows.iter().map(row_to_event).collect()
}

pub(crate) async fn event_list(t: &Tx<'_>, req: &EventListRequest) -> StoreResult<Page<Event>> {
    let rows = events_where(
        t,
        req,
        req.page.after(),
        None,
        i64::from(req.page.limit()) + 1,
    )
    .await?;
    match cut_by_time(rows, req.page.limit(), |e| e.created_at.as_millis()) {
        TimeCut::Last(items) => Ok(Page { items, next: None }),
        TimeCut::More {
            mut newer,
            boundary,
        } => {
            newer.extend(events_where(t, req, None, Some(boundary), i64::MAX).await?);
            let older = events_where(t, req, Some(boundary), None, 1).await?;
            Ok(Page {
                items: newer,
                next: (!older.is_empty()).then_some(boundary),
            })
        }
    }
}

pub(super) async fn deliveries_of_event(
    t: &Tx<'_>,
    event: EventId,
) -> StoreResult<Vec<DeliveryId>> {
    let rows = t
        .query(
            "SELECT id FROM deliveries WHERE event_id = $1 ORDER BY endpoint_id",
            &[&event.0],
        )
        .await
        .db()?;
    rows.iter().map(|r| r.col(0)).collect()
}

pub(crate) async fn get(t: &Tx<'_>, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
    let row = t
        .query_opt(
            &format!(
                "SELECT {DELIVERY_COLS} FROM {DELIVERY_FROM} \
                 WHERE d.id = $1 AND d.account = $2 AND {STATE_OF} IS NOT NULL"
            ),
            &[&id.0, &account.as_str()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("delivery", id))?;
    row_to_delivery(&row)
}

/// A listing of a live state: the page is chosen in the live table alone
/// (filtered and ordered by its own columns), then joined to its immutable
/// rows, so it reads the live rows however long the finished history is
/// (ADR 0032).
const LIVE_PAGE: &str = "(SELECT * FROM delivery_queue l WHERE l.account = $1 AND l.state = $2 \
     AND ($3::uuid IS NULL OR l.endpoint_id = $3) AND ($5::bigint IS NULL OR l.seq < $5) \
     AND ($4::uuid IS NULL OR l.delivery_id IN (SELECT id FROM deliveries WHERE event_id = $4)) \
     ORDER BY l.seq DESC LIMIT $6) l \
     JOIN deliveries d ON d.id = l.delivery_id LEFT JOIN delivery_done x ON false";

/// The dead letters of an account without other filters: the page is
/// chosen in the partial index of dead rows by account and sequence number
/// (migration 17), then joined to its immutable rows (ADR 0032).
const DEAD_PAGE: &str = "(SELECT * FROM delivery_done x WHERE x.state = 'dead' AND x.account = $1 \
     AND $2::text = 'dead' AND $3::uuid IS NULL AND $4::uuid IS NULL \
     AND ($5::bigint IS NULL OR x.seq < $5) ORDER BY x.seq DESC LIMIT $6) x \
     JOIN deliveries d ON d.id = x.delivery_id LEFT JOIN delivery_queue l ON false";

/// The conditions on the immutable row `d0` of a live or dead row by the
/// event's type and the creation time (`$7` to `$9`), and by the event
/// (`$4`).
const BY_TYPE_OR_TIME: &str = "($4::uuid IS NULL OR d0.event_id = $4) \
     AND ($7::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.id = d0.event_id AND e.event_type = $7)) \
     AND ($8::bigint IS NULL OR d0.created_at >= $8) AND ($9::bigint IS NULL OR d0.created_at < $9)";

/// A listing of a live or dead state filtered by the event's type or the
/// creation time: the page is chosen among the account's live rows (or
/// its dead rows) of that state, each checked against its immutable row and
/// event, so that it reads those rows, not the finished history.
fn state_page_by_type_or_time(dead: bool) -> String {
    if dead {
        format!(
            "(SELECT x.* FROM delivery_done x JOIN deliveries d0 ON d0.id = x.delivery_id \
             WHERE x.state = 'dead' AND x.account = $1 AND $2::text = 'dead' \
             AND ($3::uuid IS NULL OR d0.endpoint_id = $3) AND ($5::bigint IS NULL OR x.seq < $5) \
             AND {BY_TYPE_OR_TIME} ORDER BY x.seq DESC LIMIT $6) x \
             JOIN deliveries d ON d.id = x.delivery_id LEFT JOIN delivery_queue l ON false"
        )
    } else {
        format!(
            "(SELECT l.* FROM delivery_queue l JOIN deliveries d0 ON d0.id = l.delivery_id \
             WHERE l.account = $1 AND l.state = $2 AND ($3::uuid IS NULL OR l.endpoint_id = $3) \
             AND ($5::bigint IS NULL OR l.seq < $5) AND {BY_TYPE_OR_TIME} \
             ORDER BY l.seq DESC LIMIT $6) l \
             JOIN deliveries d ON d.id = l.delivery_id LEFT JOIN delivery_done x ON false"
        )
    }
}

pub(crate) async fn list(t: &Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
    // The fast pages by state read the live table or the dead rows alone;
    // filtered by the event's type or the creation time, they read those
    // rows' immutable rows too, still not the finished history.
    let plain = !req.by_type_or_time();
    let live_state = matches!(
        req.state,
        Some(DeliveryState::Pending | DeliveryState::Leased)
    );
    let dead_state = req.state == Some(DeliveryState::Dead);
    let live = plain && live_state;
    let dead_only = plain && dead_state && req.endpoint_id.is_none() && req.event_id.is_none();
    let sql = if live {
        format!("SELECT {DELIVERY_COLS} FROM {LIVE_PAGE} ORDER BY l.seq DESC")
    } else if dead_only {
        format!("SELECT {DELIVERY_COLS} FROM {DEAD_PAGE} ORDER BY x.seq DESC")
    } else if !plain && (live_state || dead_state) {
        let page = state_page_by_type_or_time(dead_state);
        let by = if dead_state { "x" } else { "l" };
        format!("SELECT {DELIVERY_COLS} FROM {page} ORDER BY {by}.seq DESC")
    } else {
        format!(
            "SELECT {DELIVERY_COLS} FROM {DELIVERY_FROM} WHERE d.account = $1 AND {STATE_OF} IS NOT NULL \
             AND ($2::text IS NULL OR {STATE_OF} = $2) AND ($3::uuid IS NULL OR d.endpoint_id = $3) \
             AND ($4::uuid IS NULL OR d.event_id = $4) AND ($5::bigint IS NULL OR d.seq < $5) \
             AND ($7::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id AND e.event_type = $7)) \
             AND ($8::bigint IS NULL OR d.created_at >= $8) AND ($9::bigint IS NULL OR d.created_at < $9) \
             ORDER BY d.seq DESC LIMIT $6"
        )
    };
    let account = req.account.as_str();
    let state = req.state.map(DeliveryState::as_str);
    let endpoint = req.endpoint_id.map(|e| e.0);
    let event = req.event_id.map(|e| e.0);
    let after = req.page.after();
    let limit = i64::from(req.page.limit()) + 1;
    let since = req.since.map(Timestamp::as_millis);
    let until = req.until.map(Timestamp::as_millis);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
        &account,
        &state,
        &endpoint,
        &event,
        &after,
        &limit,
        &req.event_type,
        &since,
        &until,
    ];
    // The fast pages take the first six.
    let used = if live || dead_only { 6 } else { 9 };
    let rows = t.query(&sql, &params[..used]).await.db()?;
    let items = rows
        .iter()
        .map(row_to_delivery)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, req.page.limit(), |d| d.seq))
}

/// Deliveries by account and state: live ones counted in the live table,
/// finished ones summed from the tally deltas (ADR 0032). Neither reads the
/// finished history.
const COUNTS: &str =
    "SELECT account, state, count(*) AS n FROM delivery_queue GROUP BY account, state \
     UNION ALL SELECT account, state, sum(n) FROM delivery_tallies GROUP BY account, state";

pub(crate) async fn count_by_state(t: &Tx<'_>) -> StoreResult<Vec<(DeliveryState, u64)>> {
    let rows = t
        .query(
            &format!(
                "SELECT state, sum(n)::bigint FROM ({COUNTS}) s GROUP BY state HAVING sum(n) > 0 ORDER BY state"
            ),
            &[],
        )
        .await
        .db()?;
    rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect()
}

pub(crate) async fn count_by_account_and_state(
    t: &Tx<'_>,
) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
    let rows = t
        .query(
            &format!(
                "SELECT account, state, sum(n)::bigint FROM ({COUNTS}) s \
                 GROUP BY account, state HAVING sum(n) > 0 ORDER BY account, state"
            ),
            &[],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| Ok((r.col(0)?, r.col(1)?, r.col(2)?)))
        .collect()
}
