//! Events, fan-out and the delivery queue: claims with `FOR UPDATE SKIP LOCKED`
//! and leases fenced by token (ADR 0002, ADR 0005).

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::lease::{fence, FencedWrite, Held, Refused, Verdict};
use control_plane_core::policy::{
    alerts_for, plan_lease_expiry, plan_outcome, AttemptState, Transition,
};
use control_plane_core::*;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::alert;
use crate::attempt;
use crate::endpoint;
use crate::error::PgResultExt;
use crate::store::{in_tx, PipelinedTx, PostgresStore, Tx, CLAIM_SETTINGS};
use crate::util::{ts_opt, u32_of};

/// A delivery with its state: the immutable row `d`, and its live row `l`
/// while it is pending or leased or its finished row `x` once it is
/// delivered or dead (ADR 0020). One of the two always exists: every change
/// moves a delivery between them inside one transaction.
const DELIVERY_FROM: &str = "deliveries d \
     LEFT JOIN delivery_queue l ON l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
     LEFT JOIN delivery_done x ON x.delivery_id = d.id";

/// The columns of [`row_to_delivery`] over [`DELIVERY_FROM`].
const DELIVERY_COLS: &str = "d.id, d.account, d.endpoint_id, d.event_id, d.seq, \
     coalesce(l.state, x.state), coalesce(l.attempts, x.attempts), \
     coalesce(l.max_attempts, x.max_attempts), coalesce(l.due_at, x.due_at), l.lease_expires_at, \
     coalesce(l.last_error, x.last_error), d.created_at, coalesce(l.updated_at, x.finished_at)";

/// The state of a row of [`DELIVERY_FROM`], `NULL` for none.
const STATE_OF: &str = "coalesce(l.state, x.state)";

fn row_to_delivery(r: &Row) -> StoreResult<Delivery> {
    Ok(Delivery {
        id: DeliveryId(r.get(0)),
        account: AccountId::new(r.get::<_, String>(1))?,
        endpoint_id: EndpointId(r.get(2)),
        event_id: EventId(r.get(3)),
        seq: r.get(4),
        state: r.get::<_, String>(5).parse()?,
        attempts: u32_of(r.get(6)),
        max_attempts: u32_of(r.get(7)),
        due_at: Timestamp::from_millis(r.get(8)),
        lease_expires_at: ts_opt(r.get(9)),
        last_error: r.get(10),
        created_at: Timestamp::from_millis(r.get(11)),
        updated_at: Timestamp::from_millis(r.get(12)),
    })
}

const EVENT_COLS: &str = "id, account, event_type, body, idempotency_key, created_at";

fn row_to_event(r: &Row) -> StoreResult<Event> {
    Ok(Event {
        id: EventId(r.get(0)),
        account: AccountId::new(r.get::<_, String>(1))?,
        event_type: r.get(2),
        body: r.get(3),
        idempotency_key: r.get(4),
        created_at: Timestamp::from_millis(r.get(5)),
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

/// Events of the request, newest first: before `before`, or exactly `at`.
async fn events_where(
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
    req.page.validate()?;
    let rows = events_where(t, req, req.page.after, None, i64::from(req.page.limit) + 1).await?;
    match cut_by_time(rows, req.page.limit, |e| e.created_at.as_millis()) {
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

async fn deliveries_of_event(t: &Tx<'_>, event: EventId) -> StoreResult<Vec<DeliveryId>> {
    let rows = t
        .query(
            "SELECT id FROM deliveries WHERE event_id = $1 ORDER BY endpoint_id",
            &[&event.0],
        )
        .await
        .db()?;
    Ok(rows.iter().map(|r| DeliveryId(r.get(0))).collect())
}

/// Inserts the delivery of `(endpoint, event)` unless it exists; `Some(id)` when this call created it.
async fn insert_delivery(
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
    Ok(row.map(|r| DeliveryId(r.get(0))))
}

/// Locks the ordered endpoints among `$1` (in id order, so publishers
/// never deadlock), so their sequence numbers follow commit order.
const LOCK_ORDERED: &str =
    "SELECT id FROM endpoints WHERE id = ANY($1) AND ordered ORDER BY id FOR NO KEY UPDATE";

/// Runs [`LOCK_ORDERED`] on `endpoints`.
async fn lock_ordered(t: &Tx<'_>, endpoints: &[Uuid]) -> StoreResult<()> {
    let lock = t.prepare_cached(LOCK_ORDERED).await.db()?;
    t.execute(&lock, &[&endpoints]).await.db()?;
    Ok(())
}

/// Stores events given as parallel arrays; a taken idempotency key is
/// skipped, and the ids stored are returned.
const INSERT_EVENTS: &str = "INSERT INTO events (id, account, event_type, body, idempotency_key, created_at) \
     SELECT u.id, u.account, u.event_type, u.body, u.key, $6 \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, account, event_type, body, key) \
     ON CONFLICT (account, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id";

/// Stores pending deliveries given as parallel arrays, their sequence
/// numbers in the arrays' order: the immutable row and the live one;
/// returns the ids of those it stored (a pair already delivered is skipped).
const INSERT_DELIVERIES: &str = "WITH d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at) \
     SELECT u.id, u.account, u.endpoint_id, u.event_id, nextval('delivery_seq'), $6 \
     FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[]) WITH ORDINALITY \
     AS u(id, account, endpoint_id, event_id, n) ORDER BY u.n \
     ON CONFLICT (endpoint_id, event_id) DO NOTHING RETURNING id, account, endpoint_id, seq) \
     INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, due_at, updated_at) \
     SELECT endpoint_id, seq, id, account, 'pending', 0, $5, $6, $6 FROM d RETURNING delivery_id";

/// What a publish writes, as the parallel arrays its statements take.
struct PublishRows<'a> {
    events: &'a [Event],
    event_ids: Vec<Uuid>,
    accounts: Vec<&'a str>,
    types: Vec<&'a str>,
    bodies: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    /// Each stored event's deliveries as (event's index, endpoint), in
    /// request order, each event's endpoints in id order (see [`fan_out`]).
    targets: Vec<(usize, EndpointId)>,
    delivery_ids: Vec<Uuid>,
    delivery_endpoints: Vec<Uuid>,
    delivery_events: Vec<Uuid>,
    delivery_accounts: Vec<&'a str>,
    /// The targets' endpoints, each once, in id order: the rows the ordered
    /// ones among them are locked in.
    locked: Vec<Uuid>,
}

impl<'a> PublishRows<'a> {
    /// The rows of `events` (one per request of `reqs`).
    fn events(events: &'a [Event]) -> Self {
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
            targets: Vec::new(),
            delivery_ids: Vec::new(),
            delivery_endpoints: Vec::new(),
            delivery_events: Vec::new(),
            delivery_accounts: Vec::new(),
            locked: Vec::new(),
        }
    }

    /// Adds the deliveries of the events that `stored` says are new, each
    /// fanned out to its account's `endpoints`; `about` is the endpoint an
    /// operational event concerns.
    fn fan_out(
        &mut self,
        reqs: &[PublishRequest],
        stored: impl Fn(&Event) -> bool,
        endpoints: &[(AccountId, Vec<Endpoint>)],
        about: Option<EndpointId>,
    ) {
        for (i, (req, event)) in reqs.iter().zip(self.events).enumerate() {
            if !stored(event) {
                continue;
            }
            let live = endpoints
                .iter()
                .find(|(a, _)| *a == req.account)
                .map_or(&[][..], |(_, list)| list.as_slice());
            for e in fan_out(live, &req.event_type, &req.payload, about) {
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
    fn event_params<'p>(&'p self, now_ms: &'p i64) -> [&'p (dyn ToSql + Sync); 6] {
        [
            &self.event_ids,
            &self.accounts,
            &self.types,
            &self.bodies,
            &self.keys,
            now_ms,
        ]
    }

    /// The parameters of [`INSERT_DELIVERIES`].
    fn delivery_params<'p>(
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
    fn published(&self, stored: impl Fn(&Event) -> bool) -> Vec<Option<Published>> {
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

/// Each account of `reqs` once, in the order of first appearance.
fn accounts_of(reqs: &[PublishRequest]) -> Vec<&AccountId> {
    let mut accounts: Vec<&AccountId> = Vec::new();
    for r in reqs {
        if !accounts.contains(&&r.account) {
            accounts.push(&r.account);
        }
    }
    accounts
}

/// Publishes every request inside `tx`: the caller's transaction for the
/// outbox, or one from the pool.
pub(crate) async fn publish(t: &Tx<'_>, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
    for r in &reqs {
        r.validate()?;
    }
    // Each account's endpoints, read once: the batch fans out as of its
    // start (it commits at once).
    let mut endpoints: Vec<(AccountId, Vec<Endpoint>)> = Vec::new();
    for account in accounts_of(&reqs) {
        endpoints.push((account.clone(), endpoint::list_sealed(t, account).await?));
    }
    let created = publish_new(t, &reqs, &endpoints, None).await?;
    let mut out = Vec::with_capacity(reqs.len());
    for (req, created) in reqs.iter().zip(created) {
        if let Some(published) = created {
            out.push(published);
            continue;
        }
        // Its idempotency key was taken, by an earlier transaction or by an
        // earlier request of this batch: answer with that event.
        let row = t
            .query_one(
                &format!(
                    "SELECT {EVENT_COLS} FROM events WHERE account = $1 AND idempotency_key = $2"
                ),
                &[&req.account.as_str(), &req.idempotency_key],
            )
            .await
            .db()?;
        let first = row_to_event(&row)?;
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
async fn publish_keyless(
    store: &PostgresStore,
    reqs: &[PublishRequest],
) -> StoreResult<Vec<Published>> {
    for r in reqs {
        r.validate()?;
    }
    let tx = PipelinedTx::connect(store).await?;
    let out = {
        let client = tx.client()?;
        let t = Tx::new(client, Some(&client.statement_cache), store, store.now());
        let accounts = accounts_of(reqs);
        // BEGIN is sent first: the lists run inside the transaction.
        let ((), lists) = futures::try_join!(
            async { t.batch_execute("BEGIN").await.db() },
            futures::future::try_join_all(accounts.iter().map(|a| endpoint::list_sealed(&t, a)))
        )?;
        let endpoints: Vec<(AccountId, Vec<Endpoint>)> =
            accounts.into_iter().cloned().zip(lists).collect();
        let events: Vec<Event> = reqs.iter().map(|req| req.event_at(t.now)).collect();
        let mut rows = PublishRows::events(&events);
        rows.fan_out(reqs, |_| true, &endpoints, None);
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

/// Stores the new events of `reqs` and fans each out to its account's
/// `endpoints` (see [`fan_out`]), with one statement for the events and one
/// for the deliveries whatever the batch's size; per request `None` when its
/// idempotency key is taken. `about` is the endpoint an operational event
/// concerns. Delivery sequence numbers follow the requests' order.
async fn publish_new(
    t: &Tx<'_>,
    reqs: &[PublishRequest],
    endpoints: &[(AccountId, Vec<Endpoint>)],
    about: Option<EndpointId>,
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
        .map(|r| r.get(0))
        .collect();
    let stored = |e: &Event| inserted.contains(&e.id.0);
    rows.fan_out(reqs, stored, endpoints, about);
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

/// Records an alert and publishes it as an event to the endpoints that name
/// its type (see [`fan_out`]), in the caller's transaction.
async fn raise_alert(t: &Tx<'_>, alert: &NewAlert) -> StoreResult<()> {
    alert::insert(t, alert).await?;
    let req = alert.event();
    let endpoints = endpoint::list_sealed(t, &alert.account).await?;
    let concerned = Some(alert.endpoint_id);
    if !fan_out(&endpoints, &req.event_type, &req.payload, concerned).is_empty() {
        let endpoints = [(alert.account.clone(), endpoints)];
        publish_new(t, &[req], &endpoints, concerned).await?;
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
        delivery_id: DeliveryId(row.get(0)),
        won: false,
    })
}

/// The fields of a live delivery a transition needs.
struct LeaseRow {
    id: DeliveryId,
    account: AccountId,
    endpoint_id: EndpointId,
    seq: i64,
    attempts: u32,
    max_attempts: u32,
    due_at: Timestamp,
    state: DeliveryState,
    lease_token: Option<LeaseToken>,
    lease_expires_at: Option<Timestamp>,
    last_outcome: Option<String>,
}

impl LeaseRow {
    /// What the lease check sees (`control_plane_core::lease`).
    fn held(&self) -> Held<'_, LeaseToken> {
        Held {
            leased: self.state == DeliveryState::Leased,
            token: self.lease_token,
            expires_at: self.lease_expires_at,
            last_outcome: self.last_outcome.as_deref(),
        }
    }

    fn state_for_plan(&self) -> AttemptState {
        AttemptState {
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            due_at: self.due_at,
        }
    }
}

const LEASE_COLS: &str =
    "l.delivery_id, l.account, l.endpoint_id, l.seq, l.attempts, l.max_attempts, l.due_at, l.state, \
     l.lease_token, l.lease_expires_at, l.last_outcome";

fn row_to_lease_row(r: &Row) -> StoreResult<LeaseRow> {
    Ok(LeaseRow {
        id: DeliveryId(r.get(0)),
        account: AccountId::new(r.get::<_, String>(1))?,
        endpoint_id: EndpointId(r.get(2)),
        seq: r.get(3),
        attempts: u32_of(r.get(4)),
        max_attempts: u32_of(r.get(5)),
        due_at: Timestamp::from_millis(r.get(6)),
        state: r.get::<_, String>(7).parse()?,
        lease_token: r.get::<_, Option<Uuid>>(8).map(LeaseToken),
        lease_expires_at: ts_opt(r.get(9)),
        last_outcome: r.get(10),
    })
}

/// The live row of a delivery under its lock; `None` once it is finished
/// (or when it does not exist).
async fn lock_live(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<LeaseRow>> {
    t.query_opt(
        &format!(
            "SELECT {LEASE_COLS} FROM deliveries d \
             JOIN delivery_queue l ON l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
             WHERE d.id = $1 FOR UPDATE OF l"
        ),
        &[&id.0],
    )
    .await
    .db()?
    .as_ref()
    .map(row_to_lease_row)
    .transpose()
}

/// The live row of `lease`'s delivery under its lock, when `write` may go
/// ahead under it.
async fn fenced_row(t: &Tx<'_>, lease: &Lease, write: FencedWrite<'_>) -> StoreResult<LeaseRow> {
    let row = lock_live(t, lease.delivery_id).await?;
    fence(
        row.as_ref().map(LeaseRow::held).as_ref(),
        &lease.token,
        write,
    )?;
    row.ok_or(StoreError::LeaseLost)
}

/// How a finished delivery ended: its state, the token of its last lease
/// and the outcome recorded under it.
struct Finished {
    state: DeliveryState,
    lease_token: Option<LeaseToken>,
    last_outcome: Option<String>,
}

impl Finished {
    /// What the lease check sees: no lease holds a finished delivery.
    fn held(&self) -> Held<'_, LeaseToken> {
        Held {
            leased: false,
            token: self.lease_token,
            expires_at: None,
            last_outcome: self.last_outcome.as_deref(),
        }
    }
}

async fn finished(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<Finished>> {
    let row = t
        .query_opt(
            "SELECT state, lease_token, last_outcome FROM delivery_done WHERE delivery_id = $1",
            &[&id.0],
        )
        .await
        .db()?;
    row.map(|r| {
        Ok(Finished {
            state: r.get::<_, String>(0).parse()?,
            lease_token: r.get::<_, Option<Uuid>>(1).map(LeaseToken),
            last_outcome: r.get(2),
        })
    })
    .transpose()
}

/// Writes a transition: the live row moved to its new due time, or deleted
/// and its finished row written; the attempt-log row; a disable.
async fn apply(
    t: &Tx<'_>,
    row: &LeaseRow,
    tr: &Transition,
    keep_token: Option<LeaseToken>,
    outcome_kind: Option<&str>,
) -> StoreResult<()> {
    let keep_token = keep_token.map(|k| k.0);
    let now = t.now.as_millis();
    if tr.state.is_final() {
        let finish = t
            .prepare_cached(
                "WITH g AS (DELETE FROM delivery_queue WHERE endpoint_id = $1 AND seq = $2 \
                 RETURNING delivery_id, attempts, max_attempts) \
                 INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
                 lease_token, last_outcome, finished_at) \
                 SELECT delivery_id, $3, attempts, max_attempts, $4, $5, $6, $7, $8 FROM g",
            )
            .await
            .db()?;
        t.execute(
            &finish,
            &[
                &row.endpoint_id.0,
                &row.seq,
                &tr.state.as_str(),
                &tr.due_at.as_millis(),
                &tr.last_error,
                &keep_token,
                &outcome_kind,
                &now,
            ],
        )
        .await
        .db()?;
    } else {
        let retry = t
            .prepare_cached(
                "UPDATE delivery_queue SET state = $1, due_at = $2, last_error = $3, lease_expires_at = NULL, \
                 leased_by = NULL, lease_token = $4, last_outcome = $5, updated_at = $6 \
                 WHERE endpoint_id = $7 AND seq = $8",
            )
            .await
            .db()?;
        t.execute(
            &retry,
            &[
                &tr.state.as_str(),
                &tr.due_at.as_millis(),
                &tr.last_error,
                &keep_token,
                &outcome_kind,
                &now,
                &row.endpoint_id.0,
                &row.seq,
            ],
        )
        .await
        .db()?;
    }
    attempt::insert(
        t,
        row.id,
        row.endpoint_id,
        &row.account,
        row.attempts,
        &tr.attempt,
    )
    .await?;
    let mut disabled = false;
    if let Some(reason) = &tr.disable_reason {
        disabled = endpoint::disable(t, row.endpoint_id, reason).await?;
    }
    for alert in alerts_for(tr, disabled, &row.account, row.endpoint_id, row.id) {
        raise_alert(t, &alert).await?;
    }
    Ok(())
}

/// Logs and frees leases that expired by `now`; replicas split the work
/// through `SKIP LOCKED`.
async fn sweep_expired(t: &Tx<'_>) -> StoreResult<()> {
    let rows = t
        .query(
            &format!(
                "SELECT {LEASE_COLS} FROM delivery_queue l WHERE l.state = 'leased' AND l.lease_expires_at <= $1 \
                 ORDER BY l.seq LIMIT 1000 FOR UPDATE SKIP LOCKED"
            ),
            &[&t.now.as_millis()],
        )
        .await
        .db()?;
    for r in &rows {
        let row = row_to_lease_row(r)?;
        let mut circuit = endpoint::load_circuit(t, row.endpoint_id, true).await?;
        let probe = circuit.is_probe(row.id);
        let tr = plan_lease_expiry(row.state_for_plan(), &mut circuit, probe, t.now, t.options);
        if probe {
            endpoint::save_circuit(t, row.endpoint_id, &circuit).await?;
        }
        apply(t, &row, &tr, None, None).await?;
    }
    Ok(())
}

/// The first claimable live row of endpoint `$2` at `$1`: pending, due, on a
/// live enabled endpoint, and the head of an ordered one.
const PROBE_CANDIDATE: &str = "SELECT l.seq, l.due_at FROM delivery_queue l JOIN endpoints e ON e.id = l.endpoint_id \
     WHERE l.endpoint_id = $2 AND l.state = 'pending' AND l.due_at <= $1 AND e.enabled AND e.deleted_at IS NULL \
     AND (NOT e.ordered OR l.seq = (SELECT min(h.seq) FROM delivery_queue h WHERE h.endpoint_id = l.endpoint_id)) \
     ORDER BY l.due_at, l.seq LIMIT 1 FOR UPDATE OF l SKIP LOCKED";

/// What a sender needs of the live rows `x` (their `endpoint_id`, `seq`
/// and `delivery_id`): the columns of the CTE `c` that
/// [`LEASE_AND_RETURN`] reads, joined by [`SENDER_JOINS`].
const SENDER_COLS: &str = "x.endpoint_id, x.seq, dv.id, dv.account, dv.event_id, dv.created_at, \
     ev.event_type, ev.body, ep.url, ep.secret, ep.previous_secret, ep.previous_expires_at";

/// The lookups of [`SENDER_COLS`], one row each by primary key. Written as
/// lateral subqueries with `LIMIT 1` so that the planner cannot turn them
/// into joins over whole tables: the claim runs a generic plan made once per
/// connection, and with the statistics of a small table it chose hash joins
/// over full index scans.
const SENDER_JOINS: &str = "CROSS JOIN LATERAL (SELECT d.id, d.account, d.event_id, d.created_at \
       FROM deliveries d WHERE d.id = x.delivery_id LIMIT 1) dv \
     CROSS JOIN LATERAL (SELECT v.event_type, v.body FROM events v WHERE v.id = dv.event_id LIMIT 1) ev \
     CROSS JOIN LATERAL (SELECT e.url, e.secret, e.previous_secret, e.previous_expires_at \
       FROM endpoints e WHERE e.id = x.endpoint_id LIMIT 1) ep";

/// Leases the live rows of the CTE `c` ([`SENDER_COLS`]) and returns them
/// with what a sender needs. The lookups happen inside `c`, so the update
/// finds each live row by its whole key: with the endpoint joined here, a
/// generic plan made while the table was small looked the rows up by
/// endpoint alone and filtered the sequence, reading every live row of the
/// endpoint per claimed one (78 ms claims at 5,000 live rows).
const LEASE_AND_RETURN: &str = "UPDATE delivery_queue l SET state = 'leased', attempts = l.attempts + 1, \
     lease_token = gen_random_uuid(), lease_expires_at = $3, leased_by = $4, last_outcome = NULL, updated_at = $1 \
     FROM c WHERE l.endpoint_id = c.endpoint_id AND l.seq = c.seq \
     RETURNING c.id, c.account, c.endpoint_id, c.event_id, c.seq, l.state, l.attempts, l.max_attempts, l.due_at, \
     l.lease_expires_at, l.last_error, c.created_at, l.updated_at, c.event_type, c.body, c.url, c.secret, \
     c.previous_secret, c.previous_expires_at, l.lease_token";

/// The claim of ordinary deliveries, endpoint by endpoint: `$1` now (ms),
/// `$2` the endpoints, `$5` how many of each, `$6` the head sequence of an
/// ordered one (NULL otherwise), `$7` each one's in-flight cap, `$3` the
/// lease expiry (ms), `$4` the worker. Each endpoint's oldest due first,
/// skipping rows other replicas hold, and never past its cap counted by this
/// statement: issued after the flow rows are locked, its snapshot sees every
/// lease another claimer committed before (ADR 0009). The benchmark issues
/// this same text raw.
pub fn claim_statement() -> String {
    format!(
        "WITH q AS (SELECT * FROM unnest($2::uuid[], $5::bigint[], $6::bigint[], $7::bigint[]) \
               AS q(endpoint_id, n, head, cap)), \
         c AS (SELECT {SENDER_COLS} FROM q CROSS JOIN LATERAL \
               (SELECT p.endpoint_id, p.seq, p.delivery_id FROM delivery_queue p \
               WHERE p.endpoint_id = q.endpoint_id AND p.state = 'pending' AND p.due_at <= $1 \
               AND (q.head IS NULL OR p.seq = q.head) ORDER BY p.due_at, p.seq \
               LIMIT GREATEST(0, LEAST(q.n, q.cap - (SELECT count(*) FROM delivery_queue k \
                 WHERE k.endpoint_id = q.endpoint_id AND k.state = 'leased' AND k.lease_expires_at > $1))) \
               FOR UPDATE SKIP LOCKED) x {SENDER_JOINS}) \
         {LEASE_AND_RETURN}"
    )
}

/// Per endpoint with due work on a closed circuit (`$1` now): account,
/// oldest due `(due_at, seq)`, due count up to `$2`, live leases, cap, rate
/// limit, bucket, ordered. Unordered endpoints by their due index, ordered
/// ones by their head (the first live row by sequence).
const FLOW_CANDIDATES: &str = "SELECT e.id, e.account, h.due_at, h.seq, \
     (SELECT count(*) FROM (SELECT 1 FROM delivery_queue x WHERE x.endpoint_id = e.id AND x.state = 'pending' \
       AND x.due_at <= $1 LIMIT $2) k), \
     (SELECT count(*) FROM delivery_queue y WHERE y.endpoint_id = e.id AND y.state = 'leased' AND y.lease_expires_at > $1), \
     e.max_in_flight, e.rate_limit_per_s, f.tokens, f.refilled_at, e.ordered \
     FROM endpoints e JOIN circuits ci ON ci.endpoint_id = e.id JOIN endpoint_flow f ON f.endpoint_id = e.id \
     CROSS JOIN LATERAL (SELECT x.due_at, x.seq FROM delivery_queue x WHERE x.endpoint_id = e.id AND x.state = 'pending' \
       AND x.due_at <= $1 ORDER BY x.due_at, x.seq LIMIT 1) h \
     WHERE e.enabled AND e.deleted_at IS NULL AND ci.mode = 'closed' AND NOT e.ordered \
     UNION ALL \
     SELECT e.id, e.account, h.due_at, h.seq, 1::bigint, \
     (SELECT count(*) FROM delivery_queue y WHERE y.endpoint_id = e.id AND y.state = 'leased' AND y.lease_expires_at > $1), \
     e.max_in_flight, e.rate_limit_per_s, f.tokens, f.refilled_at, e.ordered \
     FROM endpoints e JOIN circuits ci ON ci.endpoint_id = e.id JOIN endpoint_flow f ON f.endpoint_id = e.id \
     CROSS JOIN LATERAL (SELECT x.state, x.due_at, x.seq FROM delivery_queue x WHERE x.endpoint_id = e.id \
       ORDER BY x.seq LIMIT 1) h \
     WHERE e.enabled AND e.deleted_at IS NULL AND ci.mode = 'closed' AND e.ordered \
     AND h.state = 'pending' AND h.due_at <= $1";

fn count_of(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

fn budget_of(tokens: Option<f64>, at: Option<i64>) -> Option<RateBudget> {
    match (tokens, at) {
        (Some(tokens), Some(at)) => Some(RateBudget {
            tokens,
            at: Timestamp::from_millis(at),
        }),
        _ => None,
    }
}

/// Whether a claim's transaction is still open when the claim returns:
/// the pipelined path sends its `COMMIT` with the claim statement, every
/// other path leaves it to [`DeliveryStore::delivery_claim`].
enum ClaimTx {
    Open,
    Committed,
}

/// Leases the ordinary part of a claim of `limit`: the endpoints' fair
/// shares (`flow::share_claim`), then, under each chosen endpoint's flow
/// row lock (taken in id order, so claimers never deadlock), the shares cut
/// to what the cap and the bucket allow now, since another replica may have
/// claimed in between; then the buckets are spent (ADR 0009).
async fn claim_fair(
    t: &Tx<'_>,
    limit: i64,
    expires: i64,
    worker: &str,
    throttle: &Throttle,
) -> StoreResult<(Vec<ClaimedDelivery>, ClaimTx)> {
    let now_ms = t.now.as_millis();
    // Prepared once per connection: planning this union of lateral scans
    // costs about as much as running it.
    let candidates_sql = t.prepare_cached(FLOW_CANDIDATES).await.db()?;
    let rows = t.query(&candidates_sql, &[&now_ms, &limit]).await.db()?;
    let mut candidates = Vec::with_capacity(rows.len());
    for r in &rows {
        let rate: Option<i64> = r.get(7);
        let budget = rate
            .map(|rate| RateBudget::refilled(budget_of(r.get(8), r.get(9)), u32_of(rate), t.now));
        let endpoint = EndpointId(r.get(0));
        candidates.push(FlowCandidate {
            endpoint,
            account: AccountId::new(r.get::<_, String>(1))?,
            oldest: (r.get(2), r.get(3)),
            due: count_of(r.get(4)),
            in_flight: count_of(r.get(5)),
            cap: throttle.cap(
                endpoint,
                r.get::<_, Option<i64>>(6)
                    .map_or(t.options.endpoint_concurrency, u32_of),
            ),
            rate_room: budget.map(|b| b.whole()),
            ordered: r.get(10),
        });
    }
    let mut shares = share_claim(&candidates, u32::try_from(limit).unwrap_or(0), throttle);
    if shares.is_empty() {
        return Ok((Vec::new(), ClaimTx::Open));
    }
    shares.sort_by_key(|(e, _)| *e);
    let ids: Vec<Uuid> = shares.iter().map(|(e, _)| e.0).collect();
    let rate_of = |endpoint: &EndpointId| {
        rows.iter()
            .find(|r| r.get::<_, Uuid>(0) == endpoint.0)
            .and_then(|r| r.get::<_, Option<i64>>(7))
    };
    // Serialize with other claimers of these endpoints: the claim statement,
    // issued after the lock is granted, recounts the leases.
    let lock = t
        .prepare_cached(
            "SELECT f.endpoint_id, f.tokens, f.refilled_at FROM endpoint_flow f \
             WHERE f.endpoint_id = ANY($1) ORDER BY f.endpoint_id FOR UPDATE",
        )
        .await
        .db()?;
    let claim = t.prepare_cached(&claim_statement()).await.db()?;
    let limited = shares.iter().any(|(e, _)| rate_of(e).is_some());
    // Without a rate limit the lock's answer changes nothing in the claim:
    // the lock, the claim and the commit go out together (pipelined; the
    // server runs the claim once the lock is granted, in a snapshot taken
    // then, and commits right after it), so the lock is held for the claim
    // statement alone, never for a round trip to this process, and replicas
    // queue on it that much less. With one, the buckets are read under the
    // lock first.
    let locked = if limited {
        t.query(&lock, &[&ids]).await.db()?
    } else {
        Vec::new()
    };
    // (endpoint, count, head of an ordered one, cap, refilled bucket)
    type Want = (Uuid, i64, Option<i64>, i64, Option<RateBudget>);
    // Each share cut to the room rule, with the buckets the lock shows
    // (none without a rate limit) refilled to t.now.
    let mut wanted: Vec<Want> = Vec::new();
    for (endpoint, share) in &shares {
        let Some(c) = candidates.iter().find(|c| c.endpoint == *endpoint) else {
            continue;
        };
        let budget = rate_of(endpoint).map(|rate| {
            let stored = locked
                .iter()
                .find(|r| r.get::<_, Uuid>(0) == endpoint.0)
                .and_then(|r| budget_of(r.get(1), r.get(2)));
            RateBudget::refilled(stored, u32_of(rate), t.now)
        });
        let now_seen = FlowCandidate {
            rate_room: budget.map(|b| b.whole()),
            ..c.clone()
        };
        let n = (*share).min(now_seen.room());
        if n > 0 {
            // An ordered endpoint has one delivery in flight at most.
            let cap = if c.ordered { 1 } else { c.cap };
            wanted.push((
                endpoint.0,
                i64::from(n),
                c.ordered.then_some(c.oldest.1),
                i64::from(cap),
                budget,
            ));
        }
    }
    if wanted.is_empty() {
        return Ok((Vec::new(), ClaimTx::Open));
    }
    let endpoints: Vec<Uuid> = wanted.iter().map(|w| w.0).collect();
    let counts: Vec<i64> = wanted.iter().map(|w| w.1).collect();
    let heads: Vec<Option<i64>> = wanted.iter().map(|w| w.2).collect();
    let caps: Vec<i64> = wanted.iter().map(|w| w.3).collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
        &now_ms, &endpoints, &expires, &worker, &counts, &heads, &caps,
    ];
    let rows = if limited {
        t.query(&claim, &params).await.db()?
    } else {
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (_, rows, ()) = futures::try_join!(
            t.query(&lock, &lock_params),
            t.query(&claim, &params),
            t.batch_execute("COMMIT")
        )
        .db()?;
        let claimed = rows
            .iter()
            .map(|r| row_to_claimed(r, false))
            .collect::<StoreResult<Vec<_>>>()?;
        return Ok((claimed, ClaimTx::Committed));
    };
    let claimed = rows
        .iter()
        .map(|r| row_to_claimed(r, false))
        .collect::<StoreResult<Vec<_>>>()?;
    for (endpoint, _, _, _, budget) in &wanted {
        let Some(b) = budget else { continue };
        let taken = claimed
            .iter()
            .filter(|c| c.delivery.endpoint_id.0 == *endpoint)
            .count();
        let left = b.spend(u32::try_from(taken).unwrap_or(u32::MAX));
        t.execute(
            "UPDATE endpoint_flow SET tokens = $1, refilled_at = $2 WHERE endpoint_id = $3",
            &[&left.tokens, &left.at.as_millis(), endpoint],
        )
        .await
        .db()?;
    }
    Ok((claimed, ClaimTx::Open))
}

/// A claimed delivery as stored: its secrets are opened by the claim's end
/// ([`SecretKeys::open_claimed`]).
fn row_to_claimed(r: &Row, probe: bool) -> StoreResult<ClaimedDelivery> {
    let delivery = row_to_delivery(r)?;
    let secrets = SigningSecrets {
        current: Secret::new(r.get::<_, String>(16)),
        previous: r.get::<_, Option<String>>(17).map(Secret::new),
        previous_expires_at: ts_opt(r.get(18)),
    };
    Ok(ClaimedDelivery {
        lease: Lease {
            delivery_id: delivery.id,
            token: LeaseToken(r.get(19)),
            attempt: delivery.attempts,
            expires_at: delivery.lease_expires_at.unwrap_or(delivery.due_at),
        },
        delivery,
        event_type: r.get(13),
        body: r.get(14),
        url: r.get(15),
        secrets,
        probe,
    })
}

/// A claim in the transaction of `t`, begun with [`CLAIM_SETTINGS`]; says
/// whether it committed that transaction itself (see [`claim_fair`]).
async fn claim(t: &Tx<'_>, req: ClaimRequest) -> StoreResult<(Vec<ClaimedDelivery>, ClaimTx)> {
    // Every few hundred milliseconds: free expired leases, then probes first.
    let housekeeping = t.housekeeping.due(t.now);
    if housekeeping {
        sweep_expired(t).await?;
    }
    let now_ms = t.now.as_millis();
    let expires = t.now.plus(req.lease_for).as_millis();
    let mut out = Vec::new();

    // Probes first. Locking the circuit row (skipping locked ones) makes
    // exactly one replica the prober of each endpoint.
    let open = if housekeeping {
        t.query(
            "SELECT endpoint_id FROM circuits WHERE mode = 'open' AND open_until <= $1 FOR UPDATE SKIP LOCKED",
            &[&now_ms],
        )
        .await
        .db()?
    } else {
        Vec::new()
    };
    if !open.is_empty() {
        // (due_at, seq, endpoint)
        let mut candidates: Vec<(i64, i64, Uuid)> = Vec::new();
        for r in &open {
            let endpoint_id: Uuid = r.get(0);
            let found = t
                .query_opt(PROBE_CANDIDATE, &[&now_ms, &endpoint_id])
                .await
                .db()?;
            if let Some(f) = found {
                candidates.push((f.get(1), f.get(0), endpoint_id));
            }
        }
        candidates.sort();
        candidates.truncate(req.limit as usize);
        for (_, seq, endpoint_id) in candidates {
            let rows = t
                .query(
                    &format!(
                        "WITH c AS (SELECT {SENDER_COLS} FROM delivery_queue x {SENDER_JOINS} \
                         WHERE x.endpoint_id = $2 AND x.seq = $5) {LEASE_AND_RETURN}"
                    ),
                    &[&now_ms, &endpoint_id, &expires, &req.worker, &seq],
                )
                .await
                .db()?;
            for r in &rows {
                let claimed = row_to_claimed(r, true)?;
                let mut c = endpoint::load_circuit(t, EndpointId(endpoint_id), false).await?;
                c.start_probe(claimed.delivery.id);
                endpoint::save_circuit(t, EndpointId(endpoint_id), &c).await?;
                out.push(claimed);
            }
        }
    }

    let rest = i64::from(req.limit) - out.len() as i64;
    let mut state = ClaimTx::Open;
    if rest > 0 {
        let (fair, fair_state) = claim_fair(t, rest, expires, &req.worker, &req.throttle).await?;
        out.extend(fair);
        state = fair_state;
    }
    out.sort_by_key(|c| (c.delivery.due_at, c.delivery.seq));
    Ok((t.keys.open_claimed(out), state))
}

pub(crate) async fn extend(t: &Tx<'_>, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
    let row = fenced_row(t, lease, FencedWrite::Keep { now: t.now }).await?;
    let expires_at = t.now.plus(lease_for);
    t.execute(
        "UPDATE delivery_queue SET lease_expires_at = $1, updated_at = $2 WHERE endpoint_id = $3 AND seq = $4",
        &[
            &expires_at.as_millis(),
            &t.now.as_millis(),
            &row.endpoint_id.0,
            &row.seq,
        ],
    )
    .await
    .db()?;
    Ok(Lease {
        expires_at,
        ..lease.clone()
    })
}

pub(crate) async fn release(t: &Tx<'_>, lease: &Lease) -> StoreResult<()> {
    let row = fenced_row(t, lease, FencedWrite::Within).await?;
    let mut circuit = endpoint::load_circuit(t, row.endpoint_id, true).await?;
    if circuit.is_probe(row.id) {
        circuit.cancel_probe(row.id);
        endpoint::save_circuit(t, row.endpoint_id, &circuit).await?;
    }
    t.execute(
        "UPDATE delivery_queue SET state = 'pending', attempts = attempts - 1, due_at = $1, lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, updated_at = $1 WHERE endpoint_id = $2 AND seq = $3",
        &[&t.now.as_millis(), &row.endpoint_id.0, &row.seq],
    )
    .await
    .db()?;
    Ok(())
}

/// The common outcome, for many leases in one statement (arrays through
/// `unnest`): a success, under its live lease, on an endpoint whose circuit is
/// closed with nothing to reset. `plan_outcome` gives exactly this transition
/// there (delivered, attempt logged, circuit unchanged, no alert): the live
/// row is deleted, the finished row and the attempt row are inserted.
/// Returns the deliveries it recorded; the others need the general path,
/// which handles everything. On a plain client the statement commits on its
/// own. The benchmark issues this same text raw.
pub const RECORD_DELIVERED: &str = "WITH i AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::bigint[]) \
     AS i(id, token, error, code, latency)), \
     g AS (DELETE FROM delivery_queue l USING i, deliveries d \
     WHERE d.id = i.id AND l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
     AND l.lease_token = i.token AND l.state = 'leased' \
     AND EXISTS (SELECT 1 FROM circuits c WHERE c.endpoint_id = l.endpoint_id \
     AND c.mode = 'closed' AND c.failures = 0 AND c.open_until IS NULL AND c.reopen_count = 0 \
     AND c.failing_since IS NULL AND c.probe IS NULL) \
     RETURNING l.delivery_id, l.endpoint_id, l.account, l.attempts, l.max_attempts, l.due_at, \
     i.token, i.error, i.code, i.latency), \
     f AS (INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
     lease_token, last_outcome, finished_at) \
     SELECT delivery_id, 'delivered', attempts, max_attempts, due_at, error, token, 'delivered', $6 FROM g) \
     INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, \
     latency_ms, will_retry, next_attempt_at, recorded_at) \
     SELECT g.delivery_id, g.endpoint_id, g.account, g.attempts, 'delivered', g.code, g.error, g.latency, \
     false, NULL, $6 FROM g RETURNING delivery_id";

/// Runs [`RECORD_DELIVERED`] on `items`.
pub(crate) async fn record_delivered_fast_batch(
    client: &deadpool_postgres::ClientWrapper,
    now: Timestamp,
    items: &[(&Lease, &AttemptReport)],
) -> StoreResult<Vec<DeliveryId>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = items.iter().map(|(l, _)| l.delivery_id.0).collect();
    let tokens: Vec<Uuid> = items.iter().map(|(l, _)| l.token.0).collect();
    let errors: Vec<Option<String>> = items.iter().map(|(_, r)| r.error.clone()).collect();
    let codes: Vec<Option<i64>> = items
        .iter()
        .map(|(_, r)| r.status_code.map(i64::from))
        .collect();
    let latencies: Vec<i64> = items
        .iter()
        .map(|(_, r)| i64::try_from(r.latency_ms).unwrap_or(i64::MAX))
        .collect();
    let complete = client.prepare_cached(RECORD_DELIVERED).await.db()?;
    let rows = client
        .query(
            &complete,
            &[&ids, &tokens, &errors, &codes, &latencies, &now.as_millis()],
        )
        .await
        .db()?;
    Ok(rows.iter().map(|r| DeliveryId(r.get(0))).collect())
}

pub(crate) async fn record_outcome(
    t: &Tx<'_>,
    lease: &Lease,
    outcome: DeliveryOutcome,
) -> StoreResult<OutcomeRecorded> {
    let end = FencedWrite::End {
        kind: outcome.kind(),
    };
    let Some(row) = lock_live(t, lease.delivery_id).await? else {
        // Finished: the same outcome again under its last lease is a repeat.
        let Some(done) = finished(t, lease.delivery_id).await? else {
            return Err(Refused::Lost.into());
        };
        fence(Some(&done.held()), &lease.token, end)?;
        return Ok(OutcomeRecorded {
            state: done.state,
            duplicate: true,
        });
    };
    if fence(Some(&row.held()), &lease.token, end)? == Verdict::Repeat {
        return Ok(OutcomeRecorded {
            state: row.state,
            duplicate: true,
        });
    }
    // A success on a healthy circuit changes nothing there: skip its row lock,
    // which every delivery to a busy endpoint would otherwise queue on.
    let mut circuit = endpoint::load_circuit(t, row.endpoint_id, false).await?;
    let untouched = outcome.is_success() && circuit == control_plane_core::Circuit::closed();
    if !untouched {
        circuit = endpoint::load_circuit(t, row.endpoint_id, true).await?;
    }
    let before = circuit.clone();
    let probe = circuit.is_probe(row.id);
    let tr = plan_outcome(
        row.state_for_plan(),
        &outcome,
        &mut circuit,
        probe,
        t.now,
        t.options,
    );
    if circuit != before {
        endpoint::save_circuit(t, row.endpoint_id, &circuit).await?;
    }
    apply(t, &row, &tr, Some(lease.token), Some(outcome.kind())).await?;
    Ok(OutcomeRecorded {
        state: tr.state,
        duplicate: false,
    })
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

/// The end of a replay, after the `WHERE` of a `DELETE FROM delivery_done x
/// USING deliveries d` in a CTE `x`: the dead rows it deleted go back to the
/// queue, due at `$1`, with their own sequence numbers and `$2` more
/// attempts.
const REQUEUE: &str = "RETURNING d.endpoint_id, d.seq, d.id, d.account, x.attempts, x.last_error) \
     INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, \
     due_at, last_error, updated_at) \
     SELECT endpoint_id, seq, id, account, 'pending', attempts, attempts + $2, $1, last_error, $1 FROM x";

/// A finished delivery back to the queue ([`Requeue`]).
pub(crate) async fn requeue(
    t: &Tx<'_>,
    account: &AccountId,
    id: DeliveryId,
    how: Requeue,
) -> StoreResult<Delivery> {
    get(t, account, id).await?;
    let deleted: bool = t
        .query_opt(
            "SELECT e.deleted_at IS NOT NULL FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE d.id = $1",
            &[&id.0],
        )
        .await
        .db()?
        .is_none_or(|r| r.get(0));
    // The finished row under its lock goes back to the queue with its own
    // sequence number and a new budget of attempts.
    let states: Vec<&str> = how.states().iter().map(|s| s.as_str()).collect();
    let moved = t
        .execute(
            &format!(
                "WITH x AS (DELETE FROM delivery_done x USING deliveries d \
                 WHERE x.delivery_id = $3 AND d.id = x.delivery_id AND x.state = ANY($5) AND NOT $4::boolean \
                 {REQUEUE}"
            ),
            &[
                &t.now.as_millis(),
                &i64::from(t.options.max_attempts),
                &id.0,
                &deleted,
                &states,
            ],
        )
        .await
        .db()?;
    if moved == 0 {
        let d = get(t, account, id).await?;
        if !how.states().contains(&d.state) {
            return Err(how.refused(id, Some(d.state)));
        }
        return Err(how.refused(id, None));
    }
    get(t, account, id).await
}

pub(crate) async fn replay_dead(t: &Tx<'_>, f: &ReplayFilter) -> StoreResult<u64> {
    t.execute(
        &format!(
            "WITH x AS (DELETE FROM delivery_done x USING deliveries d \
             WHERE d.id = x.delivery_id AND x.state = 'dead' AND d.account = $3 \
             AND ($4::uuid IS NULL OR d.endpoint_id = $4) \
             AND ($5::bigint IS NULL OR x.finished_at >= $5) AND ($6::bigint IS NULL OR x.finished_at < $6) \
             AND d.endpoint_id IN (SELECT id FROM endpoints WHERE account = $3 AND deleted_at IS NULL) \
             {REQUEUE}"
        ),
        &[
            &t.now.as_millis(),
            &i64::from(t.options.max_attempts),
            &f.account.as_str(),
            &f.endpoint_id.map(|e| e.0),
            &f.dead_since.map(Timestamp::as_millis),
            &f.dead_until.map(Timestamp::as_millis),
        ],
    )
    .await
    .db()
}

pub(crate) async fn list(t: &Tx<'_>, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
    req.page.validate()?;
    let rows = t
        .query(
            &format!(
                "SELECT {DELIVERY_COLS} FROM {DELIVERY_FROM} WHERE d.account = $1 AND {STATE_OF} IS NOT NULL \
                 AND ($2::text IS NULL OR {STATE_OF} = $2) AND ($3::uuid IS NULL OR d.endpoint_id = $3) \
                 AND ($4::uuid IS NULL OR d.event_id = $4) AND ($5::bigint IS NULL OR d.seq < $5) \
                 ORDER BY d.seq DESC LIMIT $6"
            ),
            &[
                &req.account.as_str(),
                &req.state.map(DeliveryState::as_str),
                &req.endpoint_id.map(|e| e.0),
                &req.event_id.map(|e| e.0),
                &req.page.after,
                &(i64::from(req.page.limit) + 1),
            ],
        )
        .await
        .db()?;
    let items = rows
        .iter()
        .map(row_to_delivery)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, req.page.limit, |d| d.seq))
}

pub(crate) async fn count_by_state(t: &Tx<'_>) -> StoreResult<Vec<(DeliveryState, u64)>> {
    let rows = t
        .query(
            "SELECT state, sum(n)::bigint FROM (SELECT state, count(*) AS n FROM delivery_queue GROUP BY state \
             UNION ALL SELECT state, count(*) FROM delivery_done GROUP BY state) s GROUP BY state ORDER BY state",
            &[],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| {
            Ok((
                r.get::<_, String>(0).parse()?,
                u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
            ))
        })
        .collect()
}

pub(crate) async fn count_by_account_and_state(
    t: &Tx<'_>,
) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
    let rows = t
        .query(
            "SELECT account, state, sum(n)::bigint FROM (\
             SELECT account, state, count(*) AS n FROM delivery_queue GROUP BY account, state \
             UNION ALL SELECT d.account, x.state, count(*) FROM delivery_done x \
             JOIN deliveries d ON d.id = x.delivery_id GROUP BY d.account, x.state) s \
             GROUP BY account, state ORDER BY account, state",
            &[],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| {
            Ok((
                AccountId::new(r.get::<_, String>(0))?,
                r.get::<_, String>(1).parse()?,
                u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            ))
        })
        .collect()
}

impl PostgresStore {
    /// The outbox: publishes inside the caller's own transaction, so the
    /// event and its deliveries commit or roll back with the caller's
    /// business write. The caller's connection must reach this store's
    /// schema (its `search_path`, as [`PostgresStore::schema`] names).
    ///
    /// # Errors
    /// As [`DeliveryStore::event_publish_batch`]; an error leaves the caller's
    /// transaction to be rolled back.
    pub async fn publish_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        reqs: Vec<PublishRequest>,
    ) -> StoreResult<Vec<Published>> {
        publish(&Tx::new(tx.client(), None, self, self.now()), reqs).await
    }

    /// Wakes workers on every replica; call it after committing a
    /// transaction that used [`PostgresStore::publish_in`].
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached (workers still poll).
    pub async fn notify_committed(&self) -> StoreResult<()> {
        self.wakeup.notify();
        let client = self.pool.get().await.map_err(crate::error::map_pool)?;
        client
            .execute("SELECT pg_notify($1, '')", &[&self.channel])
            .await
            .map_err(crate::error::map)?;
        Ok(())
    }
}

#[async_trait]
impl DeliveryStore for PostgresStore {
    async fn event_publish_batch(&self, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        if reqs.iter().all(|r| r.idempotency_key.is_none()) {
            return publish_keyless(self, &reqs).await;
        }
        let out = in_tx!(self, |t| publish(&t, reqs))?;
        self.wake().await;
        Ok(out)
    }

    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event> {
        in_tx!(self, |t| event_get(&t, account, id))
    }

    async fn event_list(&self, req: EventListRequest) -> StoreResult<Page<Event>> {
        in_tx!(self, |t| event_list(&t, &req))
    }

    async fn delivery_enqueue(
        &self,
        account: &AccountId,
        endpoint: EndpointId,
        event: EventId,
    ) -> StoreResult<Enqueued> {
        let out = in_tx!(self, |t| enqueue(&t, account, endpoint, event))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
        req.validate()?;
        let tx = PipelinedTx::begin(self, CLAIM_SETTINGS).await?;
        let out = {
            let client = tx.client()?;
            let t = Tx::new(client, Some(&client.statement_cache), self, self.now());
            let (out, state) = claim(&t, req).await?;
            if let ClaimTx::Open = state {
                t.batch_execute("COMMIT").await.db()?;
            }
            out
        };
        tx.ended();
        Ok(out)
    }

    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
        in_tx!(self, |t| extend(&t, lease, lease_for))
    }

    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()> {
        let out = in_tx!(self, |t| release(&t, lease))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
        let now = self.now();
        let mut seen = std::collections::HashMap::new();
        for (lease, _) in &batch {
            *seen.entry(lease.delivery_id).or_insert(0u32) += 1;
        }
        // Successes of deliveries named once in the batch go in one statement.
        let fast: Vec<(&Lease, &AttemptReport)> = batch
            .iter()
            .filter(|(l, _)| seen.get(&l.delivery_id) == Some(&1))
            .filter_map(|(l, o)| match o {
                DeliveryOutcome::Delivered(r) => Some((l, r)),
                _ => None,
            })
            .collect();
        let mut client = self.pool.get().await.map_err(crate::error::map_pool)?;
        // One autocommitted statement; the common batch is done with it.
        let done: std::collections::HashSet<DeliveryId> =
            record_delivered_fast_batch(&client, now, &fast)
                .await?
                .into_iter()
                .collect();
        if done.len() == batch.len() {
            return Ok(batch
                .iter()
                .map(|_| {
                    Ok(OutcomeRecorded {
                        state: DeliveryState::Delivered,
                        duplicate: false,
                    })
                })
                .collect());
        }
        let tx = client.transaction().await.map_err(crate::error::map)?;
        // The same store time as the fast path's statement above.
        let t = Tx::new(tx.client(), Some(&tx.statement_cache), self, now);
        let mut out = Vec::with_capacity(batch.len());
        for (lease, outcome) in batch {
            if done.contains(&lease.delivery_id) {
                out.push(Ok(OutcomeRecorded {
                    state: DeliveryState::Delivered,
                    duplicate: false,
                }));
                continue;
            }
            // Contract answers come from checks, not from failed statements,
            // so the transaction stays usable after them.
            match record_outcome(&t, &lease, outcome).await {
                Err(e) if !e.is_contract_answer() => return Err(e),
                r => out.push(r),
            }
        }
        tx.commit().await.map_err(crate::error::map)?;
        Ok(out)
    }

    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let out = in_tx!(self, |t| requeue(&t, account, id, Requeue::Replay))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_resend(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let out = in_tx!(self, |t| requeue(&t, account, id, Requeue::Resend))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_replay_dead(&self, filter: ReplayFilter) -> StoreResult<u64> {
        let n = in_tx!(self, |t| replay_dead(&t, &filter))?;
        if n > 0 {
            self.wake().await;
        }
        Ok(n)
    }

    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        in_tx!(self, |t| get(&t, account, id))
    }

    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
        in_tx!(self, |t| list(&t, req))
    }

    fn delivery_wakeups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.wakeup.subscribe()
    }

    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        in_tx!(self, |t| count_by_state(&t))
    }

    async fn delivery_count_by_account_and_state(
        &self,
    ) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
        in_tx!(self, |t| count_by_account_and_state(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::open_test_store;

    /// A pipelined publish whose delivery insert fails after its event
    /// insert succeeded stores neither: the statements run in one
    /// transaction, and the `COMMIT` sent behind them rolls it back.
    #[tokio::test]
    async fn a_pipelined_publish_that_fails_part_way_stores_nothing() {
        let (store, admin) = open_test_store().await;
        let schema = store.schema().to_string();
        let account = AccountId::new("a").unwrap();
        store
            .endpoint_create(EndpointCreateRequest::new(
                account.clone(),
                "https://example.com/hook",
                Secret::new("whsec_dGVzdA=="),
            ))
            .await
            .unwrap();
        admin
            .batch_execute(&format!(
                "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
                 CREATE TRIGGER refuse BEFORE INSERT ON {schema}.deliveries \
                 FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse()"
            ))
            .await
            .unwrap();
        let req = PublishRequest::new(account.clone(), "a.b", serde_json::json!({}));
        let events = format!("SELECT count(*) FROM {schema}.events");
        let failed = store
            .event_publish_batch(vec![req.clone(), req.clone()])
            .await;
        assert!(failed.is_err(), "{failed:?}");
        let stored: i64 = admin.query_one(&events, &[]).await.unwrap().get(0);
        assert_eq!(stored, 0, "the events outlived the failed delivery insert");
        // The pool's connection is usable again, outside any transaction.
        admin
            .batch_execute(&format!("DROP TRIGGER refuse ON {schema}.deliveries"))
            .await
            .unwrap();
        let published = store.event_publish_batch(vec![req]).await.unwrap();
        assert_eq!(published[0].deliveries.len(), 1);
        let stored: i64 = admin.query_one(&events, &[]).await.unwrap().get(0);
        assert_eq!(stored, 1);
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
}
