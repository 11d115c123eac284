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

    /// A `VARCHAR[]` with NULLs.
    pub(crate) fn opt_text(items: impl IntoIterator<Item = Option<String>>) -> Value {
        Value::List(
            items
                .into_iter()
                .map(|s| s.map_or(Value::Null, Value::Text))
                .collect(),
        )
    }

    /// A `BIGINT[]`.
    pub(crate) fn int(items: impl IntoIterator<Item = i64>) -> Value {
        Value::List(items.into_iter().map(Value::BigInt).collect())
    }

    /// A `BIGINT[]` with NULLs.
    pub(crate) fn opt_int(items: impl IntoIterator<Item = Option<i64>>) -> Value {
        Value::List(
            items
                .into_iter()
                .map(|v| v.map_or(Value::Null, Value::BigInt))
                .collect(),
        )
    }

    /// A `BOOLEAN[]`.
    pub(crate) fn bool(items: impl IntoIterator<Item = bool>) -> Value {
        Value::List(items.into_iter().map(Value::Boolean).collect())
    }
}
