//! The append-only attempt log.

use control_plane_core::policy::AttemptDraft;
use control_plane_core::{
    AccountId, AttemptRecord, DeliveryId, EndpointId, Page, PageRequest, StoreError, StoreResult,
};
use duckdb::{params, Row};

use crate::error::DuckResultExt;
use crate::store::Tx;
use crate::util::{col_uuid, ts, ts_opt};

const ATTEMPT_COLS: &str =
    "id, delivery_id, endpoint_id, account, attempt, result, status_code, error, \
     latency_ms, will_retry, next_attempt_at, recorded_at";

fn row_to_attempt(r: &Row<'_>) -> duckdb::Result<AttemptRecord> {
    let conv = |i: usize, e: StoreError| {
        duckdb::Error::FromSqlConversionFailure(i, duckdb::types::Type::Text, Box::new(e))
    };
    let account: String = r.get(3)?;
    let result: String = r.get(5)?;
    Ok(AttemptRecord {
        id: r.get(0)?,
        delivery_id: DeliveryId(col_uuid(r, 1)?),
        endpoint_id: EndpointId(col_uuid(r, 2)?),
        account: AccountId::new(account).map_err(|e| conv(3, e))?,
        attempt: r.get(4)?,
        result: result.parse().map_err(|e| conv(5, e))?,
        status_code: r.get(6)?,
        error: r.get(7)?,
        latency_ms: r.get(8)?,
        will_retry: r.get(9)?,
        next_attempt_at: ts_opt(r, 10)?,
        recorded_at: ts(r, 11)?,
    })
}

pub(crate) fn insert(
    t: &mut Tx<'_>,
    delivery: DeliveryId,
    endpoint: EndpointId,
    account: &AccountId,
    attempt: u32,
    a: &AttemptDraft,
) -> StoreResult<()> {
    let id = t.next_attempt_id();
    t.execute(
        &format!("INSERT INTO attempts ({ATTEMPT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"),
        params![
            id,
            delivery.to_string(),
            endpoint.to_string(),
            account.as_str(),
            attempt,
            a.result.as_str(),
            a.status_code,
            a.error,
            i64::try_from(a.latency_ms).unwrap_or(i64::MAX),
            a.will_retry,
            a.next_attempt_at.map(|t| t.as_millis()),
            t.now.as_millis()
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
    crate::delivery::get(t, account, id)?;
    let mut st = t
        .prepare(&format!(
            "SELECT {ATTEMPT_COLS} FROM attempts WHERE delivery_id = $1 ORDER BY id"
        ))
        .db()?;
    let rows = st.query_map(params![id.to_string()], row_to_attempt).db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

pub(crate) fn list_for_endpoint(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    page: PageRequest,
) -> StoreResult<Page<AttemptRecord>> {
    page.validate()?;
    let known: i64 = t
        .query_row(
            "SELECT count(*) FROM endpoints WHERE id = $1 AND account = $2",
            params![id.to_string(), account.as_str()],
            |r| r.get(0),
        )
        .db()?;
    if known == 0 {
        return Err(StoreError::not_found("endpoint", id));
    }
    let mut st = t
        .prepare(&format!(
            "SELECT {ATTEMPT_COLS} FROM attempts WHERE endpoint_id = $1 AND ($2::BIGINT IS NULL OR id < $2) \
             ORDER BY id DESC LIMIT $3"
        ))
        .db()?;
    let rows = st
        .query_map(
            params![id.to_string(), page.after, i64::from(page.limit) + 1],
            row_to_attempt,
        )
        .db()?;
    let items = rows.collect::<Result<Vec<_>, _>>().db()?;
    Ok(Page::from_overfetch(items, page.limit, |a| a.id))
}
