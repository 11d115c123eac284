//! Retention: purging old rows in small batches.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::Purged;
use control_plane_core::{
    rollup_minute, MaintenanceStore, PurgeBatch, PurgeReport, StoreResult, Timestamp,
    ROLLUP_MINUTE_MS,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

/// One statement per kind of row: at most `$2` rows at or before the cutoff
/// `$1`, skipping rows another transaction holds where live work may.
const PURGES: &[(Purged, &str)] = &[
    (
        Purged::Deliveries,
        "WITH c AS (SELECT delivery_id FROM delivery_done WHERE state = 'delivered' AND finished_at <= $1 \
                    LIMIT $2 FOR UPDATE SKIP LOCKED), \
         x AS (DELETE FROM delivery_done x USING c WHERE x.delivery_id = c.delivery_id \
                RETURNING x.delivery_id, x.state), \
         tally AS (INSERT INTO delivery_tallies (account, state, n) \
                   SELECT d.account, x.state, -count(*) FROM x JOIN deliveries d ON d.id = x.delivery_id \
                   GROUP BY d.account, x.state) \
         DELETE FROM deliveries d USING x WHERE d.id = x.delivery_id",
    ),
    (
        Purged::Deliveries,
        "WITH c AS (SELECT x.delivery_id FROM delivery_done x JOIN deliveries d ON d.id = x.delivery_id \
                    JOIN endpoints e ON e.id = d.endpoint_id \
                    WHERE e.deleted_at IS NOT NULL AND x.state = 'dead' AND x.finished_at <= $1 \
                    LIMIT $2 FOR UPDATE OF x SKIP LOCKED), \
         x AS (DELETE FROM delivery_done x USING c WHERE x.delivery_id = c.delivery_id \
                RETURNING x.delivery_id, x.state), \
         tally AS (INSERT INTO delivery_tallies (account, state, n) \
                   SELECT d.account, x.state, -count(*) FROM x JOIN deliveries d ON d.id = x.delivery_id \
                   GROUP BY d.account, x.state) \
         DELETE FROM deliveries d USING x WHERE d.id = x.delivery_id",
    ),
    (
        Purged::Attempts,
        "DELETE FROM attempts WHERE ctid = ANY(ARRAY(SELECT ctid FROM attempts WHERE recorded_at <= $1 LIMIT $2))",
    ),
    (
        Purged::AttemptRollups,
        "DELETE FROM attempt_rollup WHERE ctid = ANY(ARRAY(SELECT ctid FROM attempt_rollup WHERE minute <= $1 LIMIT $2))",
    ),
    (
        Purged::Events,
        "WITH c AS (SELECT e.id FROM events e WHERE e.created_at <= $1 \
                    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id) \
                    ORDER BY e.created_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM events e USING c WHERE e.id = c.id",
    ),
    (
        Purged::Tasks,
        "WITH c AS (SELECT account, id FROM tasks WHERE state = 'completed' AND updated_at <= $1 \
                    ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM tasks t USING c WHERE t.account = c.account AND t.id = c.id",
    ),
    (
        Purged::Alerts,
        "WITH c AS (SELECT id FROM alerts WHERE created_at <= $1 ORDER BY created_at LIMIT $2) \
         DELETE FROM alerts a USING c WHERE a.id = c.id",
    ),
    (
        Purged::UsageWindows,
        "WITH c AS (SELECT account, metric, window_start FROM usage_counters WHERE window_start <= $1 \
                    ORDER BY window_start LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM usage_counters u USING c \
         WHERE u.account = c.account AND u.metric = c.metric AND u.window_start = c.window_start",
    ),
    (
        Purged::UsageBatches,
        "WITH c AS (SELECT batch_id FROM usage_batches WHERE recorded_at <= $1 ORDER BY recorded_at LIMIT $2) \
         DELETE FROM usage_batches b USING c WHERE b.batch_id = c.batch_id",
    ),
    (
        Purged::IdempotencyRecords,
        "WITH c AS (SELECT scope, key FROM idempotency WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM idempotency i USING c WHERE i.scope = c.scope AND i.key = c.key",
    ),
    (
        Purged::PreviousSecrets,
        "WITH c AS (SELECT id FROM endpoints WHERE previous_expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
         UPDATE endpoints e SET previous_secret = NULL, previous_expires_at = NULL FROM c WHERE e.id = c.id",
    ),
    (
        Purged::Sessions,
        "WITH c AS (SELECT id_hash FROM sessions WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM sessions s USING c WHERE s.id_hash = c.id_hash",
    ),
    (
        Purged::PortalLinks,
        "WITH c AS (SELECT id FROM portal_links WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM portal_links p USING c WHERE p.id = c.id",
    ),
];

/// Folds the delta rows of the tallies and of the last minutes' rollup into
/// one row per key (ADR 0032): the reads that sum them stay short. A fold
/// takes only the keys that have more than one row, so the purge batches
/// after the first of a pass read and write nothing more; it deletes the
/// rows its snapshot sees and inserts their sums in one statement, so a
/// delta appended meanwhile is kept, and two folds at once (two replicas)
/// each fold what the other did not take.
const FOLDS: &[&str] = &[
    "WITH dup AS (SELECT account, state FROM delivery_tallies GROUP BY account, state \
     HAVING count(*) > 1), \
     gone AS (DELETE FROM delivery_tallies t USING dup \
     WHERE t.account = dup.account AND t.state = dup.state RETURNING t.account, t.state, t.n) \
     INSERT INTO delivery_tallies (account, state, n) \
     SELECT account, state, sum(n) FROM gone GROUP BY account, state HAVING sum(n) <> 0",
    "WITH dup AS (SELECT endpoint_id, minute, result, bucket FROM attempt_rollup WHERE minute >= $1 \
     GROUP BY endpoint_id, minute, result, bucket HAVING count(*) > 1), \
     gone AS (DELETE FROM attempt_rollup r USING dup WHERE r.minute >= $1 \
     AND r.endpoint_id = dup.endpoint_id AND r.minute = dup.minute AND r.result = dup.result \
     AND r.bucket = dup.bucket RETURNING r.endpoint_id, r.minute, r.result, r.bucket, r.n) \
     INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
     SELECT endpoint_id, minute, result, bucket, sum(n) FROM gone GROUP BY endpoint_id, minute, result, bucket",
];

/// The rollup minutes a fold takes: the last ten, where deltas still arrive.
fn fold_since(now: Timestamp) -> i64 {
    rollup_minute(now) - 10 * ROLLUP_MINUTE_MS
}

/// One batch per table, in one short transaction, after the folds.
pub(crate) async fn purge(
    t: &Tx<'_>,
    retention: Duration,
    batch: PurgeBatch,
) -> StoreResult<PurgeReport> {
    t.execute(FOLDS[0], &[]).await.db()?;
    t.execute(FOLDS[1], &[&fold_since(t.now)]).await.db()?;
    let n = i64::from(batch.rows());
    let mut report = PurgeReport::default();
    for (what, sql) in PURGES {
        let cutoff = what.cutoff(t.now, retention);
        report.count(*what, t.execute(*sql, &[&cutoff, &n]).await.db()?);
    }
    Ok(report)
}

#[async_trait]
impl MaintenanceStore for PostgresStore {
    async fn maintenance_purge(
        &self,
        retention: Duration,
        batch: PurgeBatch,
    ) -> StoreResult<PurgeReport> {
        in_tx!(self, |t| purge(&t, retention, batch))
    }
}
