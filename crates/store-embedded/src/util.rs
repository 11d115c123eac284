//! Column helpers shared by the area modules.

use control_plane_core::Timestamp;
use duckdb::types::Type;
use duckdb::Row;
use uuid::Uuid;

pub(crate) fn col_uuid(r: &Row<'_>, i: usize) -> duckdb::Result<Uuid> {
    let s: String = r.get(i)?;
    Uuid::parse_str(&s)
        .map_err(|e| duckdb::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e)))
}

pub(crate) fn ts(r: &Row<'_>, i: usize) -> duckdb::Result<Timestamp> {
    r.get::<_, i64>(i).map(Timestamp::from_millis)
}

pub(crate) fn ts_opt(r: &Row<'_>, i: usize) -> duckdb::Result<Option<Timestamp>> {
    Ok(r.get::<_, Option<i64>>(i)?.map(Timestamp::from_millis))
}
