//! Poll endpoints (ADR 0051): their consumers read their deliveries, in
//! order, and each read acknowledges what it hands out.

use async_trait::async_trait;
use control_plane_core::{
    not_a_poll_endpoint, PollPage, PollRequest, PollStore, Polled, StoreError, StoreResult,
};
use duckdb::{params, OptionalExt};

use crate::delivery::deliver_polled;
use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};
use crate::util::RowExt;

/// What was read of endpoint `$1` after position `$2` (its attempt log),
/// `$3` at most, with the events: the attempts of a poll endpoint are its
/// reads, so its attempt log is its stream. Positions grow with time, so
/// the zone maps of `id` skip what a recent cursor has passed.
const READ: &str =
    "SELECT a.id, a.delivery_id, d.event_id, v.event_type, v.body, v.created_at, a.recorded_at \
     FROM attempts a JOIN deliveries d ON d.id = a.delivery_id JOIN events v ON v.id = d.event_id \
     WHERE a.endpoint_id = $1 AND a.id > $2 ORDER BY a.id LIMIT $3";

fn read(t: &Tx<'_>, req: &PollRequest) -> StoreResult<Vec<Polled>> {
    let mut st = t.prepare(READ).db()?;
    let rows = st
        .query_map(
            params![
                req.endpoint.to_string(),
                req.unchanged_cursor(),
                i64::from(req.limit)
            ],
            |r| {
                Ok(Polled {
                    position: r.get(0)?,
                    delivery_id: r.col(1)?,
                    event_id: r.col(2)?,
                    event_type: r.get(3)?,
                    body: r.get(4)?,
                    published_at: r.col(5)?,
                    read_at: r.col(6)?,
                })
            },
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

/// One read. The writer runs one transaction at a time, so reads of an
/// endpoint are serialised and positions follow the order of hand-outs.
fn poll(t: &mut Tx<'_>, req: &PollRequest) -> StoreResult<PollPage> {
    let found: Option<(String, bool)> = t
        .query_row(
            "SELECT url, enabled FROM endpoints WHERE id = $1 AND account = $2 AND deleted_at IS NULL",
            params![req.endpoint.to_string(), req.account.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .db()?;
    let Some((url, enabled)) = found else {
        return Err(StoreError::not_found("endpoint", req.endpoint));
    };
    if !url.is_empty() {
        return Err(not_a_poll_endpoint(req.endpoint));
    }
    let mut events = read(t, req)?;
    let room = i64::from(req.limit) - events.len() as i64;
    if enabled && room > 0 {
        deliver_polled(t, req.endpoint, room)?;
        events = read(t, req)?;
    }
    Ok(PollPage::of(req, events))
}

#[async_trait]
impl PollStore for EmbeddedStore {
    async fn delivery_poll(&self, req: PollRequest) -> StoreResult<PollPage> {
        self.tx(move |t| poll(t, &req)).await
    }
}
