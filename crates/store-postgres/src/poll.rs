//! Poll endpoints (ADR 0051): their consumers read their deliveries, in
//! order, and each read acknowledges what it hands out.

use async_trait::async_trait;
use control_plane_core::{
    not_a_poll_endpoint, PollPage, PollRequest, PollStore, Polled, StoreError, StoreResult,
    Timestamp,
};

use crate::delivery::deliver_polled;
use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};
use crate::util::RowExt;

/// What was read of endpoint `$1` after position `$2` (its attempt log),
/// `$3` at most, with the events: the attempts of a poll endpoint are its
/// reads, so its attempt log is its stream. The index by endpoint and id
/// finds them.
const READ: &str =
    "SELECT a.id, a.delivery_id, d.event_id, v.event_type, v.body, v.created_at, a.recorded_at \
     FROM attempts a JOIN deliveries d ON d.id = a.delivery_id JOIN events v ON v.id = d.event_id \
     WHERE a.endpoint_id = $1 AND a.id > $2 ORDER BY a.id LIMIT $3";

async fn read(t: &Tx<'_>, req: &PollRequest) -> StoreResult<Vec<Polled>> {
    let rows = t
        .query(
            READ,
            &[
                &req.endpoint.0,
                &req.unchanged_cursor(),
                &i64::from(req.limit),
            ],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| {
            Ok(Polled {
                position: r.col(0)?,
                delivery_id: r.col(1)?,
                event_id: r.col(2)?,
                event_type: r.col(3)?,
                body: r.col(4)?,
                published_at: Timestamp::from_millis(r.col(5)?),
                read_at: Timestamp::from_millis(r.col(6)?),
            })
        })
        .collect()
}

/// Serialises the reads of one endpoint, so that attempt-log positions
/// follow the order reads hand deliveries out in (a later read never
/// commits a lower position). Taken first, so that every statement after it
/// sees what the read before committed.
async fn lock(t: &Tx<'_>, req: &PollRequest) -> StoreResult<()> {
    t.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('poll of ' || $1, 0))",
        &[&req.endpoint.0.to_string()],
    )
    .await
    .db()?;
    Ok(())
}

async fn poll(t: &Tx<'_>, req: &PollRequest) -> StoreResult<PollPage> {
    lock(t, req).await?;
    let found = t
        .query_opt(
            "SELECT url, enabled FROM endpoints WHERE id = $1 AND account = $2 AND deleted_at IS NULL",
            &[&req.endpoint.0, &req.account.as_str()],
        )
        .await
        .db()?;
    let Some(found) = found else {
        return Err(StoreError::not_found("endpoint", req.endpoint));
    };
    let (url, enabled): (String, bool) = (found.col(0)?, found.col(1)?);
    if !url.is_empty() {
        return Err(not_a_poll_endpoint(req.endpoint));
    }
    let mut events = read(t, req).await?;
    let before = events.len();
    let room = i64::from(req.limit) - before as i64;
    let mut handed = 0;
    if enabled && room > 0 {
        handed = deliver_polled(t, req.endpoint, room).await?;
        if handed > 0 {
            events = read(t, req).await?;
        }
    }
    PollPage::read(req, before, handed, events)
}

#[async_trait]
impl PollStore for PostgresStore {
    async fn delivery_poll(&self, req: PollRequest) -> StoreResult<PollPage> {
        in_tx!(self, |t| poll(&t, &req))
    }
}
