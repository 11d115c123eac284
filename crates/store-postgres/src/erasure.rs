//! Erasure of an account (`control_plane_core::ErasureStore`): the start that
//! shuts its doors, and the batches that remove its rows.

use async_trait::async_trait;
use control_plane_core::{
    idempotency_account_prefix, AccountId, ErasureBegun, ErasureStore, PurgeBatch, StoreResult,
    ERASE_TASK, ERASING,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};
use crate::util::RowExt;

/// Ends the sessions signed in with the account's keys or opened by its
/// portal links, revokes the keys and the links, and disables its
/// endpoints.
pub(crate) async fn begin(t: &Tx<'_>, account: &AccountId) -> StoreResult<ErasureBegun> {
    let a = account.as_str();
    let sessions_ended = t
        .execute(
            "DELETE FROM sessions WHERE token_hash IN (SELECT key_hash FROM account_keys WHERE account = $1) \
             OR token_hash IN (SELECT token_hash FROM portal_links WHERE account = $1)",
            &[&a],
        )
        .await
        .db()?;
    // Its portal links go at once: the sessions they opened find them no more.
    t.execute("DELETE FROM portal_links WHERE account = $1", &[&a])
        .await
        .db()?;
    let keys_revoked = t
        .execute("DELETE FROM account_keys WHERE account = $1", &[&a])
        .await
        .db()?;
    let endpoints_disabled = t
        .execute(
            "UPDATE endpoints SET enabled = false, disabled_reason = $2, updated_at = $3 \
             WHERE account = $1 AND enabled AND deleted_at IS NULL",
            &[&a, &ERASING, &t.now.as_millis()],
        )
        .await
        .db()?;
    Ok(ErasureBegun {
        keys_revoked,
        sessions_ended,
        endpoints_disabled,
    })
}

/// After the deliveries ([`DELIVERIES`]), one statement per kind of row,
/// each at most `$2` rows of account `$1`, in an order that leaves nothing
/// pointing at a removed row: the attempt log, the tallies and the events
/// left without deliveries once the account has none, its endpoints once
/// it has no delivery and the endpoint no attempt, then the rest. `$3` is
/// the erasure's own task kind: a task of it that runs (the erasure's own)
/// is kept, any other (one planted with a delay) goes.
const BATCH: &[&str] = &[
    "DELETE FROM attempts WHERE id IN (SELECT a.id FROM endpoints e CROSS JOIN LATERAL \
     (SELECT x.id FROM attempts x WHERE x.endpoint_id = e.id LIMIT $2) a WHERE e.account = $1 LIMIT $2)",
    "DELETE FROM attempt_rollup WHERE ctid = ANY(ARRAY(SELECT r.ctid FROM endpoints e \
     JOIN attempt_rollup r ON r.endpoint_id = e.id WHERE e.account = $1 LIMIT $2))",
    "DELETE FROM delivery_tallies WHERE account = $1 \
     AND NOT EXISTS (SELECT 1 FROM deliveries WHERE account = $1)",
    "DELETE FROM events WHERE id IN (SELECT e.id FROM events e WHERE e.account = $1 \
     AND NOT EXISTS (SELECT 1 FROM deliveries WHERE account = $1) LIMIT $2)",
    "WITH e AS (SELECT id FROM endpoints e WHERE e.account = $1 \
       AND NOT EXISTS (SELECT 1 FROM deliveries WHERE account = $1) \
       AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.endpoint_id = e.id) \
       AND NOT EXISTS (SELECT 1 FROM attempt_rollup r WHERE r.endpoint_id = e.id) LIMIT $2), \
     c AS (DELETE FROM circuits c USING e WHERE c.endpoint_id = e.id), \
     fl AS (DELETE FROM endpoint_flow fl USING e WHERE fl.endpoint_id = e.id) \
     DELETE FROM endpoints x USING e WHERE x.id = e.id",
    "DELETE FROM event_types WHERE (account, name) IN \
     (SELECT account, name FROM event_types WHERE account = $1 LIMIT $2)",
    "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts WHERE account = $1 LIMIT $2)",
    "DELETE FROM usage_counters WHERE (account, metric, window_start) IN \
     (SELECT account, metric, window_start FROM usage_counters WHERE account = $1 LIMIT $2)",
    "DELETE FROM tasks WHERE (account, id) IN \
     (SELECT account, id FROM tasks WHERE account = $1 AND NOT (kind = $3 AND state = 'leased') LIMIT $2)",
    "DELETE FROM account_keys WHERE id IN (SELECT id FROM account_keys WHERE account = $1 LIMIT $2)",
    "DELETE FROM portal_links WHERE id IN (SELECT id FROM portal_links WHERE account = $1 LIMIT $2)",
];

/// Up to `$2` deliveries of account `$1`, newest first, live and finished
/// (the tallies taken down as they go); returns the events they named.
const DELIVERIES: &str = "WITH d AS (SELECT id, account, endpoint_id, seq FROM deliveries \
     WHERE account = $1 ORDER BY seq DESC LIMIT $2), \
     q AS (DELETE FROM delivery_queue q USING d WHERE q.endpoint_id = d.endpoint_id AND q.seq = d.seq), \
     f AS (DELETE FROM delivery_done f USING d WHERE f.delivery_id = d.id RETURNING d.account, f.state), \
     tally AS (INSERT INTO delivery_tallies (account, state, n) \
       SELECT account, state, -count(*) FROM f GROUP BY account, state) \
     DELETE FROM deliveries x USING d WHERE x.id = d.id RETURNING x.event_id";

/// The events among `$1` that no delivery names any more: those of the
/// deliveries a batch removed, so the events go at the pace of their
/// deliveries instead of being searched for among the account's events.
const THEIR_EVENTS: &str = "DELETE FROM events e WHERE e.id = ANY($1) \
     AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)";

/// One batch in the caller's transaction: the deliveries and their events,
/// then [`BATCH`]; the rows removed.
pub(crate) async fn batch(t: &Tx<'_>, account: &AccountId, batch: PurgeBatch) -> StoreResult<u64> {
    let (a, n) = (account.as_str(), i64::from(batch.rows()));
    let events: Vec<uuid::Uuid> = t
        .query(DELIVERIES, &[&a, &n])
        .await
        .db()?
        .iter()
        .map(|r| r.col(0))
        .collect::<StoreResult<_>>()?;
    let mut removed = events.len() as u64;
    removed += t.execute(THEIR_EVENTS, &[&events]).await.db()?;
    // The account's idempotency records (ADR 0043): the scopes of its keys
    // and of the admin's requests on its routes.
    removed += t
        .execute(
            "DELETE FROM idempotency WHERE (scope, key) IN (SELECT scope, key FROM idempotency \
             WHERE starts_with(scope, $1) LIMIT $2)",
            &[&idempotency_account_prefix(account), &n],
        )
        .await
        .db()?;
    for sql in BATCH {
        let all: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&a, &n, &ERASE_TASK];
        // Each statement takes the parameters it names.
        let arity = (1..=3)
            .filter(|i| sql.contains(&format!("${i}")))
            .max()
            .unwrap_or(0);
        removed += t.execute(*sql, &all[..arity]).await.db()?;
    }
    Ok(removed)
}

#[async_trait]
impl ErasureStore for PostgresStore {
    async fn account_erase_begin(&self, account: &AccountId) -> StoreResult<ErasureBegun> {
        in_tx!(self, |t| begin(&t, account))
    }

    async fn account_erase_batch(&self, account: &AccountId, rows: PurgeBatch) -> StoreResult<u64> {
        in_tx!(self, |t| batch(&t, account, rows))
    }
}
