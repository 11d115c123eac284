//! After a claim: extending and releasing a lease, recording outcomes (the
//! lease check, `control_plane_core::fence`), and sending finished
//! deliveries again (replay, resend).

use crate::delivery::read::get;
use crate::delivery::transition::{apply, finished, lock_live};
use crate::endpoint;
use crate::error::PgResultExt;
use crate::store::{PipelinedTx, PostgresStore, Tx};
use crate::util::RowExt;
use control_plane_core::plan_outcome;
use control_plane_core::{
    latency_bucket, rollup_bucket, rollup_minute, storable_body, AccountId, AttemptReport,
    AttemptResult, Delivery, DeliveryId, DeliveryOutcome, DeliveryState, EndpointId, Lease,
    OutcomeRecorded, ReplayFilter, Requeue, StoreResult, Timestamp,
};
use control_plane_core::{FencedWrite, LeaseRow, Refused, Verdict};
use std::time::Duration;
use uuid::Uuid;

/// The live row of `lease`'s delivery under its lock, when `write` may go
/// ahead under it.
pub(super) async fn fenced_row(
    t: &Tx<'_>,
    lease: &Lease,
    write: FencedWrite<'_>,
) -> StoreResult<LeaseRow> {
    Ok(LeaseRow::fenced(
        lock_live(t, lease.delivery_id).await?,
        &lease.token,
        write,
    )?)
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

/// The `$10` of [`RECORD_DELIVERED`].
pub const LEASED: &str = "leased";

/// The common outcome, for many leases in one statement (arrays through
/// `unnest`): a success, under its live lease, on an endpoint whose circuit is
/// closed with nothing to reset. `plan_outcome` gives exactly this transition
/// there (delivered, attempt logged, circuit unchanged, no alert): the live
/// row is deleted, the finished row and the attempt row are inserted, and
/// the finished tally and the attempt rollup get their deltas (ADR 0032):
/// `$8` holds each attempt's latency bucket, `$9` the rollup minute of `$6`,
/// `$10` the state a live row must be in (`leased`, [`LEASED`]): a parameter, so
/// that the generic plan the delivery path runs (ADR 0040) cannot take the
/// partial index of leases, which would be scanned per row (one endpoint's
/// every lease: 233 ms per batch of 100 in the burn-down with a plan made
/// before the table had statistics); the primary key is then the only index
/// that finds a live row, by its whole key.
/// Returns the deliveries it recorded; the others need the general path,
/// which handles everything. On a plain client the statement commits on its
/// own. The benchmark issues this same text raw.
pub const RECORD_DELIVERED: &str = "WITH i AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::bigint[], \
     $7::text[], $8::smallint[]) AS i(id, token, error, code, latency, body, bucket)), \
     g AS (DELETE FROM delivery_queue l USING i, deliveries d \
     WHERE d.id = i.id AND l.endpoint_id = d.endpoint_id AND l.seq = d.seq \
     AND l.lease_token = i.token AND l.state = $10 \
     AND EXISTS (SELECT 1 FROM circuits c WHERE c.endpoint_id = l.endpoint_id \
     AND c.mode = 'closed' AND c.failures = 0 AND c.open_until IS NULL AND c.reopen_count = 0 \
     AND c.failing_since IS NULL AND c.probe IS NULL) \
     RETURNING l.delivery_id, l.endpoint_id, l.account, l.attempts, l.max_attempts, l.due_at, \
     i.token, i.error, i.code, i.latency, i.body, i.bucket), \
     f AS (INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
     lease_token, last_outcome, finished_at) \
     SELECT delivery_id, 'delivered', attempts, max_attempts, due_at, error, token, 'delivered', $6 FROM g), \
     tally AS (INSERT INTO delivery_tallies (account, state, n) \
     SELECT account, 'delivered', count(*) FROM g GROUP BY account), \
     rollup AS (INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
     SELECT endpoint_id, $9, 'delivered', bucket, count(*) FROM g GROUP BY endpoint_id, bucket) \
     INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, \
     latency_ms, will_retry, next_attempt_at, recorded_at, response_body) \
     SELECT g.delivery_id, g.endpoint_id, g.account, g.attempts, 'delivered', g.code, g.error, g.latency, \
     false, NULL, $6, g.body FROM g RETURNING delivery_id";

/// Records a batch of outcomes (`DeliveryStore::delivery_record_outcomes`):
/// the successes of deliveries named once in one statement
/// ([`RECORD_DELIVERED`]) with its transaction's `BEGIN` and `COMMIT` in one
/// round trip, the rest one by one ([`record_outcome`]) in a second
/// transaction. Both commit waiting for the disk or not as configured (ADR
/// 0034).
pub(crate) async fn record_outcomes(
    store: &PostgresStore,
    batch: Vec<(Lease, DeliveryOutcome)>,
) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
    let now = store.now();
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
    // The common successes in one statement, sent with its transaction's
    // `BEGIN` and `COMMIT` (one round trip), the commit waiting for the
    // disk or not as configured (ADR 0034); the rest, if any, in a
    // second transaction committed the same way.
    let tx = PipelinedTx::connect(store).await?;
    let out = {
        let client = tx.client()?;
        let mut done = std::collections::HashSet::new();
        if !fast.is_empty() {
            // Prepared first, so that the statement goes out between
            // the `BEGIN` and the `COMMIT`.
            client.prepare_cached(RECORD_DELIVERED).await.db()?;
            let (_, ids, _) = futures::try_join!(
                async { client.batch_execute(store.begin_outcomes).await.db() },
                record_delivered(client, now, &fast),
                async { client.batch_execute("COMMIT").await.db() }
            )?;
            done.extend(ids);
        }
        // `done` holds only deliveries named once: all of the batch, or
        // a second transaction records the rest.
        let rest = done.len() < batch.len();
        if rest {
            client.batch_execute(store.begin_outcomes).await.db()?;
        }
        // The same store time as the fast statement above.
        let t = Tx::new(client, Some(&client.statement_cache), store, now);
        let mut out = Vec::with_capacity(batch.len());
        for (lease, outcome) in batch {
            if done.contains(&lease.delivery_id) {
                out.push(Ok(OutcomeRecorded {
                    state: DeliveryState::Delivered,
                    duplicate: false,
                }));
                continue;
            }
            // Contract answers come from checks, not from failed
            // statements, so the transaction stays usable after them.
            match record_outcome(&t, &lease, outcome).await {
                Err(e) if !e.is_contract_answer() => return Err(e),
                r => out.push(r),
            }
        }
        if rest {
            client.batch_execute("COMMIT").await.db()?;
        }
        out
    };
    tx.ended();
    Ok(out)
}

/// Runs [`RECORD_DELIVERED`] on `items`.
pub(crate) async fn record_delivered(
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
    let bodies: Vec<Option<String>> = items
        .iter()
        .map(|(_, r)| storable_body(r.response_body.as_deref()))
        .collect();
    let buckets: Vec<i16> = items
        .iter()
        .map(|(_, r)| latency_bucket(r.latency_ms))
        .collect();
    let complete = client.prepare_cached(RECORD_DELIVERED).await.db()?;
    let rows = client
        .query(
            &complete,
            &[
                &ids,
                &tokens,
                &errors,
                &codes,
                &latencies,
                &now.as_millis(),
                &bodies,
                &buckets,
                &rollup_minute(now),
                &LEASED,
            ],
        )
        .await
        .db()?;
    rows.iter().map(|r| r.col(0)).collect()
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
        done.fence(&lease.token, end)?;
        return Ok(OutcomeRecorded {
            state: done.state,
            duplicate: true,
        });
    };
    if row.fence(&lease.token, end)? == Verdict::Repeat {
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

/// Hands out up to `$2` pending deliveries of poll endpoint `$1`, lowest
/// sequence first, each recorded as delivered at `$3` in one statement, as
/// [`RECORD_DELIVERED`] records a batch of successes: the live row deleted,
/// the finished row, the tally, the rollup (`$4` its minute, `$5` its
/// bucket) and the attempt row (its attempt counted), so that reading is
/// acknowledging (ADR 0051). `plan_outcome` gives exactly this transition
/// there: a poll endpoint's circuit never leaves closed, as no outcome but
/// a delivery is ever recorded for it. The attempt rows are inserted in
/// sequence order, so their positions follow it.
const DELIVER_POLLED: &str = "WITH g AS (DELETE FROM delivery_queue l \
     WHERE (l.endpoint_id, l.seq) IN (SELECT p.endpoint_id, p.seq FROM delivery_queue p \
     WHERE p.endpoint_id = $1 AND p.state = 'pending' ORDER BY p.seq LIMIT $2 FOR UPDATE) \
     RETURNING l.delivery_id, l.endpoint_id, l.account, l.seq, l.attempts + 1 AS attempts, \
     l.max_attempts, l.due_at), \
     f AS (INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
     lease_token, last_outcome, finished_at) \
     SELECT delivery_id, 'delivered', attempts, max_attempts, due_at, NULL, NULL, 'delivered', $3 FROM g), \
     tally AS (INSERT INTO delivery_tallies (account, state, n) \
     SELECT account, 'delivered', count(*) FROM g GROUP BY account), \
     rollup AS (INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
     SELECT endpoint_id, $4, 'delivered', $5, count(*) FROM g GROUP BY endpoint_id) \
     INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, \
     latency_ms, will_retry, next_attempt_at, recorded_at, response_body) \
     SELECT delivery_id, endpoint_id, account, attempts, 'delivered', NULL, NULL, 0, false, NULL, $3, NULL \
     FROM g ORDER BY seq RETURNING delivery_id";

/// Runs [`DELIVER_POLLED`]; the caller holds the endpoint's poll lock.
/// Returns how many it handed out.
pub(crate) async fn deliver_polled(
    t: &Tx<'_>,
    endpoint: EndpointId,
    limit: i64,
) -> StoreResult<usize> {
    let statement = t.prepare_cached(DELIVER_POLLED).await.db()?;
    let rows = t
        .query(
            &statement,
            &[
                &endpoint.0,
                &limit,
                &t.now.as_millis(),
                &rollup_minute(t.now),
                &rollup_bucket(AttemptResult::Delivered, 0),
            ],
        )
        .await
        .db()?;
    Ok(rows.len())
}

/// The end of a replay, after the `WHERE` of a `DELETE FROM delivery_done x
/// USING deliveries d` in a CTE `x`: the dead rows it deleted go back to the
/// queue, due at `$1`, with their own sequence numbers and their endpoint's
/// attempt limit (or `$2`) more attempts, and leave the finished tally.
pub(super) const REQUEUE: &str = "RETURNING d.endpoint_id, d.seq, d.id, d.account, x.attempts, x.last_error, \
     x.state AS was), \
     tally AS (INSERT INTO delivery_tallies (account, state, n) \
     SELECT account, was, -count(*) FROM x GROUP BY account, was) \
     INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, \
     due_at, last_error, updated_at) \
     SELECT endpoint_id, seq, id, account, 'pending', attempts, \
     attempts + coalesce((SELECT e.max_attempts FROM endpoints e WHERE e.id = x.endpoint_id), $2), \
     $1, last_error, $1 FROM x";

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
        .map(|r| r.col::<bool>(0))
        .transpose()?
        .unwrap_or(true);
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
