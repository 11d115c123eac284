//! Request idempotency, ticks, usage, alerts and maintenance.

use std::time::Duration;

use control_plane_core::clock::duration_millis;
use control_plane_core::{
    fenced, validate_short_text, AccountId, AccountKey, Alert, AlertKind, DeliveryId, EndpointId,
    IdempotencyBegin, IdempotencyRecord, IdempotencyToken, KeyId, LeaseToken, Page, PageRequest,
    PurgeReport, StoreError, StoreResult, StoredResponse, TickLease, UsageBatch, UsageRow,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::Tx;
use crate::util::{col_uuid, ts};

pub(crate) fn idempotency_begin(
    t: &mut Tx<'_>,
    scope: &str,
    key: &str,
    request_hash: &str,
    ttl: Duration,
) -> StoreResult<IdempotencyBegin> {
    validate_short_text("idempotency scope", scope)?;
    validate_short_text("idempotency key", key)?;
    let now = t.now.as_millis();
    let existing = t
        .query_row(
            "SELECT request_hash, state, status, body FROM idempotency WHERE scope = $1 AND key = $2 AND expires_at > $3",
            params![scope, key, now],
            |r| {
                Ok(IdempotencyRecord {
                    request_hash: r.get(0)?,
                    state: r.get(1)?,
                    status: r.get(2)?,
                    body: r.get(3)?,
                })
            },
        )
        .optional()
        .db()?;
    if let Some(record) = existing {
        return Ok(record.verdict(request_hash));
    }
    let token = LeaseToken::new();
    t.execute(
        "DELETE FROM idempotency WHERE scope = $1 AND key = $2",
        params![scope, key],
    )
    .db()?;
    t.execute(
        "INSERT INTO idempotency (scope, key, request_hash, state, token, expires_at) VALUES ($1, $2, $3, 'in_progress', $4, $5)",
        params![scope, key, request_hash, token.to_string(), t.now.plus(ttl).as_millis()],
    )
    .db()?;
    Ok(IdempotencyBegin::Started(IdempotencyToken {
        scope: scope.to_string(),
        key: key.to_string(),
        token,
    }))
}

pub(crate) fn idempotency_complete(
    t: &mut Tx<'_>,
    tok: &IdempotencyToken,
    r: StoredResponse,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE idempotency SET state = 'completed', status = $1, body = $2 \
             WHERE scope = $3 AND key = $4 AND token = $5 AND state = 'in_progress'",
            params![
                i64::from(r.status),
                r.body,
                tok.scope,
                tok.key,
                tok.token.to_string()
            ],
        )
        .db()?;
    fenced(n as u64)
}

pub(crate) fn idempotency_abandon(t: &mut Tx<'_>, tok: &IdempotencyToken) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'",
            params![tok.scope, tok.key, tok.token.to_string()],
        )
        .db()?;
    fenced(n as u64)
}

pub(crate) fn tick_claim(
    t: &mut Tx<'_>,
    name: &str,
    lease_for: Duration,
    every: Duration,
) -> StoreResult<Option<TickLease>> {
    validate_short_text("tick name", name)?;
    let now = t.now.as_millis();
    let row = t
        .query_row(
            "SELECT token, lease_expires_at, state, last_completed_at FROM ticks WHERE name = $1",
            params![name],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            },
        )
        .optional()
        .db()?;
    let token = LeaseToken::new();
    let expires = t.now.plus(lease_for);
    let state = match row {
        None => {
            t.execute(
                "INSERT INTO ticks (name, token, lease_expires_at) VALUES ($1, $2, $3)",
                params![name, token.to_string(), expires.as_millis()],
            )
            .db()?;
            None
        }
        Some((holder, held_until, state, last)) => {
            let held = holder.is_some() && held_until.is_some_and(|e| e > now);
            let early = last.is_some_and(|l| l.saturating_add(duration_millis(every)) > now);
            if held || early {
                return Ok(None);
            }
            t.execute(
                "UPDATE ticks SET token = $1, lease_expires_at = $2 WHERE name = $3",
                params![token.to_string(), expires.as_millis(), name],
            )
            .db()?;
            state
        }
    };
    let state = state
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| StoreError::Backend(format!("stored tick state: {e}")))?;
    Ok(Some(TickLease {
        name: name.to_string(),
        token,
        state,
        expires_at: expires,
    }))
}

pub(crate) fn tick_complete(
    t: &mut Tx<'_>,
    lease: &TickLease,
    state: serde_json::Value,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE ticks SET token = NULL, lease_expires_at = NULL, state = $1, last_completed_at = $2 \
             WHERE name = $3 AND token = $4",
            params![state.to_string(), t.now.as_millis(), lease.name, lease.token.to_string()],
        )
        .db()?;
    fenced(n as u64)
}

pub(crate) fn usage_record(t: &mut Tx<'_>, batch: UsageBatch) -> StoreResult<bool> {
    validate_short_text("usage batch id", &batch.batch_id)?;
    let seen: i64 = t
        .query_row(
            "SELECT count(*) FROM usage_batches WHERE batch_id = $1",
            params![batch.batch_id],
            |r| r.get(0),
        )
        .db()?;
    if seen > 0 {
        return Ok(false);
    }
    t.execute(
        "INSERT INTO usage_batches VALUES ($1, $2)",
        params![batch.batch_id, t.now.as_millis()],
    )
    .db()?;
    for (account, metric, window, amount) in batch.totals() {
        let (account, metric, window) = (account.as_str(), metric.as_str(), window.as_millis());
        let updated = t
            .execute(
                "UPDATE usage_counters SET amount = amount + $1 WHERE account = $2 AND metric = $3 AND window_start = $4",
                params![amount, account, metric, window],
            )
            .db()?;
        if updated == 0 {
            t.execute(
                "INSERT INTO usage_counters VALUES ($1, $2, $3, $4)",
                params![account, metric, window, amount],
            )
            .db()?;
        }
    }
    Ok(true)
}

pub(crate) fn usage_query(
    t: &Tx<'_>,
    account: &AccountId,
    from: control_plane_core::Timestamp,
    to: control_plane_core::Timestamp,
) -> StoreResult<Vec<UsageRow>> {
    let mut st = t
        .prepare(
            "SELECT metric, window_start, amount FROM usage_counters \
             WHERE account = $1 AND window_start >= $2 AND window_start < $3",
        )
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), from.as_millis(), to.as_millis()],
            |r| Ok((r.get::<_, String>(0)?, ts(r, 1)?, r.get::<_, i64>(2)?)),
        )
        .db()?;
    let mut out = Vec::new();
    for row in rows {
        let (metric, window_start, amount) = row.db()?;
        out.push(UsageRow {
            metric: metric.parse()?,
            window_start,
            amount: u64::try_from(amount).unwrap_or(0),
        });
    }
    out.sort_by_key(|r| (r.window_start, r.metric));
    Ok(out)
}

pub(crate) fn alert_insert(
    t: &mut Tx<'_>,
    account: &AccountId,
    kind: AlertKind,
    endpoint: EndpointId,
    delivery: Option<DeliveryId>,
    message: &str,
) -> StoreResult<()> {
    let id = t.next("alert_id");
    t.execute(
        "INSERT INTO alerts VALUES ($1, $2, $3, $4, $5, $6, $7)",
        params![
            id,
            account.as_str(),
            kind.as_str(),
            endpoint.to_string(),
            delivery.map(|d| d.to_string()),
            message,
            t.now.as_millis()
        ],
    )
    .db()?;
    Ok(())
}

pub(crate) fn alert_list(
    t: &Tx<'_>,
    account: &AccountId,
    page: PageRequest,
) -> StoreResult<Page<Alert>> {
    page.validate()?;
    let mut st = t
        .prepare(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::BIGINT IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), page.after, i64::from(page.limit) + 1],
            |r| {
                let delivery: Option<String> = r.get(4)?;
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    col_uuid(r, 3)?,
                    delivery,
                    r.get::<_, String>(5)?,
                    ts(r, 6)?,
                ))
            },
        )
        .db()?;
    let mut items = Vec::new();
    for row in rows {
        let (id, account, kind, endpoint, delivery, message, created_at) = row.db()?;
        items.push(Alert {
            id,
            account: AccountId::new(account)?,
            kind: kind.parse()?,
            endpoint_id: EndpointId(endpoint),
            delivery_id: delivery
                .and_then(|d| uuid::Uuid::parse_str(&d).ok())
                .map(DeliveryId),
            message,
            created_at,
        });
    }
    Ok(Page::from_overfetch(items, page.limit, |a| a.id))
}

/// One small batch per table. The embedded store has one writer, so the
/// batch bounds how long that writer is busy.
pub(crate) fn purge(t: &mut Tx<'_>, retention: Duration, batch: u32) -> StoreResult<PurgeReport> {
    control_plane_core::maintenance::validate_purge_batch(batch)?;
    let cutoff = t.now.minus(retention).as_millis();
    let n = i64::from(batch);
    let deliveries = t
        .execute(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state = 'delivered' \
             AND updated_at <= $1 ORDER BY updated_at LIMIT $2)",
            params![cutoff, n],
        )
        .db()?;
    let attempts = t
        .execute(
            "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE recorded_at <= $1 ORDER BY recorded_at, id LIMIT $2)",
            params![cutoff, n],
        )
        .db()?;
    let idempotency_records = t
        .execute(
            "DELETE FROM idempotency WHERE (scope, key) IN (SELECT (scope, key) FROM idempotency WHERE expires_at <= $1 LIMIT $2)",
            params![t.now.as_millis(), n],
        )
        .db()?;
    Ok(PurgeReport {
        deliveries: deliveries as u64,
        attempts: attempts as u64,
        idempotency_records: idempotency_records as u64,
    })
}

fn row_to_key(r: &duckdb::Row<'_>) -> duckdb::Result<(String, String, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

fn key_from_row((id, account, created_at): (String, String, i64)) -> StoreResult<AccountKey> {
    Ok(AccountKey {
        id: id.parse()?,
        account: AccountId::new(account)?,
        created_at: control_plane_core::Timestamp::from_millis(created_at),
    })
}

pub(crate) fn account_key_create(
    t: &mut Tx<'_>,
    account: &AccountId,
    key_hash: &str,
) -> StoreResult<AccountKey> {
    validate_short_text("key hash", key_hash)?;
    let taken: Option<i64> = t
        .query_row(
            "SELECT 1 FROM account_keys WHERE key_hash = $1",
            params![key_hash],
            |r| r.get(0),
        )
        .optional()
        .db()?;
    if taken.is_some() {
        return Err(StoreError::Conflict(
            "this key hash is already stored".into(),
        ));
    }
    let key = AccountKey {
        id: KeyId::new(),
        account: account.clone(),
        created_at: t.now,
    };
    t.execute(
        "INSERT INTO account_keys (id, account, key_hash, created_at) VALUES ($1, $2, $3, $4)",
        params![
            key.id.to_string(),
            account.as_str(),
            key_hash,
            t.now.as_millis()
        ],
    )
    .db()?;
    Ok(key)
}

pub(crate) fn account_key_find(t: &Tx<'_>, key_hash: &str) -> StoreResult<Option<AccountKey>> {
    t.query_row(
        "SELECT id, account, created_at FROM account_keys WHERE key_hash = $1",
        params![key_hash],
        row_to_key,
    )
    .optional()
    .db()?
    .map(key_from_row)
    .transpose()
}

pub(crate) fn account_key_revoke(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: KeyId,
) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM account_keys WHERE id = $1 AND account = $2",
            params![id.to_string(), account.as_str()],
        )
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("account key", id));
    }
    Ok(())
}
