//! The append-only attempt log.

use async_trait::async_trait;
use control_plane_core::AttemptDraft;
use control_plane_core::{
    rollup_minute, AccountId, AttemptLogStore, AttemptQuery, AttemptRecord, AttemptResult,
    AttemptStats, DeliveryId, EndpointId, EndpointKey, Page, RollupRow, StoreError, StoreResult,
    Timestamp, LATENCY_BUCKETS,
};
use control_plane_store_kit::columns::ATTEMPT_COLS;
use duckdb::{params, Row};

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::{list, RowExt};

fn row_to_attempt(r: &Row<'_>) -> duckdb::Result<AttemptRecord> {
    Ok(AttemptRecord {
        id: r.get(0)?,
        delivery_id: r.col(1)?,
        endpoint_id: r.col(2)?,
        account: r.col(3)?,
        attempt: r.get(4)?,
        result: r.col(5)?,
        status_code: r.get(6)?,
        error: r.get(7)?,
        latency_ms: r.get(8)?,
        will_retry: r.get(9)?,
        next_attempt_at: r.col(10)?,
        recorded_at: r.col(11)?,
        response_body: r.get(12)?,
    })
}

/// What [`ensure_owned`] checks of an endpoint: its name in the error, and
/// the statement that counts it in the account.
const ENDPOINTS: (&str, &str) = (
    "endpoint",
    "SELECT count(*) FROM endpoints WHERE id = $1 AND account = $2",
);
/// What [`ensure_owned`] checks of a delivery.
const DELIVERIES: (&str, &str) = (
    "delivery",
    "SELECT count(*) FROM deliveries WHERE id = $1 AND account = $2",
);

/// Attempt-log rows gathered during one transaction and written by one
/// statement.
#[derive(Default)]
pub(crate) struct AttemptRows {
    id: Vec<i64>,
    delivery: Vec<String>,
    endpoint: Vec<String>,
    account: Vec<String>,
    attempt: Vec<i64>,
    result: Vec<&'static str>,
    status_code: Vec<Option<i64>>,
    error: Vec<Option<String>>,
    latency_ms: Vec<i64>,
    will_retry: Vec<bool>,
    next_attempt_at: Vec<Option<i64>>,
    response_body: Vec<Option<String>>,
    /// What the rollup counts of each row: endpoint, result, latency.
    counted: Vec<(EndpointId, AttemptResult, u64)>,
}

impl AttemptRows {
    /// Adds a row; its log position is taken now, so positions follow the
    /// order of the calls.
    pub(crate) fn push(
        &mut self,
        t: &mut Tx<'_>,
        delivery: DeliveryId,
        endpoint: EndpointId,
        account: &AccountId,
        attempt: u32,
        a: &AttemptDraft,
    ) {
        self.id.push(t.next_attempt_id());
        self.delivery.push(delivery.to_string());
        self.endpoint.push(endpoint.to_string());
        self.account.push(account.as_str().to_string());
        self.attempt.push(i64::from(attempt));
        self.result.push(a.result.as_str());
        self.status_code.push(a.status_code.map(i64::from));
        self.error.push(a.error.clone());
        self.latency_ms
            .push(i64::try_from(a.latency_ms).unwrap_or(i64::MAX));
        self.will_retry.push(a.will_retry);
        self.next_attempt_at
            .push(a.next_attempt_at.map(Timestamp::as_millis));
        self.response_body.push(a.response_body.clone());
        self.counted.push((endpoint, a.result, a.latency_ms));
    }

    /// Writes the gathered rows, and their rollup deltas (ADR 0032).
    pub(crate) fn write(self, t: &Tx<'_>) -> StoreResult<()> {
        if self.id.is_empty() {
            return Ok(());
        }
        let now = t.now;
        let counted = self.counted.iter().map(|(e, r, ms)| (*e, now, *r, *ms));
        write_rollup(t, RollupRow::of(counted))?;
        t.execute(
            &format!(
                "INSERT INTO attempts ({ATTEMPT_COLS}) SELECT unnest($1::BIGINT[]), unnest($2::VARCHAR[]), \
                 unnest($3::VARCHAR[]), unnest($4::VARCHAR[]), unnest($5::BIGINT[]), unnest($6::VARCHAR[]), \
                 unnest($7::VARCHAR[])::BIGINT, unnest($8::VARCHAR[]), unnest($9::BIGINT[]), \
                 unnest($10::BOOLEAN[]), unnest($11::VARCHAR[])::BIGINT, $12::BIGINT, unnest($13::VARCHAR[])"
            ),
            params![
                list::of(self.id),
                list::text(self.delivery),
                list::text(self.endpoint),
                list::text(self.account),
                list::of(self.attempt),
                list::text(self.result),
                list::nullable_ints(self.status_code),
                list::of(self.error),
                list::of(self.latency_ms),
                list::of(self.will_retry),
                list::nullable_ints(self.next_attempt_at),
                t.now.as_millis(),
                list::of(self.response_body)
            ],
        )
        .db()?;
        Ok(())
    }
}

/// Appends rollup rows: one statement.
pub(crate) fn write_rollup(t: &Tx<'_>, rows: Vec<RollupRow>) -> StoreResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    t.execute(
        "INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n) \
         SELECT unnest($1::VARCHAR[]), unnest($2::BIGINT[]), unnest($3::VARCHAR[]), \
         unnest($4::BIGINT[]), unnest($5::BIGINT[])",
        params![
            list::text(rows.iter().map(|r| r.endpoint_id)),
            list::of(rows.iter().map(|r| r.minute)),
            list::text(rows.iter().map(|r| r.result.as_str())),
            list::of(rows.iter().map(|r| i64::from(r.bucket))),
            list::of(rows.iter().map(|r| r.n)),
        ],
    )
    .db()?;
    Ok(())
}

pub(crate) fn list_for_delivery(
    t: &Tx<'_>,
    account: &AccountId,
    id: DeliveryId,
) -> StoreResult<Vec<AttemptRecord>> {
    ensure_owned(t, account, DELIVERIES, id.to_string())?;
    let mut st = t
        .prepare(&format!(
            "SELECT {ATTEMPT_COLS} FROM attempts WHERE delivery_id = $1 ORDER BY id"
        ))
        .db()?;
    let rows = st.query_map(params![id.to_string()], row_to_attempt).db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

pub(crate) fn search(t: &Tx<'_>, q: &AttemptQuery) -> StoreResult<Page<AttemptRecord>> {
    if let Some(e) = q.endpoint {
        ensure_owned(t, &q.account, ENDPOINTS, e.to_string())?;
    }
    // Bound in the order `AttemptQuery::sql` numbers them.
    let mut values: Vec<duckdb::types::Value> = vec![q.account.as_str().to_string().into()];
    if let Some(e) = q.endpoint {
        values.push(e.to_string().into());
    }
    if let Some(r) = q.result {
        values.push(r.as_str().to_string().into());
    }
    if let Some(s) = q.status_code {
        values.push(i64::from(s).into());
    }
    if let Some(at) = q.since {
        values.push(at.as_millis().into());
    }
    if let Some(at) = q.until {
        values.push(at.as_millis().into());
    }
    if let Some(after) = q.page.after() {
        values.push(after.into());
    }
    values.push((i64::from(q.page.limit()) + 1).into());
    let mut st = t.prepare(&q.sql(ATTEMPT_COLS)).db()?;
    let rows = st
        .query_map(duckdb::params_from_iter(values), row_to_attempt)
        .db()?;
    let items = rows.collect::<Result<Vec<_>, _>>().db()?;
    Ok(Page::from_overfetch(items, q.page.limit(), |a| a.id))
}

/// `NotFound` unless `id` is an endpoint of `account` (deleted ones count).
/// `NotFound` (as `what`) unless `count` ([`ENDPOINTS`], [`DELIVERIES`])
/// finds row `id` in `account`.
fn ensure_owned(
    t: &Tx<'_>,
    account: &AccountId,
    (what, count): (&'static str, &str),
    id: String,
) -> StoreResult<()> {
    let known: i64 = t
        .query_row(count, params![id, account.as_str()], |r| r.get(0))
        .db()?;
    if known == 0 {
        return Err(StoreError::not_found(what, id));
    }
    Ok(())
}

pub(crate) fn stats(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    since: Timestamp,
) -> StoreResult<AttemptStats> {
    ensure_owned(t, account, ENDPOINTS, id.to_string())?;
    let mut st = t
        .prepare(
            "SELECT result, bucket, sum(n)::BIGINT FROM attempt_rollup \
             WHERE endpoint_id = $1 AND minute >= $2 GROUP BY result, bucket",
        )
        .db()?;
    let rows = st
        .query_map(params![id.to_string(), rollup_minute(since)], |r| {
            Ok((
                r.col::<AttemptResult>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .db()?;
    let mut counts = Vec::new();
    for row in rows {
        let (result, bucket, n) = row.db()?;
        counts.push((
            result,
            i16::try_from(bucket).unwrap_or(LATENCY_BUCKETS - 1),
            u64::try_from(n).unwrap_or(0),
        ));
    }
    Ok(AttemptStats::from_rollup(counts))
}

/// The rollup of every endpoint of `account` (deleted ones included) since
/// the minute of `since`, one row per key.
pub(crate) fn rollup_of_account(
    t: &Tx<'_>,
    account: &AccountId,
    since: Timestamp,
) -> StoreResult<Vec<RollupRow>> {
    rollup_rows(
        t,
        &format!(
            "{ROLLUP_SUM} WHERE endpoint_id IN (SELECT id FROM endpoints WHERE account = $1) \
             AND minute >= $2 {ROLLUP_BY_KEY}"
        ),
        params![account.as_str(), rollup_minute(since)],
    )
}

/// The start and the end of a read of rollup rows summed per key, in key
/// order, around its `WHERE`.
pub(crate) const ROLLUP_SUM: &str =
    "SELECT endpoint_id, minute, result, bucket, sum(n)::BIGINT FROM attempt_rollup";
pub(crate) const ROLLUP_BY_KEY: &str = "GROUP BY endpoint_id, minute, result, bucket \
     ORDER BY endpoint_id, minute, result, bucket";

/// The rollup rows of `sql` ([`ROLLUP_SUM`] … [`ROLLUP_BY_KEY`]).
pub(crate) fn rollup_rows<P: duckdb::Params>(
    t: &Tx<'_>,
    sql: &str,
    params: P,
) -> StoreResult<Vec<RollupRow>> {
    let mut st = t.prepare(sql).db()?;
    let rows = st
        .query_map(params, |r| {
            Ok(RollupRow {
                endpoint_id: r.col(0)?,
                minute: r.get(1)?,
                result: r.col(2)?,
                bucket: i16::try_from(r.get::<_, i64>(3)?).unwrap_or(LATENCY_BUCKETS - 1),
                n: r.get(4)?,
            })
        })
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

#[async_trait]
impl AttemptLogStore for EmbeddedStore {
    async fn attempt_list_for_delivery(
        &self,
        account: &AccountId,
        id: DeliveryId,
    ) -> StoreResult<Vec<AttemptRecord>> {
        let account = account.clone();
        self.tx(move |t| list_for_delivery(t, &account, id)).await
    }

    async fn attempt_search(&self, query: AttemptQuery) -> StoreResult<Page<AttemptRecord>> {
        self.tx(move |t| search(t, &query)).await
    }

    async fn attempt_stats(
        &self,
        endpoint: EndpointKey<'_>,
        since: Timestamp,
    ) -> StoreResult<AttemptStats> {
        let (account, id) = (endpoint.account, endpoint.id);
        let account = account.clone();
        self.tx(move |t| stats(t, &account, id, since)).await
    }

    async fn attempt_rollup_of_account(
        &self,
        account: &AccountId,
        since: Timestamp,
    ) -> StoreResult<Vec<RollupRow>> {
        let account = account.clone();
        self.tx(move |t| rollup_of_account(t, &account, since))
            .await
    }
}
