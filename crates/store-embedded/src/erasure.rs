//! Erasure of an account (`control_plane_core::ErasureStore`): the start that
//! shuts its doors, and the batches that remove its rows, keeping the
//! writer's caches in step.

use std::collections::HashMap;

use async_trait::async_trait;
use control_plane_core::{
    idempotency_account_prefix, AccountId, DeliveryState, ErasureBegun, ErasureStore, PurgeBatch,
    StoreResult, ERASE_TASK, ERASING,
};
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};
use crate::util::RowExt;

/// Ends the sessions signed in with the account's keys or opened by its
/// portal links, revokes the keys and the links, and disables its
/// endpoints.
pub(crate) fn begin(t: &mut Tx<'_>, account: &AccountId) -> StoreResult<ErasureBegun> {
    let a = account.as_str();
    let sessions_ended = t
        .execute(
            "DELETE FROM sessions WHERE token_hash IN (SELECT key_hash FROM account_keys WHERE account = $1) \
             OR token_hash IN (SELECT token_hash FROM portal_links WHERE account = $1)",
            params![a],
        )
        .db()?;
    // Its portal links go at once: the sessions they opened find them no more.
    t.execute("DELETE FROM portal_links WHERE account = $1", params![a])
        .db()?;
    let keys_revoked = t
        .execute("DELETE FROM account_keys WHERE account = $1", params![a])
        .db()?;
    let endpoints_disabled = t
        .execute(
            "UPDATE endpoints SET enabled = false, disabled_reason = $2, updated_at = $3 \
             WHERE account = $1 AND enabled AND deleted_at IS NULL",
            params![a, ERASING, t.now.as_millis()],
        )
        .db()?;
    if endpoints_disabled > 0 {
        t.senders.clear();
    }
    Ok(ErasureBegun {
        keys_revoked: keys_revoked as u64,
        sessions_ended: sessions_ended as u64,
        endpoints_disabled: endpoints_disabled as u64,
    })
}

/// The statements of a batch after the deliveries' ([`deliveries`]), each
/// at most `$2` rows of account `$1`, in an order that leaves nothing
/// pointing at a removed row: the events left once the account has no
/// delivery (those of removed deliveries went with them, [`deliveries`]),
/// endpoints once the account has no delivery and the endpoint no attempt.
/// `$3` is the erasure's own task kind, kept.
const REST: &[&str] = &[
    "DELETE FROM events WHERE id IN (SELECT e.id FROM events e WHERE e.account = $1 \
     AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.account = $1) LIMIT $2)",
    "DELETE FROM endpoints WHERE id IN (SELECT e.id FROM endpoints e WHERE e.account = $1 \
     AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.account = $1) \
     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.endpoint_id = e.id) \
     AND NOT EXISTS (SELECT 1 FROM attempt_rollup r WHERE r.endpoint_id = e.id) LIMIT $2)",
    "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts WHERE account = $1 LIMIT $2)",
    "DELETE FROM usage_counters WHERE (account, metric, window_start) IN \
     (SELECT (account, metric, window_start) FROM usage_counters WHERE account = $1 LIMIT $2)",
    "DELETE FROM tasks WHERE (account, id) IN \
     (SELECT (account, id) FROM tasks WHERE account = $1 AND NOT (kind = $3 AND state = 'leased') LIMIT $2)",
    "DELETE FROM account_keys WHERE id IN (SELECT id FROM account_keys WHERE account = $1 LIMIT $2)",
    "DELETE FROM portal_links WHERE id IN (SELECT id FROM portal_links WHERE account = $1 LIMIT $2)",
];

/// One batch in the writer's transaction; the rows removed.
pub(crate) fn batch(t: &mut Tx<'_>, account: &AccountId, batch: PurgeBatch) -> StoreResult<u64> {
    let (a, n) = (account.as_str(), i64::from(batch.rows()));
    let mut removed = t
        .execute(
            "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE account = $1 LIMIT $2)",
            params![a, n],
        )
        .db()? as u64;
    removed += t
        .execute(
            "DELETE FROM attempt_rollup WHERE rowid IN (SELECT r.rowid FROM attempt_rollup r \
             JOIN endpoints e ON e.id = r.endpoint_id WHERE e.account = $1 LIMIT $2)",
            params![a, n],
        )
        .db()? as u64;
    removed += deliveries(t, account, n)?;
    // The account's idempotency records (ADR 0043): the scopes of its keys
    // and of the admin's requests on its routes.
    removed += t
        .execute(
            "DELETE FROM idempotency WHERE (scope, key) IN (SELECT (scope, key) FROM idempotency \
             WHERE starts_with(scope, $1) LIMIT $2)",
            params![idempotency_account_prefix(account), n],
        )
        .db()? as u64;
    for sql in REST {
        let k = if sql.contains("$3") {
            t.execute(sql, params![a, n, ERASE_TASK])
        } else {
            t.execute(sql, params![a, n])
        };
        removed += k.db()? as u64;
    }
    removed += event_types(t, account, n)?;
    if removed > 0 {
        // Endpoints may have gone: fan-out and claims read them again.
        t.fan_out.forget(account);
        t.senders.clear();
    }
    Ok(removed)
}

/// Deletes up to `n` deliveries of `account`, their dead letters too, and
/// the events they named that no delivery names any more (so events go at
/// the pace of their deliveries, not searched for among the account's),
/// and takes them off the writer's finished tally and live index.
fn deliveries(t: &mut Tx<'_>, account: &AccountId, n: i64) -> StoreResult<u64> {
    let mut gone: HashMap<DeliveryState, u64> = HashMap::new();
    let (mut dead, mut events) = (Vec::new(), Vec::new());
    {
        let mut st = t
            .prepare(
                "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE account = $1 LIMIT $2) \
                 RETURNING state, seq, event_id",
            )
            .db()?;
        let mut rows = st.query(params![account.as_str(), n]).db()?;
        while let Some(r) = rows.next().db()? {
            let state: DeliveryState = r.col(0).db()?;
            if state == DeliveryState::Dead {
                dead.push(r.get(1).db()?);
            }
            events.push(r.get::<_, String>(2).db()?);
            *gone.entry(state).or_default() += 1;
        }
    }
    crate::delivery::dead_letters::dead_letters_remove(t, &dead)?;
    let mut total = if events.is_empty() {
        0
    } else {
        t.execute(
            "DELETE FROM events e WHERE e.id IN (SELECT unnest($1::VARCHAR[])) \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)",
            params![crate::util::list::text(events)],
        )
        .db()? as u64
    };
    for (state, k) in gone {
        if !state.is_final() {
            t.live_mut().forget();
        }
        t.finished_mut().removed(account, state, k);
        total += k;
    }
    Ok(total)
}

/// Deletes up to `n` event types of `account`, and forgets their schemas.
fn event_types(t: &mut Tx<'_>, account: &AccountId, n: i64) -> StoreResult<u64> {
    let names: Vec<String> = {
        let mut st = t
            .prepare(
                "DELETE FROM event_types WHERE (account, name) IN \
                 (SELECT (account, name) FROM event_types WHERE account = $1 LIMIT $2) RETURNING name",
            )
            .db()?;
        let rows = st
            .query_map(params![account.as_str(), n], |r| r.get::<_, String>(0))
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    for name in &names {
        t.schemas.forget(account, name);
    }
    Ok(names.len() as u64)
}

#[async_trait]
impl ErasureStore for EmbeddedStore {
    async fn account_erase_begin(&self, account: &AccountId) -> StoreResult<ErasureBegun> {
        let account = account.clone();
        self.work_tx(move |t| begin(t, &account)).await
    }

    async fn account_erase_batch(&self, account: &AccountId, rows: PurgeBatch) -> StoreResult<u64> {
        let account = account.clone();
        self.work_tx(move |t| batch(t, &account, rows)).await
    }
}
