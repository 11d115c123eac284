//! After a claim: extending and releasing a lease, recording outcomes (the
//! lease check, `control_plane_core::fence`), and sending finished
//! deliveries again (replay, resend).

use crate::delivery::dead_letters::{dead_letters_remove, moved_seqs, seq_range};
use crate::delivery::read::get;
use crate::delivery::transition::{lease_row, Circuits, Transitions};
use crate::endpoint;
use crate::error::DuckResultExt;
use crate::live::{row_to_lease_row, LEASE_COLS};
use crate::store::Tx;
use crate::util::list;
use control_plane_core::plan_outcome;
use control_plane_core::{
    AccountId, AttemptReport, Delivery, DeliveryId, DeliveryOutcome, DeliveryState, EndpointId,
    Lease, OutcomeRecorded, ReplayFilter, Requeue, StoreResult, Timestamp,
};
use control_plane_core::{FencedWrite, LeaseRow, Refused, Verdict};
use duckdb::{params, OptionalExt};
use std::collections::HashMap;
use std::time::Duration;

/// The row of `lease`'s delivery, when `write` may go ahead under it.
pub(super) fn fenced_row(
    t: &Tx<'_>,
    lease: &Lease,
    write: FencedWrite<'_>,
) -> StoreResult<LeaseRow> {
    Ok(LeaseRow::fenced(
        lease_row(t, lease.delivery_id)?,
        &lease.token,
        write,
    )?)
}

pub(crate) fn extend(t: &mut Tx<'_>, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
    let row = fenced_row(t, lease, FencedWrite::Keep { now: t.now })?;
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
    let now = t.now;
    t.live_mut().extend(row.id, expires_at, now);
    Ok(Lease {
        expires_at,
        ..lease.clone()
    })
}

pub(crate) fn release(t: &mut Tx<'_>, lease: &Lease) -> StoreResult<()> {
    let mut row = fenced_row(t, lease, FencedWrite::Within)?;
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
    row.state = DeliveryState::Pending;
    row.attempts = row.attempts.saturating_sub(1);
    row.due_at = t.now;
    row.lease_token = None;
    row.lease_expires_at = None;
    let now = t.now;
    t.live_mut().moved(&row, None, now);
    Ok(())
}

/// The rows of deliveries `seqs`, all between `lo` and `hi`, as the lease
/// check reads them: by seq range, so that the zone maps skip the rest.
fn lease_rows_by_seq(t: &Tx<'_>, seqs: &[i64], (lo, hi): (i64, i64)) -> StoreResult<Vec<LeaseRow>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {LEASE_COLS} FROM deliveries \
             WHERE seq BETWEEN $2 AND $3 AND seq IN (SELECT unnest($1::BIGINT[]))"
        ))
        .db()?;
    let rows = st
        .query_map(
            params![list::of(seqs.iter().copied()), lo, hi],
            row_to_lease_row,
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

/// The rows of the batch's deliveries as the lease check reads them. The
/// live index holds every leased one; only the others (a lease already
/// ended or lost) are read from the table, and all of them while the index
/// is not kept: by seq when this writer leased every one of them, by id
/// otherwise (after a restart, or a lease repeated in the batch).
fn lease_rows(t: &mut Tx<'_>, batch: &[(Lease, DeliveryOutcome)]) -> StoreResult<Vec<LeaseRow>> {
    let mut kept = Vec::with_capacity(batch.len());
    let mut unknown: Vec<&(Lease, DeliveryOutcome)> = Vec::new();
    if t.live().is_built() {
        for item in batch {
            match t.live().leased(item.0.delivery_id).cloned() {
                Some(row) => {
                    t.seqs.take(row.id);
                    kept.push(row);
                }
                None => unknown.push(item),
            }
        }
        if unknown.is_empty() {
            return Ok(kept);
        }
    } else {
        unknown.extend(batch.iter());
    }
    let known: Option<Vec<i64>> = unknown
        .iter()
        .map(|(l, _)| t.seqs.take(l.delivery_id))
        .collect();
    let found = match known.as_deref().and_then(|k| seq_range(k).map(|r| (k, r))) {
        Some((seqs, range)) => lease_rows_by_seq(t, seqs, range)?,
        None => {
            let mut st = t
                .prepare(&format!(
                    "SELECT {LEASE_COLS} FROM deliveries WHERE id IN (SELECT unnest($1::VARCHAR[]))"
                ))
                .db()?;
            let rows = st
                .query_map(
                    params![list::text(unknown.iter().map(|(l, _)| l.delivery_id))],
                    row_to_lease_row,
                )
                .db()?;
            rows.collect::<Result<Vec<_>, _>>().db()?
        }
    };
    kept.extend(found);
    Ok(kept)
}

/// Records a batch of outcomes in the one transaction `t` belongs to. Each
/// item gets its own answer; contract answers (a lost lease, a conflicting
/// repeat) are found before anything of that item is written.
pub(crate) fn record_outcomes(
    t: &mut Tx<'_>,
    batch: Vec<(Lease, DeliveryOutcome)>,
) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
    let rows = lease_rows(t, &batch)?;
    let mut rows: HashMap<DeliveryId, LeaseRow> =
        rows.into_iter().map(|row| (row.id, row)).collect();
    let mut circuits = Circuits::default();
    let mut writes = Transitions::default();
    let mut out = Vec::with_capacity(batch.len());
    for (lease, outcome) in batch {
        let end = FencedWrite::End {
            kind: outcome.kind(),
        };
        let Some(row) = rows.get_mut(&lease.delivery_id) else {
            out.push(Err(Refused::Lost.into()));
            continue;
        };
        match row.fence(&lease.token, end) {
            Err(refused) => {
                out.push(Err(refused.into()));
                continue;
            }
            Ok(Verdict::Repeat) => {
                out.push(Ok(OutcomeRecorded {
                    state: row.state,
                    duplicate: true,
                }));
                continue;
            }
            Ok(Verdict::Live) => {}
        }
        let circuit = circuits.get(t, row.endpoint_id)?;
        let probe = circuit.is_probe(row.id);
        let tr = plan_outcome(
            row.state_for_plan(),
            &outcome,
            circuit,
            probe,
            t.now,
            &t.options,
        );
        writes.push(t, row, &tr, Some(lease.token), Some(outcome.kind()))?;
        out.push(Ok(OutcomeRecorded {
            state: tr.state,
            duplicate: false,
        }));
    }
    circuits.write(t)?;
    writes.write(t)?;
    Ok(out)
}

/// A finished delivery back to the queue ([`Requeue`]).
pub(crate) fn requeue(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: DeliveryId,
    how: Requeue,
) -> StoreResult<Delivery> {
    let d = get(t, account, id)?;
    if !how.states().contains(&d.state) {
        return Err(how.refused(id, Some(d.state)));
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
        return Err(how.refused(id, None));
    }
    t.execute(
        "UPDATE deliveries SET state = 'pending', due_at = $1, max_attempts = attempts + coalesce((SELECT e.max_attempts FROM endpoints e \
         WHERE e.id = deliveries.endpoint_id), $2), lease_token = NULL, \
         last_outcome = NULL, updated_at = $1 WHERE id = $3",
        params![t.now.as_millis(), t.options.max_attempts, id.to_string()],
    )
    .db()?;
    if d.state == DeliveryState::Dead {
        dead_letters_remove(t, &[d.seq])?;
    }
    t.live_mut().forget();
    t.finished_mut()
        .moved(account, d.state, DeliveryState::Pending, 1);
    get(t, account, id)
}

pub(crate) fn replay_dead(t: &mut Tx<'_>, f: &ReplayFilter) -> StoreResult<u64> {
    let revived = moved_seqs(
        t,
        "UPDATE deliveries SET state = 'pending', due_at = $1, max_attempts = attempts + coalesce((SELECT e.max_attempts FROM endpoints e \
         WHERE e.id = deliveries.endpoint_id), $2), lease_token = NULL, \
         last_outcome = NULL, updated_at = $1 \
         WHERE account = $3 AND state = 'dead' AND ($4::VARCHAR IS NULL OR endpoint_id = $4) \
         AND ($5::BIGINT IS NULL OR updated_at >= $5) AND ($6::BIGINT IS NULL OR updated_at < $6) \
         AND endpoint_id IN (SELECT id FROM endpoints WHERE account = $3 AND deleted_at IS NULL) \
         RETURNING seq",
        params![
            t.now.as_millis(),
            t.options.max_attempts,
            f.account.as_str(),
            f.endpoint_id.map(|e| e.to_string()),
            f.dead_since.map(Timestamp::as_millis),
            f.dead_until.map(Timestamp::as_millis)
        ],
    )?;
    let n = revived.len() as u64;
    if n > 0 {
        dead_letters_remove(t, &revived)?;
        t.live_mut().forget();
        t.finished_mut()
            .moved(&f.account, DeliveryState::Dead, DeliveryState::Pending, n);
    }
    Ok(n)
}

/// The seqs of the `limit` oldest pending deliveries of `endpoint`, from
/// the live index when it is kept (no scan of the history; windows past the
/// kept one read in first), else from the table.
fn pending_seqs(t: &mut Tx<'_>, endpoint: EndpointId, limit: i64) -> StoreResult<Vec<i64>> {
    let take = usize::try_from(limit).unwrap_or(0);
    for _ in 0..=take {
        let short = t
            .live_queues()?
            .and_then(|queues| queues.get(&endpoint))
            .is_some_and(|q| q.short_for_seqs(take));
        if !short {
            break;
        }
        t.live_refill(endpoint)?;
    }
    if let Some(queues) = t.live_queues()? {
        return Ok(queues
            .get(&endpoint)
            .map(|q| q.pending_by_seq().take(take).map(|(seq, _)| seq).collect())
            .unwrap_or_default());
    }
    moved_seqs(
        t,
        "SELECT seq FROM deliveries WHERE endpoint_id = $1 AND state = 'pending' ORDER BY seq LIMIT $2",
        params![endpoint.to_string(), limit],
    )
}

/// Hands out up to `limit` pending deliveries of poll endpoint `endpoint`,
/// lowest sequence first, each recorded as delivered: the same transition a
/// success after a claim makes (its attempt counted, the attempt row, the
/// rollup, the tally, the live index), so that reading is acknowledging
/// (ADR 0051). Returns how many it handed out.
pub(crate) fn deliver_polled(
    t: &mut Tx<'_>,
    endpoint: EndpointId,
    limit: i64,
) -> StoreResult<usize> {
    let Some((lo, hi)) = seq_range(&pending_seqs(t, endpoint, limit)?) else {
        return Ok(0);
    };
    let seqs = moved_seqs(
        t,
        "UPDATE deliveries SET attempts = attempts + 1 WHERE seq BETWEEN $1 AND $2 \
         AND endpoint_id = $3 AND state = 'pending' RETURNING seq",
        params![lo, hi, endpoint.to_string()],
    )?;
    let mut rows = lease_rows_by_seq(t, &seqs, (lo, hi))?;
    rows.sort_by_key(|r| r.seq);
    let outcome = DeliveryOutcome::Delivered(AttemptReport::default());
    let mut circuits = Circuits::default();
    let mut writes = Transitions::default();
    for row in &mut rows {
        let circuit = circuits.get(t, row.endpoint_id)?;
        let tr = plan_outcome(
            row.state_for_plan(),
            &outcome,
            circuit,
            false,
            t.now,
            &t.options,
        );
        writes.push(t, row, &tr, None, Some(outcome.kind()))?;
    }
    circuits.write(t)?;
    writes.write(t)?;
    Ok(rows.len())
}
