//! What every transition of a live delivery reads and writes: its live row
//! under its lock, its finished row, and the write of the new state with its
//! attempt row.

use crate::delivery::publish::raise_alert;
use crate::error::PgResultExt;
use crate::store::Tx;
use crate::util::RowExt;
use crate::{attempt, endpoint};
use control_plane_core::{alerts_for, Transition};
use control_plane_core::{DeliveryId, LeaseToken, StoreResult};
pub(super) use control_plane_core::{FinishedRow, LeaseRow};
use tokio_postgres::Row;

pub(super) const LEASE_COLS: &str =
    "l.delivery_id, l.account, l.endpoint_id, l.seq, l.attempts, l.max_attempts, l.due_at, l.state, \
     l.lease_token, l.lease_expires_at, l.last_outcome";

pub(super) fn row_to_lease_row(r: &Row) -> StoreResult<LeaseRow> {
    Ok(LeaseRow {
        id: r.col(0)?,
        account: r.col(1)?,
        endpoint_id: r.col(2)?,
        seq: r.col(3)?,
        attempts: r.col(4)?,
        max_attempts: r.col(5)?,
        due_at: r.col(6)?,
        state: r.col(7)?,
        lease_token: r.col(8)?,
        lease_expires_at: r.col(9)?,
        last_outcome: r.col(10)?,
    })
}

/// The live row of a delivery under its lock; `None` once it is finished
/// (or when it does not exist).
pub(super) async fn lock_live(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<LeaseRow>> {
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

pub(super) async fn finished(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<FinishedRow>> {
    let row = t
        .query_opt(
            "SELECT state, lease_token, last_outcome FROM delivery_done WHERE delivery_id = $1",
            &[&id.0],
        )
        .await
        .db()?;
    row.map(|r| {
        Ok(FinishedRow {
            state: r.col(0)?,
            lease_token: r.col(1)?,
            last_outcome: r.col(2)?,
        })
    })
    .transpose()
}

/// Writes a transition: the live row moved to its new due time, or deleted
/// and its finished row and tally delta written; the attempt-log row (with
/// its rollup delta); a disable.
pub(super) async fn apply(
    t: &Tx<'_>,
    row: &LeaseRow,
    tr: &Transition,
    keep_token: Option<LeaseToken>,
    outcome_kind: Option<&str>,
) -> StoreResult<()> {
    let keep_token = keep_token.map(|k| k.0);
    let now = t.now.as_millis();
    // Both statements take the same parameters: the row, then what it
    // becomes.
    let sql = if tr.state.is_final() {
        "WITH g AS (DELETE FROM delivery_queue WHERE endpoint_id = $1 AND seq = $2 \
         RETURNING delivery_id, account, seq, attempts, max_attempts), \
         tally AS (INSERT INTO delivery_tallies (account, state, n) SELECT account, $3, 1 FROM g) \
         INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
         lease_token, last_outcome, finished_at, account, seq) \
         SELECT delivery_id, $3, attempts, max_attempts, $4, $5, $6, $7, $8, \
         CASE WHEN $3 = 'dead' THEN account END, CASE WHEN $3 = 'dead' THEN seq END FROM g"
    } else {
        "UPDATE delivery_queue SET state = $3, due_at = $4, last_error = $5, lease_expires_at = NULL, \
         leased_by = NULL, lease_token = $6, last_outcome = $7, updated_at = $8 \
         WHERE endpoint_id = $1 AND seq = $2"
    };
    let statement = t.prepare_cached(sql).await.db()?;
    t.execute(
        &statement,
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
