//! Column helpers shared by the area modules.

use control_plane_core::{
    DeliveryId, EndpointId, EventId, KeyId, LeaseToken, StoreError, StoreResult, Timestamp,
};
use duckdb::types::Type;
use duckdb::Row;
use uuid::Uuid;

/// A type read from one column of a row: ids from their UUID text, times
/// from epoch milliseconds, names parsed into their enums and checked
/// newtypes. A value that does not convert is an error naming the column.
pub(crate) trait Column: Sized {
    /// Column `i` of `r` as `Self`.
    fn read(r: &Row<'_>, i: usize) -> duckdb::Result<Self>;
}

/// Typed reads of a row's columns.
pub(crate) trait RowExt {
    /// Column `i` as `T`.
    fn col<T: Column>(&self, i: usize) -> duckdb::Result<T>;
}

impl RowExt for Row<'_> {
    fn col<T: Column>(&self, i: usize) -> duckdb::Result<T> {
        T::read(self, i)
    }
}

/// Column `i` failed to convert: the error, with the column.
pub(crate) fn conversion<E: std::error::Error + Send + Sync + 'static>(
    i: usize,
    e: E,
) -> duckdb::Error {
    duckdb::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e))
}

/// Types made from what DuckDB reads (`$from`), also when `NULL` is allowed
/// (`Option<$t>`).
macro_rules! mapped_columns {
    ($($t:ty: $from:ty => $make:expr;)+) => {$(
        impl Column for $t {
            fn read(r: &Row<'_>, i: usize) -> duckdb::Result<Self> {
                let make: fn($from) -> StoreResult<$t> = $make;
                make(r.get::<_, $from>(i)?).map_err(|e| conversion(i, e))
            }
        }

        impl Column for Option<$t> {
            fn read(r: &Row<'_>, i: usize) -> duckdb::Result<Self> {
                let make: fn($from) -> StoreResult<$t> = $make;
                r.get::<_, Option<$from>>(i)?
                    .map(make)
                    .transpose()
                    .map_err(|e| conversion(i, e))
            }
        }
    )+};
}

/// A stored UUID's text as a UUID.
fn uuid(s: String) -> StoreResult<Uuid> {
    Uuid::parse_str(&s).map_err(|e| StoreError::Backend(format!("a stored id {s:?}: {e}")))
}

mapped_columns! {
    Uuid: String => uuid;
    DeliveryId: String => |s| uuid(s).map(DeliveryId);
    EndpointId: String => |s| uuid(s).map(EndpointId);
    EventId: String => |s| uuid(s).map(EventId);
    LeaseToken: String => |s| uuid(s).map(LeaseToken);
    KeyId: String => |s| uuid(s).map(KeyId);
    Timestamp: i64 => |v| Ok(Timestamp::from_millis(v));
}

control_plane_store_kit::text_columns!(mapped_columns);

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
    ///
    /// Its elements must have the type the statement casts the parameter to
    /// (`i64` for `BIGINT[]`): DuckDB plans a cached statement again at every
    /// execution whose parameter has another type than it was planned with
    /// (measured: twice the time of the execution). A list of nothing but
    /// NULLs binds as `VARCHAR[]`, so nullable numbers go as
    /// [`nullable_ints`] instead.
    ///
    /// Only inserts of parameters are planned once at all: a statement that
    /// reads a table is planned at every execution, and so is one that uses
    /// a placeholder twice (each use gets its own `$n`; the architecture
    /// test `embedded_inserts_use_each_placeholder_once` checks the inserts).
    pub(crate) fn of<T: Into<Value>>(items: impl IntoIterator<Item = T>) -> Value {
        Value::List(items.into_iter().map(Into::into).collect())
    }

    /// Nullable numbers as a `VARCHAR[]`, for `unnest($n::VARCHAR[])::BIGINT`:
    /// the same parameter type whether or not every element is NULL (see
    /// [`of`]).
    pub(crate) fn nullable_ints(items: impl IntoIterator<Item = Option<i64>>) -> Value {
        Value::List(
            items
                .into_iter()
                .map(|n| n.map_or(Value::Null, |n| Value::Text(n.to_string())))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use control_plane_core::DeliveryState;

    /// A stored id that is not a UUID, a `NULL` where a value must be, and a
    /// stored name that no longer parses are errors naming the column.
    #[test]
    fn a_column_that_does_not_convert_is_an_error_naming_it() {
        let db = duckdb::Connection::open_in_memory().unwrap();
        let read =
            |sql: &str, f: &dyn Fn(&Row<'_>) -> duckdb::Result<()>| db.query_row(sql, [], |r| f(r));
        let failed_at = |e: duckdb::Error| match e {
            duckdb::Error::FromSqlConversionFailure(i, _, _) => i,
            duckdb::Error::InvalidColumnType(i, _, _) => i,
            other => panic!("not a conversion error: {other:?}"),
        };
        let sql = "SELECT 'x' AS a, 'not-a-uuid' AS id, 'lost' AS state, NULL::BIGINT AS due_at";
        let e = read(sql, &|r| r.col::<DeliveryId>(1).map(|_| ())).unwrap_err();
        assert_eq!(failed_at(e), 1);
        let e = read(sql, &|r| r.col::<DeliveryState>(2).map(|_| ())).unwrap_err();
        assert_eq!(failed_at(e), 2);
        assert!(read(sql, &|r| r.col::<Timestamp>(3).map(|_| ())).is_err());
        read(sql, &|r| {
            assert_eq!(r.col::<Option<Timestamp>>(3)?, None);
            Ok(())
        })
        .unwrap();
        let id = Uuid::now_v7();
        let ok = "SELECT $1, 'dead', 1700000000000::BIGINT";
        db.query_row(ok, [id.to_string()], |r| {
            assert_eq!(r.col::<DeliveryId>(0)?, DeliveryId(id));
            assert_eq!(r.col::<DeliveryState>(1)?, DeliveryState::Dead);
            assert_eq!(
                r.col::<Timestamp>(2)?,
                Timestamp::from_millis(1_700_000_000_000)
            );
            Ok(())
        })
        .unwrap();
    }
}
