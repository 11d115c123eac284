//! The copies of dead deliveries in `dead_letters` (migration 13), which
//! the dead-letter page reads instead of the whole history, and the
//! writer's tally of them (ADR 0032); with the statements that move
//! deliveries by seq. Below the delivery stages and the endpoint's removal,
//! which both use it, and using neither.

use crate::error::DuckResultExt;
use crate::store::Tx;
use crate::util::{list, RowExt};
use control_plane_core::{AccountId, StoreResult};
use duckdb::params;

/// The lowest and highest of `seqs`, when there is one. Batches address
/// deliveries by `seq`, not by id: it is an integer, unique, and rows are
/// stored in its order, so with `seq BETWEEN lowest AND highest` DuckDB's
/// zone maps skip every block outside the batch instead of comparing every
/// id of the table (measured: 1.6 ms instead of 9.5 ms at 200,000 rows).
pub(super) fn seq_range(seqs: &[i64]) -> Option<(i64, i64)> {
    Some((*seqs.iter().min()?, *seqs.iter().max()?))
}

/// The columns of a dead delivery's copy in `dead_letters` (migration 13):
/// its whole row but the state, which is `dead`.
pub(crate) const DEAD_LETTER_COLS: &str =
    "account, seq, id, endpoint_id, event_id, attempts, max_attempts, due_at, lease_expires_at, \
     last_error, created_at, updated_at";

/// Copies the rows of deliveries `seqs`, made dead in this transaction,
/// into `dead_letters`, which the dead-letter page reads instead of the
/// whole history, and tells the writer's dead seqs (ADR 0032). The postgres
/// adapter needs no copy: its finished rows carry the dead ones' account
/// and seq, in a partial index.
pub(crate) fn dead_letters_add(t: &mut Tx<'_>, seqs: &[i64]) -> StoreResult<()> {
    let Some((lo, hi)) = seq_range(seqs) else {
        return Ok(());
    };
    let added = account_seqs(
        t,
        &format!(
            "INSERT INTO dead_letters ({DEAD_LETTER_COLS}) SELECT {DEAD_LETTER_COLS} FROM deliveries \
             WHERE seq BETWEEN $2 AND $3 AND seq IN (SELECT unnest($1::BIGINT[])) AND state = 'dead' \
             RETURNING account, seq"
        ),
        params![list::of(seqs.iter().copied()), lo, hi],
    )?;
    let tally = t.finished_mut();
    for (account, seq) in &added {
        tally.died(account, *seq);
    }
    Ok(())
}

/// The seqs `sql` returns: of an `UPDATE ... RETURNING seq`, the
/// deliveries it moved, for [`dead_letters_add`] or [`dead_letters_remove`];
/// of a `SELECT seq`, the deliveries it found.
pub(crate) fn moved_seqs<P: duckdb::Params>(
    t: &Tx<'_>,
    sql: &str,
    params: P,
) -> StoreResult<Vec<i64>> {
    let mut st = t.prepare(sql).db()?;
    let rows = st.query_map(params, |r| r.get(0)).db()?;
    rows.collect::<Result<_, _>>().db()
}

/// The rows `sql`, a statement on `dead_letters` ending in `RETURNING
/// account, seq`, returned.
fn account_seqs<P: duckdb::Params>(
    t: &Tx<'_>,
    sql: &str,
    params: P,
) -> StoreResult<Vec<(AccountId, i64)>> {
    let mut st = t.prepare(sql).db()?;
    let rows = st.query_map(params, |r| Ok((r.col(0)?, r.get(1)?))).db()?;
    rows.collect::<Result<_, _>>().db()
}

/// Deletes the copies of deliveries `seqs`, revived or purged in this
/// transaction, from `dead_letters` ([`dead_letters_add`]).
pub(crate) fn dead_letters_remove(t: &mut Tx<'_>, seqs: &[i64]) -> StoreResult<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    let removed = account_seqs(
        t,
        "DELETE FROM dead_letters WHERE seq IN (SELECT unnest($1::BIGINT[])) RETURNING account, seq",
        params![list::of(seqs.iter().copied())],
    )?;
    let tally = t.finished_mut();
    for (account, seq) in &removed {
        tally.revived(account, *seq);
    }
    Ok(())
}
