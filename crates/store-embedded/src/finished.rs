//! What the writer keeps of the finished history, beside the live index
//! ([`crate::live`]): the finished deliveries counted by account and state,
//! and the seqs of each account's dead letters, so that neither counting
//! deliveries nor the dead-letter page reads the finished history, which
//! grows without bound (issue 54, ADR 0032).

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use control_plane_core::{AccountId, DeliveryState, StoreError, StoreResult};
use duckdb::params;

use crate::error::DuckResultExt;
use crate::util::RowExt;

/// Deliveries counted by account and state.
pub(crate) type Counts = HashMap<(AccountId, DeliveryState), u64>;

/// Counts the deliveries of the states `states` by account and state, in
/// one scan of the table.
pub(crate) fn count_in_table(
    conn: &duckdb::Connection,
    states: [DeliveryState; 2],
) -> StoreResult<Counts> {
    let mut st = conn
        .prepare_cached(
            "SELECT account, state, count(*) FROM deliveries WHERE state IN ($1, $2) \
             GROUP BY account, state",
        )
        .db()?;
    let rows = st
        .query_map(params![states[0].as_str(), states[1].as_str()], |r| {
            Ok(((r.col(0)?, r.col(1)?), r.get::<_, i64>(2)?))
        })
        .db()?;
    let mut out = Counts::new();
    for row in rows {
        let (key, n) = row.db()?;
        out.insert(key, u64::try_from(n).unwrap_or(0));
    }
    Ok(out)
}

/// The seqs of each account's dead letters: the rows of `dead_letters`.
pub(crate) type DeadSeqs = HashMap<AccountId, BTreeSet<i64>>;

/// The seqs of every dead letter, in one scan of `dead_letters` (which
/// holds only dead deliveries, not the history).
fn dead_in_table(conn: &duckdb::Connection) -> StoreResult<DeadSeqs> {
    let mut st = conn
        .prepare_cached("SELECT account, seq FROM dead_letters")
        .db()?;
    let mut rows = st.query(params![]).db()?;
    let mut out = DeadSeqs::new();
    while let Some(r) = rows.next().db()? {
        let account: AccountId = r.col(0).db()?;
        out.entry(account).or_default().insert(r.get(1).db()?);
    }
    Ok(out)
}

/// The finished deliveries (delivered, dead) counted by account and state,
/// and the seqs of the dead ones by account. Kept so that counting
/// deliveries never scans the finished history, and the dead-letter page
/// is chosen without a top-N of every dead letter (which at 50,000 of them
/// costs DuckDB more than a whole page costs at 100).
///
/// The counts are counted by one scan at their first use (not at open, so opening a large
/// file stays fast). Every write that moves a delivery into or out of a
/// finished state, or deletes a finished one, tells it in the same
/// transaction ([`crate::store::Tx::finished_mut`]); the dead seqs are read
/// from `dead_letters` at their first use, and told of every row inserted
/// into or deleted from it. A failed transaction that changed or read them
/// throws both away, as it does the live index.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct FinishedTally {
    /// In step with the table, without zero counts; `None`: to be counted
    /// from the table before its next use.
    counts: Option<Counts>,
    /// In step with `dead_letters`, without empty sets; `None`: to be read
    /// from the table before its next use.
    dead: Option<DeadSeqs>,
}

impl FinishedTally {
    const STATES: [DeliveryState; 2] = [DeliveryState::Delivered, DeliveryState::Dead];

    /// The tally is no longer in step: counted again before its next use.
    pub fn forget(&mut self) {
        self.counts = None;
        self.dead = None;
    }

    /// Whether the counts are kept.
    pub fn is_built(&self) -> bool {
        self.counts.is_some()
    }

    /// Whether the dead seqs are kept.
    pub fn dead_is_built(&self) -> bool {
        self.dead.is_some()
    }

    /// `n` deliveries of `account` moved from state `from` to `to`; only
    /// finished states are counted.
    pub fn moved(&mut self, account: &AccountId, from: DeliveryState, to: DeliveryState, n: u64) {
        if from != to {
            self.removed(account, from, n);
            self.added(account, to, n);
        }
    }

    /// `n` more deliveries of `account` are in state `state`.
    pub fn added(&mut self, account: &AccountId, state: DeliveryState, n: u64) {
        if let Some(counts) = &mut self.counts {
            if state.is_final() && n > 0 {
                let count = counts.entry((account.clone(), state)).or_default();
                *count = count.saturating_add(n);
            }
        }
    }

    /// `n` deliveries of `account` left state `state`. More than the tally
    /// holds means it is out of step: it is counted again before its next
    /// use.
    pub fn removed(&mut self, account: &AccountId, state: DeliveryState, n: u64) {
        let Some(counts) = &mut self.counts else {
            return;
        };
        if !state.is_final() || n == 0 {
            return;
        }
        let key = (account.clone(), state);
        match counts.get(&key).copied() {
            Some(count) if count > n => {
                counts.insert(key, count - n);
            }
            Some(count) if count == n => {
                counts.remove(&key);
            }
            _ => self.counts = None,
        }
    }

    /// Dead letter `seq` of `account` was inserted into `dead_letters`; one
    /// it already holds means it is out of step.
    pub fn died(&mut self, account: &AccountId, seq: i64) {
        if let Some(dead) = &mut self.dead {
            if !dead.entry(account.clone()).or_default().insert(seq) {
                self.dead = None;
            }
        }
    }

    /// Dead letter `seq` of `account` was deleted from `dead_letters`
    /// (revived or purged); one it does not hold means it is out of step.
    pub fn revived(&mut self, account: &AccountId, seq: i64) {
        let Some(dead) = &mut self.dead else {
            return;
        };
        let Some(seqs) = dead.get_mut(account).filter(|seqs| seqs.contains(&seq)) else {
            self.dead = None;
            return;
        };
        seqs.remove(&seq);
        if seqs.is_empty() {
            dead.remove(account);
        }
    }

    /// The seqs of `account`'s dead letters before `before` (all of them
    /// when `None`), newest first, at most `n`: read from `dead_letters`
    /// first when needed, and compared with it when `check` is set.
    pub fn dead_page(
        &mut self,
        conn: &duckdb::Connection,
        account: &AccountId,
        before: Option<i64>,
        n: usize,
        check: bool,
    ) -> StoreResult<Vec<i64>> {
        let dead = match self.dead.take() {
            Some(kept) if !check => kept,
            kept => {
                let table = dead_in_table(conn)?;
                if let Some(kept) = kept.filter(|kept| *kept != table) {
                    let mut both = format!("kept {kept:?}, in the table {table:?}");
                    both.truncate(4_000);
                    return Err(StoreError::Backend(format!(
                        "the dead letters' seqs are out of step with the dead_letters table: {both}"
                    )));
                }
                table
            }
        };
        let upper = before.map_or(Bound::Unbounded, Bound::Excluded);
        let page = dead.get(account).map_or_else(Vec::new, |seqs| {
            let newer = seqs.range((Bound::Unbounded, upper)).rev();
            newer.take(n).copied().collect()
        });
        self.dead = Some(dead);
        Ok(page)
    }

    /// The counts, from the table first when needed, and compared with it
    /// when `check` is set.
    pub fn counts(&mut self, conn: &duckdb::Connection, check: bool) -> StoreResult<&Counts> {
        let counts = match self.counts.take() {
            Some(kept) if !check => kept,
            kept => {
                let table = count_in_table(conn, Self::STATES)?;
                if let Some(kept) = kept.filter(|kept| *kept != table) {
                    return Err(StoreError::Backend(format!(
                        "the finished-delivery tally is out of step with the deliveries table: \
                         kept {kept:?}, in the table {table:?}"
                    )));
                }
                table
            }
        };
        Ok(self.counts.insert(counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tally counts only finished states, drops a count that falls to
    /// zero, and is forgotten when told of more leaving than it holds; a
    /// forgotten one ignores changes until it is counted again.
    #[test]
    fn the_finished_tally_follows_moves_and_forgets_when_out_of_step() {
        let (a, b) = (AccountId::new("a").unwrap(), AccountId::new("b").unwrap());
        let (pending, dead, delivered) = (
            DeliveryState::Pending,
            DeliveryState::Dead,
            DeliveryState::Delivered,
        );
        let mut tally = FinishedTally {
            counts: Some(Counts::new()),
            dead: None,
        };
        tally.moved(&a, DeliveryState::Leased, delivered, 1);
        tally.moved(&a, DeliveryState::Leased, delivered, 1);
        tally.moved(&a, pending, DeliveryState::Leased, 1);
        tally.added(&b, dead, 3);
        tally.moved(&b, dead, pending, 1);
        let expected: Counts = [((a.clone(), delivered), 2), ((b.clone(), dead), 2)].into();
        assert_eq!(tally.counts, Some(expected));

        tally.removed(&a, delivered, 2);
        assert_eq!(
            tally.counts.as_ref().map(Counts::len),
            Some(1),
            "a zero count goes"
        );

        tally.removed(&b, dead, 3);
        assert!(!tally.is_built(), "more leaving than it holds: out of step");
        tally.added(&a, dead, 1);
        assert_eq!(tally, FinishedTally::default());
    }

    /// A failed call throws the finished tally away only when it changed
    /// it: an endpoint removal that parked a delivery as dead and then
    /// failed leaves the tally to be counted again from the table, without
    /// the rolled-back dead delivery; a failed call that did not touch it
    /// keeps it.
    #[tokio::test]
    async fn a_failed_call_drops_the_finished_tally_only_when_it_changed_it() {
        use control_plane_core::{Check, DeliveryStore, EndpointStore, EventStore, PublishRequest};

        use crate::store::{tests::store_with_endpoint, Lane};
        let dir = tempfile::tempdir().unwrap();
        let (store, account) = store_with_endpoint(&dir, false).await;
        let endpoint = store.endpoint_list(&account).await.unwrap()[0].id;
        let req = PublishRequest::new(
            account.clone(),
            "order.paid".to_string(),
            serde_json::json!({}),
        );
        store.event_publish(req.checked().unwrap()).await.unwrap();
        let pending = vec![(account.clone(), DeliveryState::Pending, 1)];
        let counts = || store.delivery_count_by_account_and_state();
        // A transaction that succeeds, so asking does not throw it away.
        let built = || store.call(Lane::Work, |w| w.tx(|t| Ok(t.finished_mut().is_built())));
        assert!(!built().await.unwrap(), "not counted at open");
        assert_eq!(counts().await.unwrap(), pending);
        assert!(built().await.unwrap(), "counted at its first use");

        let failed = store.call(Lane::Work, |w| {
            Ok(w.tx(|_| -> StoreResult<()> { Err(StoreError::Backend("no".into())) }))
        });
        assert!(failed.await.unwrap().is_err());
        assert!(built().await.unwrap(), "untouched by the failure");

        let a = account.clone();
        let failed = store.call(Lane::Work, move |w| {
            Ok(w.tx(|t| -> StoreResult<()> {
                assert_eq!(crate::endpoint::delete(t, &a, endpoint)?, 1);
                Err(StoreError::Backend("rolled back".into()))
            }))
        });
        assert!(failed.await.unwrap().is_err());
        assert!(
            !built().await.unwrap(),
            "it had counted the parked delivery"
        );
        assert_eq!(
            counts().await.unwrap(),
            pending,
            "counted again from the table"
        );
    }

    /// The dead seqs give an account's newest first, before a cursor; a
    /// set that empties goes, and a repeated insert or the deletion of a
    /// seq they do not hold forgets them, leaving the counts.
    #[test]
    fn the_dead_seqs_page_newest_first_and_forget_when_out_of_step() {
        let (a, b) = (AccountId::new("a").unwrap(), AccountId::new("b").unwrap());
        let mut tally = FinishedTally {
            counts: Some(Counts::new()),
            dead: Some(DeadSeqs::new()),
        };
        for seq in [3, 9, 5, 1] {
            tally.died(&a, seq);
        }
        tally.died(&b, 7);
        // Kept and not checked: the connection is not read.
        let conn = duckdb::Connection::open_in_memory().unwrap();
        let page =
            |t: &mut FinishedTally, before, n| t.dead_page(&conn, &a, before, n, false).unwrap();
        assert_eq!(page(&mut tally, None, 3), [9, 5, 3]);
        assert_eq!(page(&mut tally, Some(3), 3), [1]);
        assert_eq!(page(&mut tally, Some(1), 3), Vec::<i64>::new());
        tally.revived(&b, 7);
        assert_eq!(
            tally.dead.as_ref().map(DeadSeqs::len),
            Some(1),
            "b's set goes"
        );
        tally.died(&a, 5);
        assert!(!tally.dead_is_built(), "a repeat is out of step");
        assert!(tally.is_built(), "the counts stay");
        tally.dead = Some(DeadSeqs::new());
        tally.revived(&a, 5);
        assert!(!tally.dead_is_built(), "unknown seq: out of step");
    }
}
