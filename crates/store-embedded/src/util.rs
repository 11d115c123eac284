//! Column helpers shared by the area modules.

use control_plane_core::{LeaseToken, Timestamp};
use duckdb::types::Type;
use duckdb::Row;
use uuid::Uuid;

pub(crate) fn col_uuid(r: &Row<'_>, i: usize) -> duckdb::Result<Uuid> {
    let s: String = r.get(i)?;
    Uuid::parse_str(&s)
        .map_err(|e| duckdb::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e)))
}

/// A stored lease token (`NULL`: none).
pub(crate) fn token_opt(r: &Row<'_>, i: usize) -> duckdb::Result<Option<LeaseToken>> {
    r.get::<_, Option<String>>(i)?
        .map(|s| {
            Uuid::parse_str(&s)
                .map(LeaseToken)
                .map_err(|e| duckdb::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e)))
        })
        .transpose()
}

pub(crate) fn ts(r: &Row<'_>, i: usize) -> duckdb::Result<Timestamp> {
    r.get::<_, i64>(i).map(Timestamp::from_millis)
}

pub(crate) fn ts_opt(r: &Row<'_>, i: usize) -> duckdb::Result<Option<Timestamp>> {
    Ok(r.get::<_, Option<i64>>(i)?.map(Timestamp::from_millis))
}

/// List parameters: a batch is bound as one list per column and expanded
/// with `unnest` in SQL, so one statement writes or reads the whole batch.
pub(crate) mod list {
    use duckdb::types::Value;

    /// A `VARCHAR[]`.
    pub(crate) fn text<S: ToString>(items: impl IntoIterator<Item = S>) -> Value {
        Value::List(
            items
                .into_iter()
                .map(|s| Value::Text(s.to_string()))
                .collect(),
        )
    }

    /// A list of numbers, booleans or text, where `None` is NULL
    /// (`BIGINT[]`, `BOOLEAN[]`, `VARCHAR[]`).
    pub(crate) fn of<T: Into<Value>>(items: impl IntoIterator<Item = T>) -> Value {
        Value::List(items.into_iter().map(Into::into).collect())
    }
}
