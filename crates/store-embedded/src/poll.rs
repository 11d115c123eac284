//! Poll endpoints (ADR 0051): their consumers read their deliveries, in
//! order, and each read acknowledges what it hands out.

use async_trait::async_trait;
use control_plane_core::{
    not_a_poll_endpoint, DeliveryId, EventId, PollPage, PollRequest, PollStore, Polled, StoreError,
    StoreResult, Timestamp,
};
use duckdb::{params, OptionalExt};
use std::collections::HashMap;

use crate::delivery::deliver_polled;
use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};
use crate::util::{list, RowExt};

/// What was read of endpoint `$1` after position `$2` (its attempt log),
/// `$3` at most: the attempts of a poll endpoint are its reads, so its
/// attempt log is its stream. Positions grow with time, so the zone maps of
/// `id` skip what a recent cursor has passed.
const READ: &str = "SELECT id, delivery_id, recorded_at FROM attempts \
     WHERE endpoint_id = $1 AND id > $2 ORDER BY id LIMIT $3";

/// The events of deliveries `$1`, looked up only when a read found some:
/// a join would scan the whole history for a consumer that is caught up.
const EVENTS: &str = "SELECT d.id, v.id, v.event_type, v.body, v.created_at \
     FROM deliveries d JOIN events v ON v.id = d.event_id \
     WHERE d.id IN (SELECT unnest($1::VARCHAR[]))";

type Found = (DeliveryId, EventId, String, String, Timestamp);

fn read(t: &Tx<'_>, req: &PollRequest) -> StoreResult<Vec<Polled>> {
    let read: Vec<(i64, DeliveryId, Timestamp)> = {
        let mut st = t.prepare(READ).db()?;
        let rows = st
            .query_map(
                params![
                    req.endpoint.to_string(),
                    req.unchanged_cursor(),
                    i64::from(req.limit)
                ],
                |r| Ok((r.get(0)?, r.col(1)?, r.col(2)?)),
            )
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    if read.is_empty() {
        return Ok(Vec::new());
    }
    let found: HashMap<DeliveryId, Found> = {
        let mut st = t.prepare(EVENTS).db()?;
        let ids = list::text(read.iter().map(|(_, d, _)| *d));
        let rows = st
            .query_map(params![ids], |r| {
                Ok((r.col(0)?, r.col(1)?, r.get(2)?, r.get(3)?, r.col(4)?))
            })
            .db()?;
        rows.map(|r| r.map(|f: Found| (f.0, f)))
            .collect::<Result<_, _>>()
            .db()?
    };
    // An event erased since is left out, as the join would.
    Ok(read
        .into_iter()
        .filter_map(|(position, delivery_id, read_at)| {
            let (_, event_id, event_type, body, published_at) = found.get(&delivery_id)?.clone();
            Some(Polled {
                position,
                delivery_id,
                event_id,
                event_type,
                body,
                published_at,
                read_at,
            })
        })
        .collect())
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
    let before = events.len();
    let room = i64::from(req.limit) - before as i64;
    let mut handed = 0;
    if enabled && room > 0 {
        handed = deliver_polled(t, req.endpoint, room)?;
        if handed > 0 {
            events = read(t, req)?;
        }
    }
    PollPage::read(req, before, handed, events)
}

#[async_trait]
impl PollStore for EmbeddedStore {
    async fn delivery_poll(&self, req: PollRequest) -> StoreResult<PollPage> {
        self.tx(move |t| poll(t, &req)).await
    }
}
