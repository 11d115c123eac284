//! Erasure of an account (`DELETE /v1/accounts/{account}`): its keys and
//! dashboard sessions are revoked and its endpoints disabled at once
//! ([`crate::ErasureStore::account_erase_begin`]), then every row it
//! owns goes in bounded batches ([`crate::ErasureStore::account_erase_batch`]),
//! run by `control_plane_runtime::erase` (whose module maps every part of
//! the use case) as a resumable workflow task of
//! kind [`ERASE_TASK`].

use serde::{Deserialize, Serialize};

/// The workflow task kind of an erasure; its task is the one row of the
/// account that the erasure keeps, so that its progress and result stay
/// readable.
pub const ERASE_TASK: &str = "control-plane.erase";

/// The reason an erased account's endpoints are disabled with.
pub const ERASING: &str = "the account is being erased";

/// What the start of an erasure did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureBegun {
    /// Account keys revoked.
    pub keys_revoked: u64,
    /// Dashboard sessions signed in with those keys or opened by the
    /// account's portal links, ended.
    pub sessions_ended: u64,
    /// Endpoints disabled, so that nothing more is sent.
    pub endpoints_disabled: u64,
}

/// How far an erasure has got: the task's progress, and its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasureProgress {
    /// Rows removed so far.
    pub rows_removed: u64,
    /// Batches run so far.
    pub batches: u64,
    /// Whether nothing of the account is left.
    pub done: bool,
}

/// Rows one erasure batch removes at most, per table.
pub const ERASE_BATCH_ROWS: u32 = 1000;
