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
    /// Whether the transition moves the due time (a success keeps it).
    pub(super) due_moves: Vec<bool>,
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
        self.due_moves.push(tr.due_at != row.due_at);
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
        if let Some(groups) = self.alike() {
            for (key, seqs) in groups {
                let Some((lo, hi)) = seq_range(&seqs) else {
                    continue;
                };
                let (state, due_at, last_error, token, outcome) = key;
                t.execute(
                    SET_ALIKE,
                    params![
                        state,
                        due_at,
                        last_error,
                        token,
                        outcome,
                        t.now.as_millis(),
                        lo,
                        hi,
                        list::of(seqs)
                    ],
                )
                .db()?;
            }
            dead_letters_add(t, &self.died)?;
            return self.attempts.write(t);
        }
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

    /// The transitions as a few groups that write the same values (the due
    /// time `None` where it stays), with their seqs; `None` when there are
    /// more than [`ALIKE_GROUPS`] (then one statement joins the per-row
    /// values). A batch of successes under one claim's token is one group:
    /// DuckDB updates it without the join, the most of an update's cost
    /// (docs/experiments.md, "The embedded store's write shapes").
    fn alike(&self) -> Option<Vec<(Alike, Vec<i64>)>> {
        let mut groups: Vec<(Alike, Vec<i64>)> = Vec::new();
        for (i, seq) in self.seq.iter().enumerate() {
            let key: Alike = (
                self.state.get(i).copied().unwrap_or_default(),
                self.due_moves
                    .get(i)
                    .copied()
                    .unwrap_or(true)
                    .then(|| self.due_at.get(i).copied())
                    .flatten(),
                self.last_error.get(i).cloned().flatten(),
                self.token.get(i).cloned().flatten(),
                self.outcome.get(i).cloned().flatten(),
            );
            match groups.iter().position(|(k, _)| *k == key) {
                Some(g) => groups.get_mut(g)?.1.push(*seq),
                None if groups.len() < ALIKE_GROUPS => groups.push((key, vec![*seq])),
                None => return None,
            }
        }
        Some(groups)
    }
}

/// The values a group of transitions writes alike: state, due time (none:
/// unchanged), last error, lease token, last outcome.
type Alike = (
    &'static str,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Groups of alike transitions written one statement each, at most.
const ALIKE_GROUPS: usize = 4;

/// Writes one group of alike transitions: `$1` state, `$2` due time (NULL:
/// unchanged), `$3` last error, `$4` lease token, `$5` last outcome, `$6`
/// now, the seqs `$9` (all between `$7` and `$8`).
const SET_ALIKE: &str = "UPDATE deliveries SET state = $1, due_at = coalesce($2, due_at), last_error = $3, \
     lease_expires_at = NULL, leased_by = NULL, lease_token = $4, last_outcome = $5, updated_at = $6 \
     WHERE seq BETWEEN $7 AND $8 AND seq IN (SELECT unnest($9::BIGINT[]))";
