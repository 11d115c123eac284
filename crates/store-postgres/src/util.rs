//! Column conversions shared by the area modules.

use control_plane_core::Timestamp;

pub(crate) fn ts_opt(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp::from_millis)
}

pub(crate) fn u32_of(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}
