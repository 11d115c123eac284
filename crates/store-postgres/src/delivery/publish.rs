//! Publishing: events, their fan-out to deliveries, operational events, enqueue.

use crate::delivery::read::{deliveries_of_event, event_by_key, event_get};
use crate::error::PgResultExt;
use crate::store::{PipelinedTx, PostgresStore, Tx};
use crate::util::RowExt;
use crate::{alert, endpoint};
use control_plane_core::{
    fan_out, AccountId, Checked, DeliveryId, Endpoint, EndpointId, Enqueued, Event, EventId,
    NewAlert, PublishRequest, Published, StoreError, StoreResult, TraceParent,
};
use control_plane_store_kit::schemas::{types_by_account, StoredSchema};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

/// Inserts the delivery of `(endpoint, event)` unless it exists; `Some(id)` when this call created it.
pub(super) async fn insert_delivery(
    t: &Tx<'_>,
    account: &AccountId,
    endpoint: EndpointId,
    event: EventId,
) -> StoreResult<Option<DeliveryId>> {
    let insert = t.prepare_cached(INSERT_DELIVERIES).await.db()?;
    let row = t
        .query_opt(
            &insert,
            &[
                &vec![DeliveryId::new().0],
                &vec![account.as_str()],
                &vec![endpoint.0],
                &vec![event.0],
                &i64::from(t.options.max_attempts),
                &t.now.as_millis(),
            ],
        )
        .await
        .db()?;
    row.map(|r| r.col(0)).transpose()
}

/// Locks the ordered endpoints and the poll endpoints among `$1` (in id
/// order, so publishers never deadlock), so their sequence numbers follow
/// commit order: a poll never hands out a sequence number while a lower
/// one is still uncommitted (ADR 0051).
pub(super) const LOCK_ORDERED: &str =
    "SELECT id FROM endpoints WHERE id = ANY($1) AND (ordered OR url = '') ORDER BY id FOR NO KEY UPDATE";

/// Runs [`LOCK_ORDERED`] on `endpoints`.
pub(super) async fn lock_ordered(t: &Tx<'_>, endpoints: &[Uuid]) -> StoreResult<()> {
    let lock = t.prepare_cached(LOCK_ORDERED).await.db()?;
    t.execute(&lock, &[&endpoints]).await.db()?;
    Ok(())
}

/// Stores events given as parallel arrays; a taken idempotency key is
/// skipped, and the ids stored are returned.
pub(super) const INSERT_EVENTS: &str = "INSERT INTO events (id, account, event_type, body, idempotency_key, created_at, traceparent) \
     SELECT u.id, u.account, u.event_type, u.body, u.key, $6, u.trace \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $7::text[]) AS u(id, account, event_type, body, key, trace) \
     ON CONFLICT (account, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id";

/// Stores pending deliveries given as parallel arrays, their sequence
/// numbers in the arrays' order: the immutable row and the live one, with
/// its endpoint's attempt limit or `$5`;
/// returns the ids of those it stored (a pair already delivered is skipped).
pub(super) const INSERT_DELIVERIES: &str = "WITH d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
     SELECT u.id, u.account, u.endpoint_id, u.event_id, nextval('delivery_seq'), $6 \
     FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[]) WITH ORDINALITY \
     AS u(id, account, endpoint_id, event_id, n) ORDER BY u.n \
     ON CONFLICT (endpoint_id, event_id) DO NOTHING RETURNING id, account, endpoint_id, seq) \
     INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, due_at, updated_at) \
     SELECT endpoint_id, seq, id, account, 'pending', 0, \
     coalesce((SELECT e.max_attempts FROM endpoints e WHERE e.id = d.endpoint_id), $5), $6, $6 \
     FROM d RETURNING delivery_id";

/// What a publish writes, as the parallel arrays its statements take.
pub(super) struct PublishRows<'a> {
    pub(super) events: &'a [Event],
    pub(super) event_ids: Vec<Uuid>,
    pub(super) accounts: Vec<&'a str>,
    pub(super) types: Vec<&'a str>,
    pub(super) bodies: Vec<&'a str>,
    pub(super) keys: Vec<Option<&'a str>>,
    pub(super) traces: Vec<Option<&'a str>>,
    /// Each stored event's deliveries as (event's index, endpoint), in
    /// request order, each event's endpoints in id order (see [`fan_out`]).
    pub(super) targets: Vec<(usize, EndpointId)>,
    pub(super) delivery_ids: Vec<Uuid>,
    pub(super) delivery_endpoints: Vec<Uuid>,
    pub(super) delivery_events: Vec<Uuid>,
    pub(super) delivery_accounts: Vec<&'a str>,
    /// The targets' endpoints, each once, in id order: the rows the ordered
    /// ones among them are locked in.
    pub(super) locked: Vec<Uuid>,
}

impl<'a> PublishRows<'a> {
    /// The rows of `events` (one per request of `reqs`).
    pub(super) fn events(events: &'a [Event]) -> Self {
        PublishRows {
            events,
            event_ids: events.iter().map(|e| e.id.0).collect(),
            accounts: events.iter().map(|e| e.account.as_str()).collect(),
            types: events.iter().map(|e| e.event_type.as_str()).collect(),
            bodies: events.iter().map(|e| e.body.as_str()).collect(),
            keys: events
                .iter()
                .map(|e| e.idempotency_key.as_deref())
                .collect(),
            traces: events
                .iter()
                .map(|e| e.traceparent.as_ref().map(TraceParent::as_str))
                .collect(),
            targets: Vec::new(),
            delivery_ids: Vec::new(),
            delivery_endpoints: Vec::new(),
            delivery_events: Vec::new(),
            delivery_accounts: Vec::new(),
            locked: Vec::new(),
        }
    }

    /// Adds the deliveries of the events that `stored` says are new, each
    /// to the endpoints `route` gives it (see [`fanned_out`]).
    pub(super) fn fan_out(
        &mut self,
        reqs: &[PublishRequest],
        stored: impl Fn(&Event) -> bool,
        route: impl Fn(&PublishRequest) -> Vec<EndpointId>,
    ) {
        for (i, (req, event)) in reqs.iter().zip(self.events).enumerate() {
            if !stored(event) {
                continue;
            }
            for e in route(req) {
                self.targets.push((i, e));
                self.delivery_ids.push(DeliveryId::new().0);
                self.delivery_endpoints.push(e.0);
                self.delivery_events.push(event.id.0);
                self.delivery_accounts.push(event.account.as_str());
            }
        }
        self.locked = self.delivery_endpoints.clone();
        self.locked.sort();
        self.locked.dedup();
    }

    /// The parameters of [`INSERT_EVENTS`].
    pub(super) fn event_params<'p>(&'p self, now_ms: &'p i64) -> [&'p (dyn ToSql + Sync); 7] {
        [
            &self.event_ids,
            &self.accounts,
            &self.types,
            &self.bodies,
            &self.keys,
            now_ms,
            &self.traces,
        ]
    }

    /// The parameters of [`INSERT_DELIVERIES`].
    pub(super) fn delivery_params<'p>(
        &'p self,
        max_attempts: &'p i64,
        now_ms: &'p i64,
    ) -> [&'p (dyn ToSql + Sync); 6] {
        [
            &self.delivery_ids,
            &self.delivery_accounts,
            &self.delivery_endpoints,
            &self.delivery_events,
            max_attempts,
            now_ms,
        ]
    }

    /// Per request, what its publish did when `stored` says its event is
    /// new; `None` otherwise.
    pub(super) fn published(&self, stored: impl Fn(&Event) -> bool) -> Vec<Option<Published>> {
        self.events
            .iter()
            .enumerate()
            .map(|(i, event)| {
                stored(event).then(|| Published {
                    deliveries: self
                        .targets
                        .iter()
                        .zip(&self.delivery_ids)
                        .filter(|((at, _), _)| *at == i)
                        .map(|(_, id)| DeliveryId(*id))
                        .collect(),
                    event: event.clone(),
                    created: true,
                })
            })
            .collect()
    }
}

/// The ordinary route of a publish: each request fanned out to its
/// account's `endpoints` (see [`fan_out`]); `about` is the endpoint an
/// operational event concerns.
pub(super) fn fanned_out(
    endpoints: &[(AccountId, Vec<Endpoint>)],
    about: Option<EndpointId>,
) -> impl Fn(&PublishRequest) -> Vec<EndpointId> + '_ {
    move |req| {
        let live = endpoints
            .iter()
            .find(|(a, _)| *a == req.account)
            .map_or(&[][..], |(_, list)| list.as_slice());
        fan_out(live, &req.event_type, &req.payload, about)
    }
}

/// Each account of `reqs` once, in the order of first appearance.
pub(super) fn accounts_of(reqs: &[PublishRequest]) -> Vec<&AccountId> {
    let mut accounts: Vec<&AccountId> = Vec::new();
    for r in reqs {
        if !accounts.contains(&&r.account) {
            accounts.push(&r.account);
        }
    }
    accounts
}

/// Publishes every request (checked when sealed, [`Checked`]) inside `tx`:
/// the caller's transaction for the outbox, or one from the pool.
pub(crate) async fn publish(t: &Tx<'_>, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
    let schemas = schemas(t, &reqs).await?;
    // Each account's endpoints, read once: the batch fans out as of its
    // start (it commits at once).
    let mut endpoints: Vec<(AccountId, Vec<Endpoint>)> = Vec::new();
    for account in accounts_of(&reqs) {
        endpoints.push((account.clone(), endpoint::list_sealed(t, account).await?));
    }
    let created = publish_new(t, &reqs, fanned_out(&endpoints, None)).await?;
    // Checked only for the events this call stored (an error leaves the
    // transaction to roll back): a repeated key answers with its first event
    // whatever a schema registered since says.
    for (i, (req, created)) in reqs.iter().zip(&created).enumerate() {
        if created.is_some() {
            control_plane_store_kit::schemas::check_publish(req, i, reqs.len(), &schemas)?;
        }
    }
    let mut out = Vec::with_capacity(reqs.len());
    for (req, created) in reqs.iter().zip(created) {
        if let Some(published) = created {
            out.push(published);
            continue;
        }
        // Its idempotency key was taken, by an earlier transaction or by an
        // earlier request of this batch: answer with that event.
        let key = req.idempotency_key.as_deref().unwrap_or_default();
        let first = event_by_key(t, &req.account, key).await?.ok_or_else(|| {
            StoreError::Conflict(format!(
                "the Idempotency-Key {key:?} was taken by an event that is gone: try again"
            ))
        })?;
        req.check_repeat_of(&first)?;
        let deliveries = deliveries_of_event(t, first.id).await?;
        out.push(Published {
            event: first,
            deliveries,
            created: false,
        });
    }
    Ok(out)
}

/// Publishes a group of requests without idempotency keys, so that every
/// event is new and nothing written depends on an answer of the database:
/// one transaction in two round trips, `BEGIN` with the accounts' endpoint
/// lists, then the event insert, the ordered endpoints' lock, the delivery
/// insert, `COMMIT` and the wake-up notification pipelined (ADR 0009). When
/// a statement fails, the server refuses the rest and turns `COMMIT` into a
/// rollback; the caller gets that error.
pub(super) async fn publish_keyless(
    store: &PostgresStore,
    reqs: &[PublishRequest],
) -> StoreResult<Vec<Published>> {
    let tx = PipelinedTx::connect(store).await?;
    let out = {
        let client = tx.client()?;
        let t = Tx::new(client, Some(&client.statement_cache), store, store.now());
        let accounts = accounts_of(reqs);
        // BEGIN is sent first, with the delivery path's plan settings: the
        // lists and schemas are read inside the transaction.
        let ((), lists, schemas) = futures::try_join!(
            async { t.batch_execute(crate::store::BEGIN_GENERIC).await.db() },
            futures::future::try_join_all(accounts.iter().map(|a| endpoint::list_sealed(&t, a))),
            schemas(&t, reqs),
        )?;
        if let Err(refused) = control_plane_store_kit::schemas::check_publishes(reqs, &schemas) {
            // Nothing was written: the connection goes back to the pool,
            // or is closed (by the guard) when even the rollback fails. The
            // caller hears why the publish was refused either way.
            if t.batch_execute("ROLLBACK").await.is_ok() {
                tx.ended();
            }
            return Err(refused);
        }
        let endpoints: Vec<(AccountId, Vec<Endpoint>)> =
            accounts.into_iter().cloned().zip(lists).collect();
        let events: Vec<Event> = reqs.iter().map(|req| req.event_at(t.now)).collect();
        let mut rows = PublishRows::events(&events);
        rows.fan_out(reqs, |_| true, fanned_out(&endpoints, None));
        // Prepared before anything is sent (cached: no round trip after the
        // connection's first publish), so the statements go out in order.
        let (insert_events, lock, insert_deliveries, notify) = futures::try_join!(
            t.prepare_cached(INSERT_EVENTS),
            t.prepare_cached(LOCK_ORDERED),
            t.prepare_cached(INSERT_DELIVERIES),
            t.prepare_cached("SELECT pg_notify($1, '')"),
        )
        .db()?;
        let now_ms = t.now.as_millis();
        let max_attempts = i64::from(t.options.max_attempts);
        let event_params = rows.event_params(&now_ms);
        let locked: [&(dyn ToSql + Sync); 1] = [&rows.locked];
        let delivery_params = rows.delivery_params(&max_attempts, &now_ms);
        let channel: [&(dyn ToSql + Sync); 1] = [&store.channel];
        // The notification goes after COMMIT, outside the transaction (see
        // `notify`), on the same round trip; best effort, as in
        // `PostgresStore::wake`: its failure must not turn a committed
        // publish into an error that a caller would retry.
        let (events_written, locked, deliveries_written, committed, _notified) = futures::join!(
            t.execute(&insert_events, &event_params),
            t.execute(&lock, &locked),
            t.execute(&insert_deliveries, &delivery_params),
            t.batch_execute("COMMIT"),
            t.execute(&notify, &channel),
        );
        // After a failed statement the server answers COMMIT with a
        // rollback, not an error: the statements' own answers say.
        events_written.db()?;
        locked.db()?;
        deliveries_written.db()?;
        committed.db()?;
        // Without idempotency keys no insert skips a row: every event and
        // delivery is stored.
        rows.published(|_| true).into_iter().flatten().collect()
    };
    tx.ended();
    store.wakeup.notify();
    Ok(out)
}

/// Stores the new events of `reqs` and gives each the deliveries `route`
/// says (usually [`fanned_out`]), with one statement for the events and one
/// for the deliveries whatever the batch's size; per request `None` when its
/// idempotency key is taken. Delivery sequence numbers follow the requests'
/// order.
pub(super) async fn publish_new(
    t: &Tx<'_>,
    reqs: &[PublishRequest],
    route: impl Fn(&PublishRequest) -> Vec<EndpointId>,
) -> StoreResult<Vec<Option<Published>>> {
    let events: Vec<Event> = reqs.iter().map(|req| req.event_at(t.now)).collect();
    let mut rows = PublishRows::events(&events);
    let now_ms = t.now.as_millis();
    let insert = t.prepare_cached(INSERT_EVENTS).await.db()?;
    let inserted: std::collections::HashSet<Uuid> = t
        .query(&insert, &rows.event_params(&now_ms))
        .await
        .db()?
        .iter()
        .map(|r| r.col(0))
        .collect::<StoreResult<_>>()?;
    let stored = |e: &Event| inserted.contains(&e.id.0);
    rows.fan_out(reqs, stored, route);
    lock_ordered(t, &rows.locked).await?;
    let insert = t.prepare_cached(INSERT_DELIVERIES).await.db()?;
    let max_attempts = i64::from(t.options.max_attempts);
    let written = t
        .execute(&insert, &rows.delivery_params(&max_attempts, &now_ms))
        .await
        .db()?;
    if written != rows.targets.len() as u64 {
        return Err(StoreError::Backend(
            "a new event already had a delivery".into(),
        ));
    }
    Ok(rows.published(stored))
}

/// Publishes `req` to the endpoint `to` alone, whatever its subscriptions and
/// filter say ("send example").
/// Publishes `req` as an example to `to` alone: the event is marked, so
/// that nothing (a recovery of another endpoint) sends it anywhere else.
pub(crate) async fn publish_example_to(
    t: &Tx<'_>,
    req: Checked<PublishRequest>,
    to: EndpointId,
) -> StoreResult<Published> {
    endpoint::get(t, &req.account, to).await?;
    let mut published = publish_new(t, &[req.into_inner()], |_| vec![to])
        .await?
        .pop()
        .flatten()
        .ok_or_else(|| StoreError::Backend("the example was not stored".into()))?;
    t.execute(
        "UPDATE events SET example = true WHERE id = $1",
        &[&published.event.id.0],
    )
    .await
    .db()?;
    published.event.example = true;
    Ok(published)
}

/// Records an alert and publishes it as an event to the endpoints that name
/// its type (see [`fan_out`]), in the caller's transaction.
pub(super) async fn raise_alert(t: &Tx<'_>, alert: &NewAlert) -> StoreResult<()> {
    alert::insert(t, alert).await?;
    let req = alert.event();
    let endpoints = endpoint::list_sealed(t, &alert.account).await?;
    let concerned = Some(alert.endpoint_id);
    if !fan_out(&endpoints, &req.event_type, &req.payload, concerned).is_empty() {
        let endpoints = [(alert.account.clone(), endpoints)];
        publish_new(t, &[req], fanned_out(&endpoints, concerned)).await?;
    }
    Ok(())
}

pub(crate) async fn enqueue(
    t: &Tx<'_>,
    account: &AccountId,
    endpoint_id: EndpointId,
    event: EventId,
) -> StoreResult<Enqueued> {
    endpoint::get(t, account, endpoint_id).await?;
    event_get(t, account, event).await?;
    lock_ordered(t, &[endpoint_id.0]).await?;
    if let Some(id) = insert_delivery(t, account, endpoint_id, event).await? {
        return Ok(Enqueued {
            delivery_id: id,
            won: true,
        });
    }
    let row = t
        .query_one(
            "SELECT id FROM deliveries WHERE endpoint_id = $1 AND event_id = $2",
            &[&endpoint_id.0, &event.0],
        )
        .await
        .db()?;
    Ok(Enqueued {
        delivery_id: row.col(0)?,
        won: false,
    })
}

/// The schemas of the types `reqs` publish, read in the publish's
/// transaction, one statement per account, sent together (see
/// [`control_plane_store_kit::schemas::check_publishes`]).
async fn schemas(t: &Tx<'_>, reqs: &[PublishRequest]) -> StoreResult<Vec<StoredSchema>> {
    let read = t
        .prepare_cached(
            "SELECT name, schema FROM event_types WHERE account = $1 AND name = ANY($2) \
             AND schema IS NOT NULL",
        )
        .await
        .db()?;
    let per_account = futures::future::try_join_all(types_by_account(reqs).into_iter().map(
        |(account, types)| {
            let read = &read;
            async move {
                let rows = t.query(read, &[&account.as_str(), &types]).await.db()?;
                rows.iter()
                    .map(|r| Ok((account.clone(), r.col(0)?, r.col(1)?)))
                    .collect::<StoreResult<Vec<StoredSchema>>>()
            }
        },
    ))
    .await?;
    Ok(per_account.into_iter().flatten().collect())
}
