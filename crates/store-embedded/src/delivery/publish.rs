//! Publishing: events, their fan-out to deliveries, operational events, enqueue.

use crate::cache::SentEvent;
use crate::delivery::read::{deliveries_of_event, event_by_key, event_get};
use crate::endpoint;
use crate::error::DuckResultExt;
use crate::live::LiveRow;
use crate::store::Tx;
use crate::util::{list, RowExt};
use control_plane_core::LeaseRow;
use control_plane_core::{
    fan_out, AccountId, Checked, DeliveryId, DeliveryState, Endpoint, EndpointId, Enqueued,
    EventId, NewAlert, PublishRequest, Published, StoreResult,
};
use control_plane_store_kit::schemas::{types_by_account, StoredSchema};
use duckdb::{params, OptionalExt};
use std::collections::HashMap;

/// New events and deliveries gathered during one transaction and written by
/// one statement each.
#[derive(Default)]
pub(super) struct NewRows {
    pub(super) ev_id: Vec<String>,
    pub(super) ev_account: Vec<String>,
    pub(super) ev_type: Vec<String>,
    pub(super) ev_body: Vec<String>,
    pub(super) ev_key: Vec<Option<String>>,
    pub(super) ev_trace: Vec<Option<String>>,
    pub(super) d_id: Vec<String>,
    pub(super) d_account: Vec<String>,
    pub(super) d_endpoint: Vec<String>,
    pub(super) d_event: Vec<String>,
    pub(super) d_seq: Vec<i64>,
    pub(super) d_max_attempts: Vec<i64>,
}

impl NewRows {
    /// A new delivery of `event` to `endpoint`, with the endpoint's attempt
    /// limit (or the service's).
    pub(super) fn delivery(
        &mut self,
        t: &mut Tx<'_>,
        account: &AccountId,
        endpoint: &Endpoint,
        event: EventId,
    ) -> DeliveryId {
        let id = DeliveryId::new();
        let seq = t.next_seq();
        let max_attempts = endpoint.attempt_limit(t.options.max_attempts);
        let endpoint = endpoint.id;
        let row = LeaseRow {
            id,
            seq,
            account: account.clone(),
            endpoint_id: endpoint,
            attempts: 0,
            max_attempts,
            due_at: t.now,
            state: DeliveryState::Pending,
            lease_token: None,
            lease_expires_at: None,
            last_outcome: None,
        };
        let live = LiveRow {
            row,
            event_id: event,
            created_at: t.now,
            last_error: None,
            updated_at: t.now,
        };
        t.live_mut().put(live);
        self.d_id.push(id.to_string());
        self.d_account.push(account.as_str().to_string());
        self.d_endpoint.push(endpoint.to_string());
        self.d_event.push(event.to_string());
        self.d_seq.push(seq);
        self.d_max_attempts.push(i64::from(max_attempts));
        id
    }

    /// A new event fanned out (see [`fan_out`]) to `endpoints`, the live
    /// endpoints of its account; `about` is the endpoint an operational
    /// event concerns.
    pub(super) fn event(
        &mut self,
        t: &mut Tx<'_>,
        req: &PublishRequest,
        endpoints: &[Endpoint],
        about: Option<EndpointId>,
    ) -> Published {
        let event = req.event_at(t.now);
        self.ev_id.push(event.id.to_string());
        self.ev_account.push(event.account.as_str().to_string());
        self.ev_type.push(event.event_type.clone());
        self.ev_body.push(event.body.clone());
        self.ev_key.push(event.idempotency_key.clone());
        self.ev_trace
            .push(event.traceparent.as_ref().map(|t| t.as_str().to_string()));
        let deliveries: Vec<DeliveryId> = fan_out(endpoints, &req.event_type, &req.payload, about)
            .into_iter()
            .filter_map(|id| endpoints.iter().find(|e| e.id == id))
            .map(|e| self.delivery(t, &req.account, e, event.id))
            .collect();
        // Its claims will send it: kept for them (ADR 0028).
        if !deliveries.is_empty() {
            t.events.insert(
                event.id,
                SentEvent {
                    event_type: event.event_type.clone(),
                    body: event.body.clone(),
                    traceparent: event.traceparent.as_ref().map(|t| t.as_str().to_string()),
                },
            );
        }
        Published {
            event,
            deliveries,
            created: true,
        }
    }

    pub(super) fn write(self, t: &Tx<'_>) -> StoreResult<()> {
        if !self.ev_id.is_empty() {
            t.execute(
                "INSERT INTO events (id, account, event_type, body, idempotency_key, created_at, traceparent) \
                 SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), unnest($3::VARCHAR[]), \
                 unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), $6::BIGINT, unnest($7::VARCHAR[])",
                params![
                    list::text(self.ev_id),
                    list::text(self.ev_account),
                    list::text(self.ev_type),
                    list::text(self.ev_body),
                    list::of(self.ev_key),
                    t.now.as_millis(),
                    list::of(self.ev_trace)
                ],
            )
            .db()?;
        }
        if !self.d_id.is_empty() {
            t.execute(
                "INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, state, attempts, max_attempts, \
                 due_at, created_at, updated_at) SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), \
                 unnest($3::VARCHAR[]), unnest($4::VARCHAR[]), unnest($5::BIGINT[]), 'pending', 0, unnest($6::BIGINT[]), \
                 $7::BIGINT, $8::BIGINT, $9::BIGINT",
                params![
                    list::text(self.d_id),
                    list::text(self.d_account),
                    list::text(self.d_endpoint),
                    list::text(self.d_event),
                    list::of(self.d_seq),
                    list::of(self.d_max_attempts),
                    t.now.as_millis(),
                    t.now.as_millis(),
                    t.now.as_millis()
                ],
            )
            .db()?;
        }
        Ok(())
    }
}

/// Publishes every request (checked when sealed, [`Checked`]) in the one
/// transaction `t` belongs to. A key repeated within the batch answers with
/// the event its first use created.
pub(crate) fn publish(t: &mut Tx<'_>, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
    // Checked only for the events this call creates: a repeated key answers
    // with its first event whatever a schema registered since says.
    let schemas = schemas(t, &reqs)?;
    let mut rows = NewRows::default();
    let mut keyed: HashMap<(AccountId, String), usize> = HashMap::new();
    let mut out: Vec<Published> = Vec::with_capacity(reqs.len());
    let batch = reqs.len();
    for (i, req) in reqs.into_iter().enumerate() {
        if let Some(key) = &req.idempotency_key {
            let slot = (req.account.clone(), key.clone());
            if let Some(first) = keyed.get(&slot).and_then(|i| out.get(*i)) {
                req.check_repeat_of(&first.event)?;
                let again = Published {
                    created: false,
                    ..first.clone()
                };
                out.push(again);
                continue;
            }
            if let Some(event) = event_by_key(t, &req.account, key)? {
                req.check_repeat_of(&event)?;
                let deliveries = deliveries_of_event(t, event.id)?;
                out.push(Published {
                    event,
                    deliveries,
                    created: false,
                });
                continue;
            }
            keyed.insert(slot, out.len());
        }
        control_plane_store_kit::schemas::check_publish(&req, i, batch, &schemas)?;
        let live = endpoint::fan_out_set(t, &req.account)?;
        out.push(rows.event(t, &req, &live, None));
    }
    rows.write(t)?;
    Ok(out)
}

/// Publishes `req` to the endpoint `to` alone, whatever its subscriptions and
/// filter say ("send example").
/// Publishes `req` as an example to `to` alone: the event is marked, so
/// that nothing (a recovery of another endpoint) sends it anywhere else.
pub(crate) fn publish_example_to(
    t: &mut Tx<'_>,
    req: Checked<PublishRequest>,
    to: EndpointId,
) -> StoreResult<Published> {
    let endpoint = endpoint::get(t, &req.account, to)?;
    let mut rows = NewRows::default();
    let mut published = rows.event(t, &req, &[], None);
    let delivery = rows.delivery(t, &req.account, &endpoint, published.event.id);
    published.deliveries.push(delivery);
    rows.write(t)?;
    t.execute(
        "UPDATE events SET example = true WHERE id = $1",
        params![published.event.id.to_string()],
    )
    .db()?;
    published.event.example = true;
    Ok(published)
}

/// Records an alert and publishes it as an event, in the caller's transaction.
pub(crate) fn raise_alert(t: &mut Tx<'_>, alert: &NewAlert) -> StoreResult<()> {
    crate::alert::insert(t, alert)?;
    let req = alert.event();
    let endpoints = endpoint::fan_out_set(t, &alert.account)?;
    let concerned = Some(alert.endpoint_id);
    if !fan_out(&endpoints, &req.event_type, &req.payload, concerned).is_empty() {
        let mut rows = NewRows::default();
        rows.event(t, &req, &endpoints, concerned);
        rows.write(t)?;
    }
    Ok(())
}

pub(crate) fn enqueue(
    t: &mut Tx<'_>,
    account: &AccountId,
    endpoint_id: EndpointId,
    event: EventId,
) -> StoreResult<Enqueued> {
    let endpoint = endpoint::get(t, account, endpoint_id)?;
    event_get(t, account, event)?;
    let existing = t
        .query_row(
            "SELECT id FROM deliveries WHERE endpoint_id = $1 AND event_id = $2",
            params![endpoint_id.to_string(), event.to_string()],
            |r| r.col::<DeliveryId>(0),
        )
        .optional()
        .db()?;
    match existing {
        Some(id) => Ok(Enqueued {
            delivery_id: id,
            won: false,
        }),
        None => {
            let mut rows = NewRows::default();
            let delivery_id = rows.delivery(t, account, &endpoint, event);
            rows.write(t)?;
            Ok(Enqueued {
                delivery_id,
                won: true,
            })
        }
    }
}

/// The schemas of the types `reqs` publish (see
/// [`control_plane_store_kit::schemas::check_publishes`]): from the writer's
/// cache ([`crate::cache::SchemaCache`]), the types it lacks read in the
/// publish's transaction.
fn schemas(t: &mut Tx<'_>, reqs: &[PublishRequest]) -> StoreResult<Vec<StoredSchema>> {
    let mut out = Vec::new();
    for (account, types) in types_by_account(reqs) {
        let missing: Vec<&str> = types
            .iter()
            .copied()
            .filter(|name| t.schemas.get(account, name).is_none())
            .collect();
        if !missing.is_empty() {
            let found = {
                let mut st = t
                    .prepare(
                        "SELECT name, schema FROM event_types WHERE account = $1 \
                         AND list_contains($2::VARCHAR[], name)",
                    )
                    .db()?;
                let rows = st
                    .query_map(params![account.as_str(), list::text(&missing)], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
                    })
                    .db()?;
                rows.collect::<Result<Vec<_>, _>>().db()?
            };
            for name in &missing {
                let schema = found
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, s)| s.clone());
                t.schemas.insert(account, name, schema);
            }
        }
        for name in types {
            if let Some(Some(schema)) = t.schemas.get(account, name) {
                out.push((account.clone(), name.to_string(), schema.clone()));
            }
        }
    }
    Ok(out)
}
