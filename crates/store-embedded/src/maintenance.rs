//! Retention: purging old rows in small batches.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::Purged;
use control_plane_core::{
    rollup_minute, AccountId, DeliveryState, MaintenanceStore, PurgeBatch, PurgeReport,
    StoreResult, ROLLUP_MINUTE_MS,
};
use duckdb::params;

use crate::attempt::{ROLLUP_BY_KEY, ROLLUP_SUM};
use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::RowExt;

/// One statement per kind of row: at most `$2` rows at or before the cutoff
/// `$1`. The deliveries' statements return what they deleted, which the
/// writer's finished tally and the dead letters follow ([`delete_finished`]).
const PURGES: &[(Purged, &str)] = &[
    (
        Purged::Deliveries,
        "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state = 'delivered' \
         AND updated_at <= $1 ORDER BY updated_at LIMIT $2) RETURNING account, state, seq",
    ),
    (
        Purged::Deliveries,
        "DELETE FROM deliveries WHERE id IN (SELECT d.id FROM deliveries d JOIN endpoints e \
         ON e.id = d.endpoint_id WHERE e.deleted_at IS NOT NULL AND d.state = 'dead' \
         AND d.updated_at <= $1 LIMIT $2) RETURNING account, state, seq",
    ),
    (
        Purged::Attempts,
        "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE recorded_at <= $1 \
         ORDER BY recorded_at, id LIMIT $2)",
    ),
    (
        Purged::AttemptRollups,
        "DELETE FROM attempt_rollup WHERE rowid IN (SELECT rowid FROM attempt_rollup WHERE minute <= $1 LIMIT $2)",
    ),
    (
        Purged::Events,
        "DELETE FROM events WHERE id IN (SELECT e.id FROM events e WHERE e.created_at <= $1 \
         AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id) ORDER BY e.created_at LIMIT $2)",
    ),
    (
        Purged::Tasks,
        "DELETE FROM tasks WHERE (account, id) IN (SELECT (account, id) FROM tasks \
         WHERE state = 'completed' AND updated_at <= $1 ORDER BY updated_at LIMIT $2)",
    ),
    (
        Purged::Alerts,
        "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts WHERE created_at <= $1 ORDER BY id LIMIT $2)",
    ),
    (
        Purged::UsageWindows,
        "DELETE FROM usage_counters WHERE (account, metric, window_start) IN \
         (SELECT (account, metric, window_start) FROM usage_counters WHERE window_start <= $1 LIMIT $2)",
    ),
    (
        Purged::UsageBatches,
        "DELETE FROM usage_batches WHERE batch_id IN \
         (SELECT batch_id FROM usage_batches WHERE recorded_at <= $1 LIMIT $2)",
    ),
    (
        Purged::IdempotencyRecords,
        "DELETE FROM idempotency WHERE (scope, key) IN \
         (SELECT (scope, key) FROM idempotency WHERE expires_at <= $1 LIMIT $2)",
    ),
    (
        Purged::PreviousSecrets,
        "UPDATE endpoints SET previous_secret = NULL, previous_expires_at = NULL WHERE id IN \
         (SELECT id FROM endpoints WHERE previous_expires_at <= $1 LIMIT $2)",
    ),
    (
        Purged::Sessions,
        "DELETE FROM sessions WHERE id_hash IN \
         (SELECT id_hash FROM sessions WHERE expires_at <= $1 LIMIT $2)",
    ),
    (
        Purged::PortalLinks,
        "DELETE FROM portal_links WHERE id IN \
         (SELECT id FROM portal_links WHERE expires_at <= $1 LIMIT $2)",
    ),
];

/// Folds the rollup rows of the last ten minutes, where deltas still
/// arrive, into one row per key (ADR 0032), so the stats reads stay short.
/// The writer is the only one, so reading the sums, deleting and inserting
/// them is one step.
fn fold_rollup(t: &Tx<'_>) -> StoreResult<()> {
    let since = rollup_minute(t.now) - 10 * ROLLUP_MINUTE_MS;
    let rows: i64 = t
        .query_row(
            "SELECT count(*) FROM attempt_rollup WHERE minute >= $1",
            params![since],
            |r| r.get(0),
        )
        .db()?;
    let folded = crate::attempt::rollup_rows(
        t,
        &format!("{ROLLUP_SUM} WHERE minute >= $1 {ROLLUP_BY_KEY}"),
        params![since],
    )?;
    // Nothing to fold when every key already has one row.
    if usize::try_from(rows).unwrap_or(0) <= folded.len() {
        return Ok(());
    }
    t.execute(
        "DELETE FROM attempt_rollup WHERE minute >= $1",
        params![since],
    )
    .db()?;
    crate::attempt::write_rollup(t, folded)
}

/// One small batch per table, after the fold. The embedded store has one
/// writer, so the batch bounds how long that writer is busy.
pub(crate) fn purge(
    t: &mut Tx<'_>,
    retention: Duration,
    batch: PurgeBatch,
) -> StoreResult<PurgeReport> {
    fold_rollup(t)?;
    let mut report = PurgeReport::default();
    for (what, sql) in PURGES {
        let (cutoff, rows) = (what.cutoff(t.now, retention), i64::from(batch.rows()));
        let n = match what {
            Purged::Deliveries => delete_finished(t, sql, cutoff, rows)?,
            _ => t.execute(sql, params![cutoff, rows]).db()? as u64,
        };
        report.count(*what, n);
        if matches!(what, Purged::PreviousSecrets) && n > 0 {
            t.senders.clear();
        }
    }
    Ok(report)
}

/// Runs `sql`, a `DELETE ... RETURNING account, state, seq` of finished
/// deliveries (cutoff `$1`, at most `$2` rows), takes what it deleted off
/// the writer's finished tally (which lives in its memory, so the
/// breakdown is counted here) and deletes the dead ones' copies from
/// `dead_letters`; the number of rows deleted.
fn delete_finished(t: &mut Tx<'_>, sql: &str, cutoff: i64, rows: i64) -> StoreResult<u64> {
    let mut gone: HashMap<(AccountId, DeliveryState), u64> = HashMap::new();
    let mut dead = Vec::new();
    {
        let mut st = t.prepare(sql).db()?;
        let mut deleted = st.query(params![cutoff, rows]).db()?;
        while let Some(r) = deleted.next().db()? {
            let state: DeliveryState = r.col(1).db()?;
            if state == DeliveryState::Dead {
                dead.push(r.get(2).db()?);
            }
            *gone.entry((r.col(0).db()?, state)).or_default() += 1;
        }
    }
    crate::delivery::dead_letters::dead_letters_remove(t, &dead)?;
    let mut n = 0;
    for ((account, state), k) in gone {
        t.finished_mut().removed(&account, state, k);
        n += k;
    }
    Ok(n)
}

#[async_trait]
impl MaintenanceStore for EmbeddedStore {
    async fn maintenance_purge(
        &self,
        retention: Duration,
        batch: PurgeBatch,
    ) -> StoreResult<PurgeReport> {
        self.work_tx(move |t| purge(t, retention, batch)).await
    }
}
