//! Events, fan-out and the delivery queue.

use std::time::Duration;

use control_plane_core::policy::{
    alerts_for, plan_lease_expiry, plan_outcome, repeat_verdict, AttemptState, Transition,
};
use control_plane_core::types::validate_limit;
use control_plane_core::{
    AccountId, ClaimRequest, ClaimedDelivery, Delivery, DeliveryId, DeliveryListRequest,
    DeliveryOutcome, DeliveryState, EndpointId, Enqueued, Event, EventId, Lease, LeaseToken,
    OutcomeRecorded, Page, PublishRequest, Published, Secret, SigningSecrets, StoreError,
    StoreResult, Timestamp,
};
use duckdb::{params, OptionalExt, Row};

use crate::attempt;
use crate::endpoint;
use crate::error::DuckResultExt;
use crate::store::Tx;
use crate::util::{col_uuid, ts, ts_opt};
use control_plane_core::{alert_event, fan_out, AlertKind};

const DELIVERY_COLS: &str =
    "d.id, d.account, d.endpoint_id, d.event_id, d.seq, d.state, d.attempts, \
     d.max_attempts, d.due_at, d.lease_expires_at, d.last_error, d.created_at, d.updated_at";

fn row_to_delivery(r: &Row<'_>) -> duckdb::Result<Delivery> {
    let state: String = r.get(5)?;
    let account: String = r.get(1)?;
    let conv = |i: usize, e: StoreError| {
        duckdb::Error::FromSqlConversionFailure(i, duckdb::types::Type::Text, Box::new(e))
    };
    Ok(Delivery {
        id: DeliveryId(col_uuid(r, 0)?),
        account: AccountId::new(account).map_err(|e| conv(1, e))?,
        endpoint_id: EndpointId(col_uuid(r, 2)?),
        event_id: EventId(col_uuid(r, 3)?),
        seq: r.get(4)?,
        state: state.parse().map_err(|e| conv(5, e))?,
        attempts: r.get(6)?,
        max_attempts: r.get(7)?,
        due_at: ts(r, 8)?,
        lease_expires_at: ts_opt(r, 9)?,
        last_error: r.get(10)?,
        created_at: ts(r, 11)?,
        updated_at: ts(r, 12)?,
    })
}

fn row_to_event(r: &Row<'_>) -> duckdb::Result<Event> {
    let account: String = r.get(1)?;
    Ok(Event {
        id: EventId(col_uuid(r, 0)?),
        account: AccountId::new(account).map_err(|e| {
            duckdb::Error::FromSqlConversionFailure(1, duckdb::types::Type::Text, Box::new(e))
        })?,
        event_type: r.get(2)?,
        body: r.get(3)?,
        idempotency_key: r.get(4)?,
        created_at: ts(r, 5)?,
    })
}

const EVENT_COLS: &str = "id, account, event_type, body, idempotency_key, created_at";

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

fn deliveries_of_event(t: &Tx<'_>, event: EventId) -> StoreResult<Vec<DeliveryId>> {
    let mut st = t
        .prepare("SELECT id FROM deliveries WHERE event_id = $1 ORDER BY endpoint_id")
        .db()?;
    let rows = st
        .query_map(params![event.to_string()], |r| {
            col_uuid(r, 0).map(DeliveryId)
        })
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

fn insert_delivery(
    t: &mut Tx<'_>,
    account: &AccountId,
    endpoint: EndpointId,
    event: EventId,
) -> StoreResult<DeliveryId> {
    let id = DeliveryId::new();
    let seq = t.next_seq();
    t.execute(
        "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, max_attempts, \
         due_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, $7, $7, $7)",
        params![
            id.to_string(),
            account.as_str(),
            endpoint.to_string(),
            event.to_string(),
            seq,
            t.options.max_attempts,
            t.now.as_millis()
        ],
    )
    .db()?;
    Ok(id)
}

/// Publishes every request in the one transaction `t` belongs to.
pub(crate) fn publish(t: &mut Tx<'_>, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
    for r in &reqs {
        r.validate()?;
    }
    let mut out = Vec::with_capacity(reqs.len());
    for req in reqs {
        if let Some(key) = &req.idempotency_key {
            let existing = t
                .query_row(
                    &format!("SELECT {EVENT_COLS} FROM events WHERE account = $1 AND idempotency_key = $2"),
                    params![req.account.as_str(), key],
                    row_to_event,
                )
                .optional()
                .db()?;
            if let Some(event) = existing {
                let deliveries = deliveries_of_event(t, event.id)?;
                out.push(Published {
                    event,
                    deliveries,
                    created: false,
                });
                continue;
            }
        }
        out.push(publish_new(t, &req, None)?);
    }
    Ok(out)
}

/// Stores a new event and fans it out (see [`fan_out`]); `about` is the
/// endpoint an operational event concerns.
fn publish_new(
    t: &mut Tx<'_>,
    req: &PublishRequest,
    about: Option<EndpointId>,
) -> StoreResult<Published> {
    let event = Event {
        id: EventId::new(),
        account: req.account.clone(),
        event_type: req.event_type.clone(),
        body: req.body(t.now),
        idempotency_key: req.idempotency_key.clone(),
        created_at: t.now,
    };
    t.execute(
        "INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        params![
            event.id.to_string(),
            event.account.as_str(),
            event.event_type,
            event.body,
            event.idempotency_key,
            event.created_at.as_millis()
        ],
    )
    .db()?;
    let targets = fan_out(&endpoint::list(t, &req.account)?, &req.event_type, about);
    let mut deliveries = Vec::with_capacity(targets.len());
    for e in targets {
        deliveries.push(insert_delivery(t, &req.account, e, event.id)?);
    }
    Ok(Published {
        event,
        deliveries,
        created: true,
    })
}

/// Records an alert and publishes it as an event, in the caller's transaction.
pub(crate) fn raise_alert(
    t: &mut Tx<'_>,
    account: &AccountId,
    kind: AlertKind,
    endpoint: EndpointId,
    delivery: Option<DeliveryId>,
    message: &str,
) -> StoreResult<()> {
    crate::ops::alert_insert(t, account, kind, endpoint, delivery, message)?;
    let req = alert_event(account, kind, endpoint, delivery, message);
    if !fan_out(
        &endpoint::list(t, account)?,
        &req.event_type,
        Some(endpoint),
    )
    .is_empty()
    {
        publish_new(t, &req, Some(endpoint))?;
    }
    Ok(())
}

pub(crate) fn enqueue(
    t: &mut Tx<'_>,
    account: &AccountId,
    endpoint_id: EndpointId,
    event: EventId,
) -> StoreResult<Enqueued> {
    endpoint::get(t, account, endpoint_id)?;
    event_get(t, account, event)?;
    let existing = t
        .query_row(
            "SELECT id FROM deliveries WHERE endpoint_id = $1 AND event_id = $2",
            params![endpoint_id.to_string(), event.to_string()],
            |r| col_uuid(r, 0),
        )
        .optional()
        .db()?;
    match existing {
        Some(id) => Ok(Enqueued {
            delivery_id: DeliveryId(id),
            won: false,
        }),
        None => Ok(Enqueued {
            delivery_id: insert_delivery(t, account, endpoint_id, event)?,
            won: true,
        }),
    }
}

/// The fields of a delivery a transition needs.
struct LeaseRow {
    id: DeliveryId,
    account: AccountId,
    endpoint_id: EndpointId,
    attempts: u32,
    max_attempts: u32,
    due_at: Timestamp,
    state: DeliveryState,
    lease_token: Option<String>,
    lease_expires_at: Option<Timestamp>,
    last_outcome: Option<String>,
}

impl LeaseRow {
    fn state_for_plan(&self) -> AttemptState {
        AttemptState {
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            due_at: self.due_at,
        }
    }
}

const LEASE_COLS: &str =
    "id, account, endpoint_id, attempts, max_attempts, due_at, state, lease_token, \
     lease_expires_at, last_outcome";

fn row_to_lease_row(r: &Row<'_>) -> duckdb::Result<LeaseRow> {
    let account: String = r.get(1)?;
    let state: String = r.get(6)?;
    let conv = |i: usize, e: StoreError| {
        duckdb::Error::FromSqlConversionFailure(i, duckdb::types::Type::Text, Box::new(e))
    };
    Ok(LeaseRow {
        id: DeliveryId(col_uuid(r, 0)?),
        account: AccountId::new(account).map_err(|e| conv(1, e))?,
        endpoint_id: EndpointId(col_uuid(r, 2)?),
        attempts: r.get(3)?,
        max_attempts: r.get(4)?,
        due_at: ts(r, 5)?,
        state: state.parse().map_err(|e| conv(6, e))?,
        lease_token: r.get(7)?,
        lease_expires_at: ts_opt(r, 8)?,
        last_outcome: r.get(9)?,
    })
}

fn lease_row(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<LeaseRow>> {
    t.query_row(
        &format!("SELECT {LEASE_COLS} FROM deliveries WHERE id = $1"),
        params![id.to_string()],
        row_to_lease_row,
    )
    .optional()
    .db()
}

/// The row, if `lease` is its current live lease.
fn leased_row(t: &Tx<'_>, lease: &Lease) -> StoreResult<Option<LeaseRow>> {
    let token = lease.token.to_string();
    Ok(lease_row(t, lease.delivery_id)?.filter(|r| {
        r.state == DeliveryState::Leased && r.lease_token.as_deref() == Some(token.as_str())
    }))
}

/// Writes a transition: the delivery, its attempt-log row, a disable.
fn apply(
    t: &mut Tx<'_>,
    row: &LeaseRow,
    tr: &Transition,
    keep_token: Option<String>,
    outcome_kind: Option<&str>,
) -> StoreResult<()> {
    t.execute(
        "UPDATE deliveries SET state = $1, due_at = $2, last_error = $3, lease_expires_at = NULL, \
         leased_by = NULL, lease_token = $4, last_outcome = $5, updated_at = $6 WHERE id = $7",
        params![
            tr.state.as_str(),
            tr.due_at.as_millis(),
            tr.last_error,
            keep_token,
            outcome_kind,
            t.now.as_millis(),
            row.id.to_string()
        ],
    )
    .db()?;
    attempt::insert(
        t,
        row.id,
        row.endpoint_id,
        &row.account,
        row.attempts,
        &tr.attempt,
    )?;
    let mut disabled = false;
    if let Some(reason) = &tr.disable_reason {
        disabled = endpoint::disable(t, row.endpoint_id, reason)?;
    }
    for (kind, message) in alerts_for(tr, disabled) {
        let delivery = (kind == AlertKind::DeliveryDead).then_some(row.id);
        raise_alert(t, &row.account, kind, row.endpoint_id, delivery, &message)?;
    }
    Ok(())
}

/// Logs and frees every lease that expired by `t.now`.
fn sweep_expired(t: &mut Tx<'_>) -> StoreResult<()> {
    let expired = {
        let mut st = t
            .prepare(&format!(
                "SELECT {LEASE_COLS} FROM deliveries WHERE state = 'leased' AND lease_expires_at <= $1 ORDER BY seq"
            ))
            .db()?;
        let rows = st
            .query_map(params![t.now.as_millis()], row_to_lease_row)
            .db()?;
        rows.collect::<Result<Vec<_>, _>>().db()?
    };
    for row in expired {
        let mut circuit = endpoint::load_circuit(t, row.endpoint_id)?;
        let probe = circuit.is_probe(row.id);
        let tr = plan_lease_expiry(row.state_for_plan(), &mut circuit, probe, t.now, &t.options);
        endpoint::save_circuit(t, row.endpoint_id, &circuit)?;
        apply(t, &row, &tr, None, None)?;
    }
    Ok(())
}

/// Pending, due, on a live enabled endpoint, and the head of an ordered one.
const CLAIMABLE: &str =
    "d.state = 'pending' AND d.due_at <= $1 AND e.enabled AND e.deleted_at IS NULL \
     AND (NOT e.ordered OR d.seq = (SELECT min(h.seq) FROM deliveries h \
          WHERE h.endpoint_id = d.endpoint_id AND h.state IN ('pending', 'leased')))";

pub(crate) fn claim(t: &mut Tx<'_>, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
    validate_limit(req.limit)?;
    if req.lease_for.is_zero() {
        return Err(StoreError::InvalidInput(
            "lease_for must be longer than zero".into(),
        ));
    }
    sweep_expired(t)?;
    let now = t.now.as_millis();
    let pick = |r: &Row<'_>| -> duckdb::Result<(DeliveryId, EndpointId, i64, i64)> {
        Ok((
            DeliveryId(col_uuid(r, 0)?),
            EndpointId(col_uuid(r, 1)?),
            r.get(2)?,
            r.get(3)?,
        ))
    };
    // Probes first (one per circuit whose cooldown is over), then ordinary
    // candidates on closed circuits fill the rest of the limit.
    let mut picks: Vec<((DeliveryId, EndpointId, i64, i64), bool)> = Vec::new();
    {
        let mut st = t
            .prepare(&format!(
                "SELECT d.id, d.endpoint_id, d.due_at, d.seq FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
                 WHERE {CLAIMABLE} AND e.circuit_mode = 'open' AND e.circuit_open_until <= $1 \
                 QUALIFY row_number() OVER (PARTITION BY d.endpoint_id ORDER BY d.due_at, d.seq) = 1 \
                 ORDER BY d.due_at, d.seq LIMIT $2"
            ))
            .db()?;
        let rows = st.query_map(params![now, req.limit], pick).db()?;
        for r in rows {
            picks.push((r.db()?, true));
        }
        let rest = req.limit as usize - picks.len();
        let mut st = t
            .prepare(&format!(
                "SELECT d.id, d.endpoint_id, d.due_at, d.seq FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
                 WHERE {CLAIMABLE} AND e.circuit_mode = 'closed' ORDER BY d.due_at, d.seq LIMIT $2"
            ))
            .db()?;
        let rows = st.query_map(params![now, rest as i64], pick).db()?;
        for r in rows {
            picks.push((r.db()?, false));
        }
    }
    picks.sort_by_key(|((_, _, due, seq), _)| (*due, *seq));

    let expires = t.now.plus(req.lease_for);
    let mut out = Vec::with_capacity(picks.len());
    for ((id, endpoint_id, _, _), probe) in picks {
        if probe {
            let mut c = endpoint::load_circuit(t, endpoint_id)?;
            c.start_probe(id);
            endpoint::save_circuit(t, endpoint_id, &c)?;
        }
        let token = LeaseToken::new();
        t.execute(
            "UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_token = $1, \
             lease_expires_at = $2, leased_by = $3, last_outcome = NULL, updated_at = $4 WHERE id = $5",
            params![token.to_string(), expires.as_millis(), req.worker, now, id.to_string()],
        )
        .db()?;
        out.push(load_claimed(t, id, token, probe)?);
    }
    Ok(out)
}

fn load_claimed(
    t: &Tx<'_>,
    id: DeliveryId,
    token: LeaseToken,
    probe: bool,
) -> StoreResult<ClaimedDelivery> {
    t.query_row(
        &format!(
            "SELECT {DELIVERY_COLS}, ev.event_type, ev.body, e.url, e.secret, e.previous_secret, e.previous_expires_at \
             FROM deliveries d JOIN events ev ON ev.id = d.event_id JOIN endpoints e ON e.id = d.endpoint_id WHERE d.id = $1"
        ),
        params![id.to_string()],
        |r| {
            let delivery = row_to_delivery(r)?;
            Ok(ClaimedDelivery {
                lease: Lease {
                    delivery_id: id,
                    token,
                    attempt: delivery.attempts,
                    expires_at: delivery.lease_expires_at.unwrap_or(delivery.due_at),
                },
                delivery,
                event_type: r.get(13)?,
                body: r.get(14)?,
                url: r.get(15)?,
                secrets: SigningSecrets {
                    current: Secret::new(r.get::<_, String>(16)?),
                    previous: r.get::<_, Option<String>>(17)?.map(Secret::new),
                    previous_expires_at: ts_opt(r, 18)?,
                },
                probe,
            })
        },
    )
    .db()
}

pub(crate) fn extend(t: &mut Tx<'_>, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
    let row = leased_row(t, lease)?.ok_or(StoreError::LeaseLost)?;
    if row.lease_expires_at.is_some_and(|e| e <= t.now) {
        return Err(StoreError::LeaseLost);
    }
    let expires_at = t.now.plus(lease_for);
    t.execute(
        "UPDATE deliveries SET lease_expires_at = $1, updated_at = $2 WHERE id = $3",
        params![
            expires_at.as_millis(),
            t.now.as_millis(),
            row.id.to_string()
        ],
    )
    .db()?;
    Ok(Lease {
        expires_at,
        ..lease.clone()
    })
}

pub(crate) fn release(t: &mut Tx<'_>, lease: &Lease) -> StoreResult<()> {
    let row = leased_row(t, lease)?.ok_or(StoreError::LeaseLost)?;
    let mut circuit = endpoint::load_circuit(t, row.endpoint_id)?;
    if circuit.is_probe(row.id) {
        circuit.cancel_probe(row.id);
        endpoint::save_circuit(t, row.endpoint_id, &circuit)?;
    }
    t.execute(
        "UPDATE deliveries SET state = 'pending', attempts = attempts - 1, due_at = $1, lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, updated_at = $1 WHERE id = $2",
        params![t.now.as_millis(), row.id.to_string()],
    )
    .db()?;
    Ok(())
}

pub(crate) fn record_outcome(
    t: &mut Tx<'_>,
    lease: &Lease,
    outcome: DeliveryOutcome,
) -> StoreResult<OutcomeRecorded> {
    let token = lease.token.to_string();
    let row = lease_row(t, lease.delivery_id)?.ok_or(StoreError::LeaseLost)?;
    let same_token = row.lease_token.as_deref() == Some(token.as_str());
    if !(same_token && row.state == DeliveryState::Leased) {
        repeat_verdict(same_token, row.last_outcome.as_deref(), outcome.kind())?;
        return Ok(OutcomeRecorded {
            state: row.state,
            duplicate: true,
        });
    }
    let mut circuit = endpoint::load_circuit(t, row.endpoint_id)?;
    let probe = circuit.is_probe(row.id);
    let tr = plan_outcome(
        row.state_for_plan(),
        &outcome,
        &mut circuit,
        probe,
        t.now,
        &t.options,
    );
    endpoint::save_circuit(t, row.endpoint_id, &circuit)?;
    apply(t, &row, &tr, Some(token), Some(outcome.kind()))?;
    Ok(OutcomeRecorded {
        state: tr.state,
        duplicate: false,
    })
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

pub(crate) fn replay(t: &mut Tx<'_>, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
    let d = get(t, account, id)?;
    if d.state != DeliveryState::Dead {
        return Err(StoreError::Conflict(format!(
            "delivery {id} is {}; only dead deliveries can be replayed",
            d.state.as_str()
        )));
    }
    let deleted: bool = t
        .query_row(
            "SELECT deleted_at IS NOT NULL FROM endpoints WHERE id = $1",
            params![d.endpoint_id.to_string()],
            |r| r.get(0),
        )
        .optional()
        .db()?
        .unwrap_or(true);
    if deleted {
        return Err(StoreError::Conflict(format!(
            "delivery {id} cannot be replayed: its endpoint was removed"
        )));
    }
    t.execute(
        "UPDATE deliveries SET state = 'pending', due_at = $1, max_attempts = attempts + $2, lease_token = NULL, \
         last_outcome = NULL, updated_at = $1 WHERE id = $3",
        params![t.now.as_millis(), t.options.max_attempts, id.to_string()],
    )
    .db()?;
    get(t, account, id)
}

pub(crate) fn list(t: &Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
    req.page.validate()?;
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
                req.page.after,
                i64::from(req.page.limit) + 1
            ],
            row_to_delivery,
        )
        .db()?;
    let items = rows.collect::<Result<Vec<_>, _>>().db()?;
    Ok(Page::from_overfetch(items, req.page.limit, |d| d.seq))
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
