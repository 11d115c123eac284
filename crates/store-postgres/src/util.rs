//! Typed row mapping: a column is read as the type the code wants through
//! [`Column`] (ids from UUIDs, times from epoch milliseconds, counts from
//! `BIGINT`, names parsed into their enums and checked newtypes), with
//! [`RowExt::col`]. A value of another SQL type, or a stored name that no
//! longer parses, is an error naming the column, never a panic.

use control_plane_core::{
    DeliveryId, EndpointId, EventId, KeyId, LeaseToken, StoreError, StoreResult, Timestamp,
};
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;
use uuid::Uuid;

/// A type read from one column of a row.
pub(crate) trait Column: Sized {
    /// Column `i` of `r` as `Self`.
    fn read(r: &Row, i: usize) -> StoreResult<Self>;
}

/// Typed reads of a row's columns.
pub(crate) trait RowExt {
    /// Column `i` as `T`.
    fn col<T: Column>(&self, i: usize) -> StoreResult<T>;
}

impl RowExt for Row {
    fn col<T: Column>(&self, i: usize) -> StoreResult<T> {
        T::read(self, i)
    }
}

/// Column `i` as the driver reads it.
fn raw<'a, T: FromSql<'a>>(r: &'a Row, i: usize) -> StoreResult<T> {
    r.try_get(i).map_err(|e| {
        let name = r.columns().get(i).map_or("?", |c| c.name());
        StoreError::Backend(format!("column {i} ({name}): {e}"))
    })
}

/// Types the driver reads as they are.
macro_rules! driver_columns {
    ($($t:ty),+ $(,)?) => {$(
        impl Column for $t {
            fn read(r: &Row, i: usize) -> StoreResult<Self> {
                raw(r, i)
            }
        }
    )+};
}

driver_columns!(
    String,
    Option<String>,
    i64,
    Option<i64>,
    i32,
    i16,
    bool,
    Option<f64>,
    Uuid,
    Option<Uuid>,
    serde_json::Value,
    Option<serde_json::Value>,
);

/// Types made from what the driver reads (`$from`), also when `NULL` is
/// allowed (`Option<$t>`).
macro_rules! mapped_columns {
    ($($t:ty: $from:ty => $make:expr;)+) => {$(
        impl Column for $t {
            fn read(r: &Row, i: usize) -> StoreResult<Self> {
                let make: fn($from) -> StoreResult<$t> = $make;
                make(raw::<$from>(r, i)?)
            }
        }

        impl Column for Option<$t> {
            fn read(r: &Row, i: usize) -> StoreResult<Self> {
                let make: fn($from) -> StoreResult<$t> = $make;
                raw::<Option<$from>>(r, i)?.map(make).transpose()
            }
        }
    )+};
}

mapped_columns! {
    DeliveryId: Uuid => |v| Ok(DeliveryId(v));
    EndpointId: Uuid => |v| Ok(EndpointId(v));
    EventId: Uuid => |v| Ok(EventId(v));
    LeaseToken: Uuid => |v| Ok(LeaseToken(v));
    KeyId: Uuid => |v| Ok(KeyId(v));
    Timestamp: i64 => |v| Ok(Timestamp::from_millis(v));
    u32: i64 => |v| Ok(u32_of(v));
    u64: i64 => |v| Ok(u64::try_from(v).unwrap_or(0));
}

control_plane_store_kit::text_columns!(mapped_columns);

/// A stored count or limit as `u32`: negative as 0, too large as the most.
pub(crate) fn u32_of(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use control_plane_core::DeliveryState;

    /// A column of an unexpected SQL type, a `NULL` where a value must be,
    /// and a stored name that no longer parses are errors naming the
    /// column: the driver's own `get` would panic on the first two.
    #[tokio::test]
    async fn a_column_that_does_not_convert_is_an_error_naming_it() {
        let (_store, client) = crate::store::tests::open_test_store().await;
        let row = client
            .query_one(
                "SELECT 'not-a-uuid'::text AS id, NULL::bigint AS due_at, 'lost'::text AS state, \
                 gen_random_uuid() AS endpoint_id, 1700000000000::bigint AS created_at, \
                 (-5)::bigint AS attempts",
                &[],
            )
            .await
            .unwrap();
        let err = |e: StoreError| match e {
            StoreError::Backend(m) => m,
            other => panic!("not a backend error: {other:?}"),
        };
        assert!(err(row.col::<DeliveryId>(0).unwrap_err()).contains("column 0 (id)"));
        assert!(err(row.col::<Timestamp>(1).unwrap_err()).contains("column 1 (due_at)"));
        assert_eq!(row.col::<Option<Timestamp>>(1).unwrap(), None);
        assert!(matches!(
            row.col::<DeliveryState>(2),
            Err(StoreError::InvalidInput(m)) if m.contains("lost")
        ));
        let endpoint: EndpointId = row.col(3).unwrap();
        assert_eq!(endpoint.0, row.col::<Uuid>(3).unwrap());
        assert_eq!(
            row.col::<Timestamp>(4).unwrap(),
            Timestamp::from_millis(1_700_000_000_000)
        );
        assert_eq!(row.col::<u32>(5).unwrap(), 0, "a negative count reads as 0");
    }
}
