//! Request idempotency, ticks, usage, alerts and maintenance.

use std::time::Duration;

use control_plane_core::clock::duration_millis;
use control_plane_core::{
    fenced, validate_short_text, AccountId, AccountKey, Alert, AlertKind, DeliveryId, EndpointId,
    IdempotencyBegin, IdempotencyRecord, IdempotencyToken, KeyId, LeaseToken, Page, PageRequest,
    PurgeReport, StoreError, StoreResult, StoredResponse, TickLease, Timestamp, UsageBatch,
    UsageRow,
};
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use crate::error::PgResultExt;

pub(crate) async fn idempotency_begin(
    tx: &Transaction<'_>,
    now: Timestamp,
    scope: &str,
    key: &str,
    request_hash: &str,
    ttl: Duration,
) -> StoreResult<IdempotencyBegin> {
    validate_short_text("idempotency scope", scope)?;
    validate_short_text("idempotency key", key)?;
    let token = Uuid::new_v4();
    let started = tx
        .query_opt(
            "INSERT INTO idempotency (scope, key, request_hash, state, token, expires_at) \
             VALUES ($1, $2, $3, 'in_progress', $4, $5) \
             ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'in_progress', \
               token = EXCLUDED.token, status = NULL, body = NULL, expires_at = EXCLUDED.expires_at \
             WHERE idempotency.expires_at <= $6 RETURNING token",
            &[&scope, &key, &request_hash, &token, &now.plus(ttl).as_millis(), &now.as_millis()],
        )
        .await
        .db()?;
    if started.is_some() {
        return Ok(IdempotencyBegin::Started(IdempotencyToken {
            scope: scope.to_string(),
            key: key.to_string(),
            token: LeaseToken(token),
        }));
    }
    let row = tx
        .query_one("SELECT request_hash, state, status, body FROM idempotency WHERE scope = $1 AND key = $2", &[&scope, &key])
        .await
        .db()?;
    let record = IdempotencyRecord {
        request_hash: row.get(0),
        state: row.get(1),
        status: row.get(2),
        body: row.get(3),
    };
    Ok(record.verdict(request_hash))
}

pub(crate) async fn idempotency_complete(
    tx: &Transaction<'_>,
    t: &IdempotencyToken,
    r: StoredResponse,
) -> StoreResult<()> {
    let n = tx
        .execute(
            "UPDATE idempotency SET state = 'completed', status = $1, body = $2 \
             WHERE scope = $3 AND key = $4 AND token = $5 AND state = 'in_progress'",
            &[&i64::from(r.status), &r.body, &t.scope, &t.key, &t.token.0],
        )
        .await
        .db()?;
    fenced(n)
}

pub(crate) async fn idempotency_abandon(
    tx: &Transaction<'_>,
    t: &IdempotencyToken,
) -> StoreResult<()> {
    let n = tx
        .execute(
            "DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'",
            &[&t.scope, &t.key, &t.token.0],
        )
        .await
        .db()?;
    fenced(n)
}

pub(crate) async fn tick_claim(
    tx: &Transaction<'_>,
    now: Timestamp,
    name: &str,
    lease_for: Duration,
    every: Duration,
) -> StoreResult<Option<TickLease>> {
    validate_short_text("tick name", name)?;
    let token = Uuid::new_v4();
    let expires = now.plus(lease_for);
    let row = tx
        .query_opt(
            "INSERT INTO ticks (name, token, lease_expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, lease_expires_at = EXCLUDED.lease_expires_at \
             WHERE (ticks.token IS NULL OR ticks.lease_expires_at <= $4) \
               AND (ticks.last_completed_at IS NULL OR ticks.last_completed_at + $5 <= $4) \
             RETURNING state",
            &[&name, &token, &expires.as_millis(), &now.as_millis(), &duration_millis(every)],
        )
        .await
        .db()?;
    Ok(row.map(|r| TickLease {
        name: name.to_string(),
        token: LeaseToken(token),
        state: r.get(0),
        expires_at: expires,
    }))
}

pub(crate) async fn tick_complete(
    tx: &Transaction<'_>,
    now: Timestamp,
    lease: &TickLease,
    state: serde_json::Value,
) -> StoreResult<()> {
    let n = tx
        .execute(
            "UPDATE ticks SET token = NULL, lease_expires_at = NULL, state = $1, last_completed_at = $2 \
             WHERE name = $3 AND token = $4",
            &[&state, &now.as_millis(), &lease.name, &lease.token.0],
        )
        .await
        .db()?;
    fenced(n)
}

pub(crate) async fn usage_record(
    tx: &Transaction<'_>,
    now: Timestamp,
    batch: UsageBatch,
) -> StoreResult<bool> {
    validate_short_text("usage batch id", &batch.batch_id)?;
    let fresh = tx
        .query_opt(
            "INSERT INTO usage_batches (batch_id, recorded_at) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING batch_id",
            &[&batch.batch_id, &now.as_millis()],
        )
        .await
        .db()?;
    if fresh.is_none() {
        return Ok(false);
    }
    // One write per counter row, however many entries the batch holds.
    for (account, metric, window, amount) in batch.totals() {
        let (account, metric, window) = (account.as_str(), metric.as_str(), window.as_millis());
        tx.execute(
            "INSERT INTO usage_counters (account, metric, window_start, amount) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (account, metric, window_start) DO UPDATE SET amount = usage_counters.amount + EXCLUDED.amount",
            &[&account, &metric, &window, &amount],
        )
        .await
        .db()?;
    }
    Ok(true)
}

pub(crate) async fn usage_query(
    tx: &Transaction<'_>,
    account: &AccountId,
    from: Timestamp,
    to: Timestamp,
) -> StoreResult<Vec<UsageRow>> {
    let rows = tx
        .query(
            "SELECT metric, window_start, amount FROM usage_counters \
             WHERE account = $1 AND window_start >= $2 AND window_start < $3 ORDER BY window_start, metric",
            &[&account.as_str(), &from.as_millis(), &to.as_millis()],
        )
        .await
        .db()?;
    let mut out: Vec<UsageRow> = rows
        .iter()
        .map(|r| {
            Ok(UsageRow {
                metric: r.get::<_, String>(0).parse()?,
                window_start: Timestamp::from_millis(r.get(1)),
                amount: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            })
        })
        .collect::<StoreResult<_>>()?;
    out.sort_by_key(|r| (r.window_start, r.metric));
    Ok(out)
}

pub(crate) async fn alert_insert(
    tx: &Transaction<'_>,
    now: Timestamp,
    account: &AccountId,
    kind: AlertKind,
    endpoint: EndpointId,
    delivery: Option<DeliveryId>,
    message: &str,
) -> StoreResult<()> {
    tx.execute(
        "INSERT INTO alerts (account, kind, endpoint_id, delivery_id, message, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        &[&account.as_str(), &kind.as_str(), &endpoint.0, &delivery.map(|d| d.0), &message, &now.as_millis()],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn alert_list(
    tx: &Transaction<'_>,
    account: &AccountId,
    page: PageRequest,
) -> StoreResult<Page<Alert>> {
    page.validate()?;
    let rows = tx
        .query(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
            &[&account.as_str(), &page.after, &(i64::from(page.limit) + 1)],
        )
        .await
        .db()?;
    let items = rows
        .iter()
        .map(|r| {
            Ok(Alert {
                id: r.get(0),
                account: AccountId::new(r.get::<_, String>(1))?,
                kind: r.get::<_, String>(2).parse()?,
                endpoint_id: EndpointId(r.get(3)),
                delivery_id: r.get::<_, Option<Uuid>>(4).map(DeliveryId),
                message: r.get(5),
                created_at: Timestamp::from_millis(r.get(6)),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, page.limit, |a| a.id))
}

/// One batch per table, each its own short autocommit statement.
pub(crate) async fn purge(
    client: &Client,
    now: Timestamp,
    retention: Duration,
    batch: u32,
) -> StoreResult<PurgeReport> {
    control_plane_core::maintenance::validate_purge_batch(batch)?;
    let cutoff = now.minus(retention).as_millis();
    let n = i64::from(batch);
    let deliveries = client
        .execute(
            "WITH c AS (SELECT id FROM deliveries WHERE state = 'delivered' AND updated_at <= $1 \
                        ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM deliveries d USING c WHERE d.id = c.id",
            &[&cutoff, &n],
        )
        .await
        .db()?;
    let attempts = client
        .execute(
            "WITH c AS (SELECT id FROM attempts WHERE recorded_at <= $1 ORDER BY recorded_at, id LIMIT $2) \
             DELETE FROM attempts a USING c WHERE a.id = c.id",
            &[&cutoff, &n],
        )
        .await
        .db()?;
    let idempotency_records = client
        .execute(
            "WITH c AS (SELECT scope, key FROM idempotency WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM idempotency i USING c WHERE i.scope = c.scope AND i.key = c.key",
            &[&now.as_millis(), &n],
        )
        .await
        .db()?;
    Ok(PurgeReport {
        deliveries,
        attempts,
        idempotency_records,
    })
}

fn row_to_key(r: &tokio_postgres::Row) -> StoreResult<AccountKey> {
    Ok(AccountKey {
        id: KeyId(r.get(0)),
        account: AccountId::new(r.get::<_, String>(1))?,
        created_at: Timestamp::from_millis(r.get(2)),
    })
}

pub(crate) async fn account_key_create(
    tx: &Transaction<'_>,
    now: Timestamp,
    account: &AccountId,
    key_hash: &str,
) -> StoreResult<AccountKey> {
    validate_short_text("key hash", key_hash)?;
    let id = KeyId::new();
    let row = tx
        .query_opt(
            "INSERT INTO account_keys (id, account, key_hash, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key_hash) DO NOTHING RETURNING id, account, created_at",
            &[&id.0, &account.as_str(), &key_hash, &now.as_millis()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::Conflict("this key hash is already stored".into()))?;
    row_to_key(&row)
}

pub(crate) async fn account_key_find(
    tx: &Transaction<'_>,
    key_hash: &str,
) -> StoreResult<Option<AccountKey>> {
    tx.query_opt(
        "SELECT id, account, created_at FROM account_keys WHERE key_hash = $1",
        &[&key_hash],
    )
    .await
    .db()?
    .as_ref()
    .map(row_to_key)
    .transpose()
}

pub(crate) async fn account_key_revoke(
    tx: &Transaction<'_>,
    account: &AccountId,
    id: KeyId,
) -> StoreResult<()> {
    let n = tx
        .execute(
            "DELETE FROM account_keys WHERE id = $1 AND account = $2",
            &[&id.0, &account.as_str()],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("account key", id));
    }
    Ok(())
}
