//! What every transition of a live delivery reads and writes: its lease
//! row, its endpoint's circuit, the batched write of the new states and
//! attempt rows; the copies of dead deliveries are in
//! [`crate::delivery::dead_letters`].

use crate::delivery::dead_letters::{dead_letters_add, seq_range};
use crate::delivery::publish::raise_alert;
use crate::error::DuckResultExt;
use crate::live::{row_to_lease_row, LEASE_COLS};
use crate::store::Tx;
use crate::util::list;
use crate::{attempt, endpoint};
use control_plane_core::{alerts_for, Transition};
use control_plane_core::{Circuit, DeliveryId, DeliveryState, EndpointId, LeaseToken, StoreResult};
use duckdb::{params, OptionalExt};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

pub(super) use control_plane_core::LeaseRow;

pub(super) fn lease_row(t: &Tx<'_>, id: DeliveryId) -> StoreResult<Option<LeaseRow>> {
    t.query_row(
        &format!("SELECT {LEASE_COLS} FROM deliveries WHERE id = $1"),
        params![id.to_string()],
        row_to_lease_row,
    )
    .optional()
    .db()
}

/// Circuits read at most once per transaction and written back once, when
/// they changed.
#[derive(Default)]
pub(super) struct Circuits(HashMap<EndpointId, (Circuit, Circuit)>);

impl Circuits {
    pub(super) fn get(&mut self, t: &mut Tx<'_>, id: EndpointId) -> StoreResult<&mut Circuit> {
        let slot = match self.0.entry(id) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let c = endpoint::load_circuit(t, id)?;
                v.insert((c.clone(), c))
            }
        };
        Ok(&mut slot.1)
    }

    pub(super) fn write(self, t: &mut Tx<'_>) -> StoreResult<()> {
        for (id, (loaded, now)) in self.0 {
            if loaded != now {
                endpoint::save_circuit(t, id, &now)?;
            }
        }
        Ok(())
    }
}

/// Delivery transitions gathered during one transaction: the rows are
/// updated by one statement, their attempt-log rows written by another,
/// the ones that died copied into `dead_letters` by a third. The writer's
/// live index and finished tally follow each one as it is gathered.
#[derive(Default)]
pub(super) struct Transitions {
    pub(super) seq: Vec<i64>,
    pub(super) state: Vec<&'static str>,
    pub(super) due_at: Vec<i64>,
    pub(super) last_error: Vec<Option<String>>,
    pub(super) token: Vec<Option<String>>,
    pub(super) outcome: Vec<Option<String>>,
    pub(super) attempts: attempt::AttemptRows,
    /// The seqs of the deliveries that died.
    pub(super) died: Vec<i64>,
}

impl Transitions {
    /// Gathers a transition of `row` and applies it to `row` in memory (so a
    /// repeat later in the batch sees it); disables and alerts are written
    /// at once.
    pub(super) fn push(
        &mut self,
        t: &mut Tx<'_>,
        row: &mut LeaseRow,
        tr: &Transition,
        keep_token: Option<LeaseToken>,
        outcome_kind: Option<&str>,
    ) -> StoreResult<()> {
        self.seq.push(row.seq);
        self.state.push(tr.state.as_str());
        self.due_at.push(tr.due_at.as_millis());
        self.last_error.push(tr.last_error.clone());
        self.token.push(keep_token.map(|k| k.to_string()));
        self.outcome.push(outcome_kind.map(str::to_string));
        self.attempts.push(
            t,
            row.id,
            row.endpoint_id,
            &row.account,
            row.attempts,
            &tr.attempt,
        );
        let before = row.state;
        row.state = tr.state;
        row.due_at = tr.due_at;
        row.lease_token = keep_token;
        row.lease_expires_at = None;
        row.last_outcome = outcome_kind.map(str::to_string);
        let now = t.now;
        t.live_mut().moved(row, Some(tr.last_error.clone()), now);
        t.finished_mut().moved(&row.account, before, tr.state, 1);
        if tr.state == DeliveryState::Dead {
            self.died.push(row.seq);
        }
        let mut disabled = false;
        if let Some(reason) = &tr.disable_reason {
            disabled = endpoint::disable(t, row.endpoint_id, reason)?;
        }
        for alert in alerts_for(tr, disabled, &row.account, row.endpoint_id, row.id) {
            raise_alert(t, &alert)?;
        }
        Ok(())
    }

    pub(super) fn write(self, t: &mut Tx<'_>) -> StoreResult<()> {
        let Some((lo, hi)) = seq_range(&self.seq) else {
            return Ok(());
        };
        t.execute(
            "UPDATE deliveries SET state = c.state, due_at = c.due_at, last_error = c.last_error, \
             lease_expires_at = NULL, leased_by = NULL, lease_token = c.token, last_outcome = c.outcome, \
             updated_at = $7 FROM (SELECT unnest($1::BIGINT[]) AS seq, unnest($2::VARCHAR[]) AS state, \
             unnest($3::BIGINT[]) AS due_at, unnest($4::VARCHAR[]) AS last_error, \
             unnest($5::VARCHAR[]) AS token, unnest($6::VARCHAR[]) AS outcome) c \
             WHERE deliveries.seq = c.seq AND deliveries.seq BETWEEN $8 AND $9",
            params![
                list::of(self.seq),
                list::text(self.state),
                list::of(self.due_at),
                list::of(self.last_error),
                list::of(self.token),
                list::of(self.outcome),
                t.now.as_millis(),
                lo,
                hi
            ],
        )
        .db()?;
        dead_letters_add(t, &self.died)?;
        self.attempts.write(t)
    }
}
