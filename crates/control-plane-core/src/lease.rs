//! The one lease check (ADR 0002).
//!
//! Every write a lease fences (extending it, staging a result, releasing it,
//! recording the outcome that ends it) reads its row, describes what it
//! found as a [`Held`], and asks [`fence`] whether it may write. The
//! adapters read their rows into the types of this module and ask through
//! them, with the same names on both: [`LeaseRow::fence`] and
//! [`LeaseRow::fenced`] for live deliveries, [`FinishedRow::fence`] for a
//! delivery kept apart once finished, [`TaskRow::fence`] and
//! [`TaskRow::fail_to`] for tasks (the architecture test
//! `adapters_ask_the_lease_check_through_core_rows` keeps it so). The
//! reference model (`control_plane_conformance::model`) asks [`fence`] directly; ticks fence
//! in their single `UPDATE ... WHERE token = $n` instead, since a tick has
//! no outcome to repeat.
//!
//! Its tests: the unit tests below pin each rule; on both adapters, the
//! conformance contracts `stale_lease_token_gets_lease_lost_and_changes_nothing`,
//! `repeated_outcome_is_a_noop`, `extend_renews_a_live_lease`,
//! `release_keeps_the_attempt_budget` and the `workflow_*` lease contracts,
//! and the reference model's comparison (`model_test.rs`).

use crate::policy::AttemptState;
use crate::workflow::{Task, TaskFailure, TaskState, WorkflowPolicy};
use crate::{AccountId, DeliveryId, DeliveryState, EndpointId, LeaseToken, StoreError, Timestamp};

/// What a fenced write found on its row. `T` is the token's type: the
/// adapters use [`crate::LeaseToken`], the reference model a counter.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a, T> {
    /// The row is in its leased state now.
    pub leased: bool,
    /// The token of the row's current lease, or of the lease that last
    /// ended (kept so a repeated outcome is recognised).
    pub token: Option<T>,
    /// When the current lease expires.
    pub expires_at: Option<Timestamp>,
    /// The kind of outcome the last lease ended with.
    pub last_outcome: Option<&'a str>,
}

/// The write a lease asks to make.
#[derive(Clone, Copy, Debug)]
pub enum FencedWrite<'k> {
    /// Keeps the lease going (extend, heartbeat): it must hold the row and
    /// not have expired at `now`.
    Keep {
        /// The store's time.
        now: Timestamp,
    },
    /// Acts within the lease (stage a result, release): it must hold the row.
    Within,
    /// Ends the lease with an outcome of `kind`: it must hold the row, or
    /// have ended it with the same kind already (a repeat).
    End {
        /// The outcome's kind, as stored in `last_outcome`.
        kind: &'k str,
    },
}

/// What the write may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The lease holds the row: write the transition.
    Live,
    /// The same outcome was already recorded under this lease: answer as
    /// before (a duplicate) and write nothing.
    Repeat,
}

/// Why a fenced write is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The lease no longer holds the row: it expired, was released, was
    /// taken by another claim, or the row is gone.
    Lost,
    /// The lease already ended with another outcome, of this kind.
    Conflict {
        /// The outcome recorded under the lease.
        recorded: String,
    },
}

impl From<Refused> for StoreError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Lost => StoreError::LeaseLost,
            Refused::Conflict { recorded } => StoreError::Conflict(format!(
                "a different outcome ({recorded}) was already recorded with this lease"
            )),
        }
    }
}

/// A live delivery as every transition reads it, on both adapters: the
/// adapter maps its row into this, asks [`LeaseRow::fenced`] (or [`fence`]
/// with [`LeaseRow::held`]), and plans with [`LeaseRow::state_for_plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    /// The delivery.
    pub id: DeliveryId,
    /// Its sequence number (per endpoint, in publish order).
    pub seq: i64,
    /// Its account.
    pub account: AccountId,
    /// Its endpoint.
    pub endpoint_id: EndpointId,
    /// Attempts started.
    pub attempts: u32,
    /// Its budget of attempts.
    pub max_attempts: u32,
    /// When it is due.
    pub due_at: Timestamp,
    /// Its state.
    pub state: DeliveryState,
    /// The current lease's token, or the last one's.
    pub lease_token: Option<LeaseToken>,
    /// When the current lease expires.
    pub lease_expires_at: Option<Timestamp>,
    /// The outcome kind the last lease ended with.
    pub last_outcome: Option<String>,
}

impl LeaseRow {
    /// What the lease check sees.
    pub fn held(&self) -> Held<'_, LeaseToken> {
        Held {
            leased: self.state == DeliveryState::Leased,
            token: self.lease_token,
            expires_at: self.lease_expires_at,
            last_outcome: self.last_outcome.as_deref(),
        }
    }

    /// The lease check ([`fence`]) on this delivery for `write` under
    /// `token`.
    ///
    /// # Errors
    /// Why the write is refused.
    pub fn fence(&self, token: &LeaseToken, write: FencedWrite<'_>) -> Result<Verdict, Refused> {
        fence(Some(&self.held()), token, write)
    }

    /// `row` when `write` may go ahead under `token` ([`fence`]); a missing
    /// row is a lost lease.
    ///
    /// # Errors
    /// Why the write is refused.
    pub fn fenced(
        row: Option<LeaseRow>,
        token: &LeaseToken,
        write: FencedWrite<'_>,
    ) -> Result<LeaseRow, Refused> {
        let row = row.ok_or(Refused::Lost)?;
        row.fence(token, write)?;
        Ok(row)
    }

    /// What the transition planners (`crate::policy`) need of it.
    pub fn state_for_plan(&self) -> AttemptState {
        AttemptState {
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            due_at: self.due_at,
        }
    }
}

/// A delivery that has left the live queue, as an adapter that keeps
/// finished deliveries apart (postgres) reads it: how it ended, the token
/// of its last lease and the outcome recorded under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedRow {
    /// Its final state.
    pub state: DeliveryState,
    /// The token of the lease that ended it.
    pub lease_token: Option<LeaseToken>,
    /// The outcome kind that lease ended with.
    pub last_outcome: Option<String>,
}

impl FinishedRow {
    /// What the lease check sees: no lease holds a finished delivery, so
    /// only its last outcome again, under its last lease, passes (as a
    /// repeat).
    pub fn held(&self) -> Held<'_, LeaseToken> {
        Held {
            leased: false,
            token: self.lease_token,
            expires_at: None,
            last_outcome: self.last_outcome.as_deref(),
        }
    }

    /// The lease check ([`fence`]) on this finished delivery for `write`
    /// under `token`.
    ///
    /// # Errors
    /// Why the write is refused.
    pub fn fence(&self, token: &LeaseToken, write: FencedWrite<'_>) -> Result<Verdict, Refused> {
        fence(Some(&self.held()), token, write)
    }
}

/// A task as every fenced write reads it, on both adapters: the port's
/// [`Task`] with the columns it does not show.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    /// The task.
    pub task: Task,
    /// Its sequence number (listing order).
    pub seq: i64,
    /// The current lease's token, or the last one's.
    pub token: Option<LeaseToken>,
    /// The outcome kind the last lease ended with.
    pub last_outcome: Option<String>,
}

impl TaskRow {
    /// What the lease check sees.
    pub fn held(&self) -> Held<'_, LeaseToken> {
        Held {
            leased: self.task.state == TaskState::Leased,
            token: self.token,
            expires_at: self.task.lease_expires_at,
            last_outcome: self.last_outcome.as_deref(),
        }
    }

    /// The lease check ([`fence`]) on this task for `write` under `token`.
    ///
    /// # Errors
    /// Why the write is refused.
    pub fn fence(&self, token: &LeaseToken, write: FencedWrite<'_>) -> Result<Verdict, Refused> {
        fence(Some(&self.held()), token, write)
    }

    /// Where failing this task under `token` at `now` takes it
    /// ([`TaskFailure::next`]), or `None` when that lease already ended
    /// with a failure (a repeat: answer with the task as it is).
    ///
    /// # Errors
    /// Why the write is refused.
    pub fn fail_to(
        &self,
        token: &LeaseToken,
        failure: TaskFailure,
        now: Timestamp,
        policy: &WorkflowPolicy,
    ) -> Result<Option<(TaskState, Timestamp)>, Refused> {
        if self.fence(token, FencedWrite::End { kind: "fail" })? == Verdict::Repeat {
            return Ok(None);
        }
        Ok(Some(failure.next(&self.task, now, policy)))
    }
}

/// The lease check: may the holder of `token` make `write` on the row it
/// `found` (`None`: no such row)?
///
/// # Errors
/// [`Refused::Lost`] when the lease does not hold the row (for
/// [`FencedWrite::Keep`], also when it expired); [`Refused::Conflict`]
/// when an ending write finds its lease ended with another outcome.
pub fn fence<T: PartialEq>(
    found: Option<&Held<'_, T>>,
    token: &T,
    write: FencedWrite<'_>,
) -> Result<Verdict, Refused> {
    let Some(row) = found else {
        return Err(Refused::Lost);
    };
    let same_token = row.token.as_ref() == Some(token);
    let holds = row.leased && same_token;
    match write {
        FencedWrite::Keep { now } if holds && row.expires_at.is_none_or(|e| e > now) => {
            Ok(Verdict::Live)
        }
        FencedWrite::Within | FencedWrite::End { .. } if holds => Ok(Verdict::Live),
        FencedWrite::End { kind } if same_token => match row.last_outcome {
            Some(k) if k == kind => Ok(Verdict::Repeat),
            Some(k) => Err(Refused::Conflict {
                recorded: k.to_string(),
            }),
            None => Err(Refused::Lost),
        },
        _ => Err(Refused::Lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(leased: bool, token: u32, last: Option<&str>) -> Held<'_, u32> {
        Held {
            leased,
            token: Some(token),
            expires_at: Some(Timestamp::from_millis(100)),
            last_outcome: last,
        }
    }

    #[test]
    fn a_held_lease_may_keep_act_and_end() {
        let r = row(true, 7, None);
        let at = |ms| FencedWrite::Keep {
            now: Timestamp::from_millis(ms),
        };
        assert_eq!(fence(Some(&r), &7, at(99)), Ok(Verdict::Live));
        assert_eq!(fence(Some(&r), &7, at(100)), Err(Refused::Lost));
        assert_eq!(fence(Some(&r), &7, FencedWrite::Within), Ok(Verdict::Live));
        let end = FencedWrite::End { kind: "delivered" };
        assert_eq!(fence(Some(&r), &7, end), Ok(Verdict::Live));
    }

    #[test]
    fn another_token_or_no_row_is_lost() {
        let r = row(true, 7, None);
        for write in [
            FencedWrite::Within,
            FencedWrite::End { kind: "delivered" },
            FencedWrite::Keep {
                now: Timestamp::from_millis(0),
            },
        ] {
            assert_eq!(fence(Some(&r), &8, write), Err(Refused::Lost));
            assert_eq!(fence(None, &7, write), Err(Refused::Lost));
        }
    }

    #[test]
    fn an_ended_lease_repeats_its_outcome_and_refuses_another() {
        let r = row(false, 7, Some("delivered"));
        let end = |kind| FencedWrite::End { kind };
        assert_eq!(fence(Some(&r), &7, end("delivered")), Ok(Verdict::Repeat));
        assert_eq!(
            fence(Some(&r), &7, end("failed")),
            Err(Refused::Conflict {
                recorded: "delivered".into()
            })
        );
        assert_eq!(fence(Some(&r), &8, end("delivered")), Err(Refused::Lost));
        assert_eq!(fence(Some(&r), &7, FencedWrite::Within), Err(Refused::Lost));
        // Released (no outcome recorded): nothing to repeat.
        assert_eq!(
            fence(Some(&row(false, 7, None)), &7, end("delivered")),
            Err(Refused::Lost)
        );
    }
}
