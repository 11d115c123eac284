//! The append-only attempt log.

use async_trait::async_trait;
use control_plane_core::AttemptDraft;
use control_plane_core::{
    rollup_bucket, rollup_minute, AccountId, AttemptLogStore, AttemptQuery, AttemptRecord,
    AttemptResult, AttemptStats, DeliveryId, EndpointId, EndpointKey, Page, RollupRow, StoreError,
    StoreResult, Timestamp,
};
use tokio_postgres::Row;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};
use crate::util::RowExt;
use control_plane_store_kit::columns::ATTEMPT_COLS;

fn row_to_attempt(r: &Row) -> StoreResult<AttemptRecord> {
    Ok(AttemptRecord {
        id: r.col(0)?,
        delivery_id: r.col(1)?,
        endpoint_id: r.col(2)?,
        account: r.col(3)?,
        attempt: r.col(4)?,
        result: r.col(5)?,
        status_code: r.col::<Option<i64>>(6)?.and_then(|c| u16::try_from(c).ok()),
        error: r.col(7)?,
        latency_ms: r.col(8)?,
        will_retry: r.col(9)?,
        next_attempt_at: r.col(10)?,
        recorded_at: r.col(11)?,
        response_body: r.col(12)?,
    })
}

/// What [`ensure_owned`] checks of an endpoint: its name in the error, and
/// the statement that finds it in the account.
const ENDPOINTS: (&str, &str) = (
    "endpoint",
    "SELECT 1 FROM endpoints WHERE id = $1 AND account = $2",
);
/// What [`ensure_owned`] checks of a delivery.
const DELIVERIES: (&str, &str) = (
    "delivery",
    "SELECT 1 FROM deliveries WHERE id = $1 AND account = $2",
);

pub(crate) async fn insert(
    t: &Tx<'_>,
    delivery: DeliveryId,
    endpoint: EndpointId,
    account: &AccountId,
    attempt: u32,
    a: &AttemptDraft,
) -> StoreResult<()> {
    let bucket = rollup_bucket(a.result, a.latency_ms);
    // The attempt row and its rollup delta in one statement (ADR 0032).
    t.execute(
        "WITH a AS (INSERT INTO attempts (delivery_id, endpoint_id, account, attempt, result, status_code, error, \
         latency_ms, will_retry, next_attempt_at, recorded_at, response_body) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)) \
         INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) VALUES ($2, $13, $5, $14, 1)",
        &[
            &delivery.0,
            &endpoint.0,
            &account.as_str(),
            &i64::from(attempt),
            &a.result.as_str(),
            &a.status_code.map(i64::from),
            &a.error,
            &i64::try_from(a.latency_ms).unwrap_or(i64::MAX),
            &a.will_retry,
            &a.next_attempt_at.map(Timestamp::as_millis),
            &t.now.as_millis(),
            &a.response_body,
            &rollup_minute(t.now),
            &bucket,
        ],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn list_for_delivery(
    t: &Tx<'_>,
    account: &AccountId,
    id: DeliveryId,
) -> StoreResult<Vec<AttemptRecord>> {
    ensure_owned(t, account, DELIVERIES, id.0).await?;
    let rows = t
        .query(
            &format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE delivery_id = $1 ORDER BY id"),
            &[&id.0],
        )
        .await
        .db()?;
    rows.iter().map(row_to_attempt).collect()
}

pub(crate) async fn search(t: &Tx<'_>, q: &AttemptQuery) -> StoreResult<Page<AttemptRecord>> {
    if let Some(e) = q.endpoint {
        ensure_owned(t, &q.account, ENDPOINTS, e.0).await?;
    }
    let account = q.account.as_str();
    let endpoint = q.endpoint.map(|e| e.0);
    let result = q.result.map(|r| r.as_str());
    let status = q.status_code.map(i64::from);
    let (since, until) = (
        q.since.map(|t| t.as_millis()),
        q.until.map(|t| t.as_millis()),
    );
    let after = q.page.after();
    let limit = i64::from(q.page.limit()) + 1;
    // Bound in the order `AttemptQuery::sql` numbers them.
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&account];
    if let Some(v) = &endpoint {
        params.push(v);
    }
    if let Some(v) = &result {
        params.push(v);
    }
    if let Some(v) = &status {
        params.push(v);
    }
    if let Some(v) = &since {
        params.push(v);
    }
    if let Some(v) = &until {
        params.push(v);
    }
    if let Some(v) = &after {
        params.push(v);
    }
    params.push(&limit);
    let rows = t.query(&q.sql(ATTEMPT_COLS), &params).await.db()?;
    let items = rows
        .iter()
        .map(row_to_attempt)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, q.page.limit(), |a| a.id))
}

/// `NotFound` unless `id` is an endpoint of `account` (deleted ones count).
/// `NotFound` (as `what`) unless `find` ([`ENDPOINTS`], [`DELIVERIES`])
/// finds row `id` in `account`.
async fn ensure_owned(
    t: &Tx<'_>,
    account: &AccountId,
    (what, find): (&'static str, &str),
    id: uuid::Uuid,
) -> StoreResult<()> {
    let known = t.query_opt(find, &[&id, &account.as_str()]).await.db()?;
    if known.is_none() {
        return Err(StoreError::not_found(what, id));
    }
    Ok(())
}

pub(crate) async fn stats(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    since: Timestamp,
) -> StoreResult<AttemptStats> {
    ensure_owned(t, account, ENDPOINTS, id.0).await?;
    let rows = t
        .query(
            "SELECT result, bucket, sum(n)::bigint FROM attempt_rollup \
             WHERE endpoint_id = $1 AND minute >= $2 GROUP BY result, bucket",
            &[&id.0, &rollup_minute(since)],
        )
        .await
        .db()?;
    let counts = rows
        .iter()
        .map(|r| Ok((r.col(0)?, r.col(1)?, r.col(2)?)))
        .collect::<StoreResult<Vec<(AttemptResult, i16, u64)>>>()?;
    Ok(AttemptStats::from_rollup(counts))
}

/// The rollup of every endpoint of `account` (deleted ones included) since
/// the minute of `since`, one row per key.
async fn rollup_of_account(
    t: &Tx<'_>,
    account: &AccountId,
    since: Timestamp,
) -> StoreResult<Vec<RollupRow>> {
    let rows = t
        .query(
            "SELECT r.endpoint_id, r.minute, r.result, r.bucket, sum(r.n)::bigint FROM attempt_rollup r \
             JOIN endpoints e ON e.id = r.endpoint_id \
             WHERE e.account = $1 AND r.minute >= $2 \
             GROUP BY r.endpoint_id, r.minute, r.result, r.bucket \
             ORDER BY r.endpoint_id, r.minute, r.result, r.bucket",
            &[&account.as_str(), &rollup_minute(since)],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| {
            Ok(RollupRow {
                endpoint_id: r.col(0)?,
                minute: r.col(1)?,
                result: r.col(2)?,
                bucket: r.col(3)?,
                n: r.col(4)?,
            })
        })
        .collect()
}

#[async_trait]
impl AttemptLogStore for PostgresStore {
    async fn attempt_list_for_delivery(
        &self,
        account: &AccountId,
        id: DeliveryId,
    ) -> StoreResult<Vec<AttemptRecord>> {
        in_tx!(self, |t| list_for_delivery(&t, account, id))
    }

    async fn attempt_search(&self, query: AttemptQuery) -> StoreResult<Page<AttemptRecord>> {
        in_tx!(self, |t| search(&t, &query))
    }

    async fn attempt_stats(
        &self,
        endpoint: EndpointKey<'_>,
        since: Timestamp,
    ) -> StoreResult<AttemptStats> {
        let (account, id) = (endpoint.account, endpoint.id);
        in_tx!(self, |t| stats(&t, account, id, since))
    }

    async fn attempt_rollup_of_account(
        &self,
        account: &AccountId,
        since: Timestamp,
    ) -> StoreResult<Vec<RollupRow>> {
        in_tx!(self, |t| rollup_of_account(&t, account, since))
    }
}
