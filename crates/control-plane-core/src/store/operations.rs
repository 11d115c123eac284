//! Usage, alerts, account keys, dashboard sessions, portal links and
//! maintenance.

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AccountId, AccountKey, Alert, Checked, DashboardSession, ErasureBegun, KeyHash, KeyId, Page,
    PageRequest, PortalLink, PortalLinkCreateRequest, PortalLinkId, PurgeBatch, PurgeReport,
    SessionCreateRequest, StoreResult, TimeRange, Timestamp, UsageBatch, UsageRow,
};

/// Per-account usage counters.
#[async_trait]
pub trait UsageStore: Send + Sync {
    /// Records a batch in one transaction; `false` when this batch id was
    /// already recorded (nothing changes).
    ///
    /// # Behavior
    /// - Idempotent by batch id; totals by hour window
    ///   (`usage_batches_are_idempotent_and_queryable_by_window`).
    ///
    /// The batch id (1 to 255 characters) was checked when the batch was
    /// sealed ([`crate::Check::checked`]).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn usage_record(&self, batch: Checked<UsageBatch>) -> StoreResult<bool>;

    /// Totals of `account` in the windows starting in `[from, to)`, by window then metric.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn usage_query(
        &self,
        account: &AccountId,
        range: TimeRange,
    ) -> StoreResult<Vec<UsageRow>>;
}

/// Operational alerts.
#[async_trait]
pub trait AlertStore: Send + Sync {
    /// Alerts of `account`, newest first.
    ///
    /// # Behavior
    /// - `circuit.opened`, `circuit.closed`, `endpoint.disabled` and
    ///   `delivery.dead` are recorded in the transaction of the transition
    ///   that caused them (`alerts_are_recorded_with_their_transitions`).
    /// - They are published as events, in the same transaction, to the
    ///   account's endpoints that name the alert type, never to the endpoint
    ///   concerned or to catch-all endpoints
    ///   (`alerts_are_published_to_endpoints_that_subscribe_by_name`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>>;
}

/// Account API keys, stored by hash.
#[async_trait]
pub trait AccountKeyStore: Send + Sync {
    /// Stores a new key of `account` by the hash of its secret (the caller
    /// hashes; the secret itself is never stored).
    ///
    /// # Behavior
    /// - A stored hash finds its account; an unknown or revoked one finds
    ///   nothing (`account_keys_are_found_by_hash_and_revoked`).
    ///
    /// # Errors
    /// `Conflict` when the hash is already stored (the hash itself was
    /// checked when it was built, [`KeyHash::new`]).
    ///
    /// # Cancellation safety
    /// A cancelled call may or may not have stored the key.
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &KeyHash,
    ) -> StoreResult<AccountKey>;

    /// The key whose hash is `key_hash`, if stored and not revoked.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>>;

    /// Revokes a key of `account`.
    ///
    /// # Behavior
    /// - Its idempotency records ([`crate::IdempotencyOwner::Key`]) go with
    ///   it, so it replays nothing; the account's other keys keep theirs
    ///   (`revoking_a_key_drops_its_idempotency_records`).
    ///
    /// # Errors
    /// `NotFound`, also for another account's key.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn account_key_revoke(&self, account: &AccountId, id: KeyId) -> StoreResult<()>;
}

/// Dashboard sessions (ADR 0021).
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Stores a new session.
    ///
    /// # Behavior
    /// - A stored session is found by its id's hash until it expires or is
    ///   ended; then it is found no more, and retention removes it
    ///   (`a_session_lives_until_it_expires_or_ends`).
    ///
    /// # Errors
    /// `Conflict` when the id hash is already stored.
    ///
    /// # Cancellation safety
    /// A cancelled call may or may not have stored the session.
    async fn session_create(&self, req: SessionCreateRequest) -> StoreResult<DashboardSession>;

    /// The live session whose id hashes to `id_hash`: `None` when it is
    /// unknown, ended or expired (by the store's clock).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn session_get(&self, id_hash: &str) -> StoreResult<Option<DashboardSession>>;

    /// Ends a session (sign-out). Ending an unknown or ended one is `Ok`.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn session_end(&self, id_hash: &str) -> StoreResult<()>;

    /// Moves a live session's expiry to `until` (the dashboard's idle
    /// expiry); `false` when the session is unknown, ended or expired, which
    /// it never revives.
    ///
    /// # Behavior
    /// - An extended session outlives its first expiry; an expired one stays
    ///   gone (`a_session_is_extended_listed_and_revoked`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn session_extend(&self, id_hash: &str, until: Timestamp) -> StoreResult<bool>;

    /// The live sessions, newest first, at most [`MAX_SESSIONS_LISTED`].
    ///
    /// # Cancellation safety
    /// Safe.
    async fn session_list(&self) -> StoreResult<Vec<DashboardSession>>;
}

/// The most sessions [`SessionStore::session_list`] answers.
pub const MAX_SESSIONS_LISTED: i64 = 1000;

/// Portal links (ADR 0049): one-time sign-ins to a consumer view of an
/// account, stored by the hash of their token.
#[async_trait]
pub trait PortalStore: Send + Sync {
    /// Stores a new link.
    ///
    /// # Behavior
    /// - A new link is listed with its account's, newest first, and never
    ///   with another account's (`portal_links_are_listed_and_revoked_per_account`).
    ///
    /// # Errors
    /// `Conflict` when the token hash is already stored.
    ///
    /// # Cancellation safety
    /// A cancelled call may or may not have stored the link.
    async fn portal_link_create(&self, req: PortalLinkCreateRequest) -> StoreResult<PortalLink>;

    /// The links of `account` that have not expired (revoked ones too, with
    /// their revocation), newest first, at most
    /// [`crate::MAX_PORTAL_LINKS_LISTED`].
    ///
    /// # Cancellation safety
    /// Safe.
    async fn portal_link_list(&self, account: &AccountId) -> StoreResult<Vec<PortalLink>>;

    /// Revokes a link of `account`: it opens nothing more, and
    /// [`PortalStore::portal_link_find`] finds it no more, so the sessions
    /// it opened end. Revoking a revoked link is `Ok`.
    ///
    /// # Behavior
    /// - Another account's link is not found and stays as it was
    ///   (`portal_links_are_listed_and_revoked_per_account`).
    ///
    /// # Errors
    /// `NotFound`, also for another account's link.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn portal_link_revoke(&self, account: &AccountId, id: PortalLinkId) -> StoreResult<()>;

    /// Redeems the link whose token hashes to `token_hash`, once: the one
    /// caller that marks it redeemed gets it; a redeemed, revoked, expired or
    /// unknown link gives `None`.
    ///
    /// # Behavior
    /// - Of many concurrent redemptions exactly one gets the link, and no
    ///   later one does (`a_portal_link_is_redeemed_once`).
    /// - A revoked or expired link is not redeemed
    ///   (`a_portal_link_is_found_until_revoked_or_expired`).
    ///
    /// # Cancellation safety
    /// A cancelled call may have redeemed the link.
    async fn portal_link_redeem(&self, token_hash: &str) -> StoreResult<Option<PortalLink>>;

    /// The link whose token hashes to `token_hash` while it holds (redeemed
    /// or not; not revoked, not expired by the store's clock): what a portal
    /// session checks at every request.
    ///
    /// # Behavior
    /// - Found until it is revoked or expires, then never again
    ///   (`a_portal_link_is_found_until_revoked_or_expired`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn portal_link_find(&self, token_hash: &str) -> StoreResult<Option<PortalLink>>;
}

/// Retention.
#[async_trait]
pub trait MaintenanceStore: Send + Sync {
    /// Removes one small batch (at most `batch` rows per table) of finished
    /// history older than `retention`: delivered deliveries, dead deliveries
    /// of deleted endpoints, attempt-log rows, events left without
    /// deliveries, completed tasks, alerts, usage
    /// windows (and their batch ids), expired idempotency records, expired
    /// dashboard sessions and expired portal links.
    ///
    /// # Behavior
    /// - Only old delivered history goes; live deliveries stay
    ///   (`maintenance_purges_old_history_in_batches`).
    /// - An old event goes once no delivery refers to it; one with a pending
    ///   or dead delivery stays (`retention_purges_events_left_without_deliveries`).
    /// - A dead delivery stays for replay while its endpoint exists, and goes
    ///   once the endpoint is deleted and it is older than `retention`
    ///   (`retention_purges_dead_deliveries_of_deleted_endpoints`).
    /// - Old completed tasks go; pending, leased and dead ones stay
    ///   (`retention_purges_completed_tasks_only`).
    /// - Old alerts go (`retention_purges_old_alerts`).
    /// - Usage windows that ended before the cutoff go, with the batch ids
    ///   recorded before it (`retention_purges_ended_usage_windows`).
    /// - Expired idempotency records go (`idempotency_records_expire_and_are_swept`).
    /// - A rotated-out signing secret is cleared once its grace has ended
    ///   (`a_rotated_out_secret_is_cleared_after_its_grace`).
    /// - Expired portal links go
    ///   (`portal_links_are_listed_and_revoked_per_account`).
    /// - `maintenance::run_maintenance` runs it on one replica per interval,
    ///   on a tick (`maintenance_runs_on_a_single_flight_tick`).
    ///
    /// The batch size (1 to 10,000) was checked when it was built
    /// ([`PurgeBatch::new`]).
    ///
    /// # Cancellation safety
    /// Safe: each batch commits on its own.
    async fn maintenance_purge(
        &self,
        retention: Duration,
        batch: PurgeBatch,
    ) -> StoreResult<PurgeReport>;
}

/// Erasing an account (the use case: `control_plane_runtime::erase`; the
/// task that runs it: `control-plane.erase`, [`crate::ERASE_TASK`]).
#[async_trait]
pub trait ErasureStore: Send + Sync {
    /// The start of an erasure of `account` : its
    /// dashboard sessions signed in with its keys or opened by its portal
    /// links end, its keys and portal links are removed
    /// and its endpoints disabled, in one transaction, so that from its
    /// commit nothing more is accepted from the account's keys or links or
    /// sent to its endpoints. Running it again is harmless.
    ///
    /// # Behavior
    /// - Keys stop working and endpoints stop being claimed at once
    ///   (`erasing_an_account_removes_its_rows_and_no_others`).
    ///
    /// # Cancellation safety
    /// Safe: one transaction.
    async fn account_erase_begin(&self, account: &AccountId) -> StoreResult<ErasureBegun>;

    /// Removes one batch of `account`'s rows, at most `batch` rows per
    /// table: attempts, their rollups, deliveries, events without
    /// deliveries, endpoints without deliveries, event types, alerts,
    /// usage windows, tasks (except a running, leased one of kind
    /// [`crate::ERASE_TASK`]: the erasure's own), keys, portal links, and the idempotency
    /// records whose scope is the account's ([`crate::idempotency_account_prefix`]);
    /// how many it removed, `0` once nothing is left.
    ///
    /// # Behavior
    /// - Batches end with nothing of the account left but its erasure task,
    ///   and every other account's rows untouched
    ///   (`erasing_an_account_removes_its_rows_and_no_others`).
    ///
    /// # Cancellation safety
    /// Safe: each batch commits on its own.
    async fn account_erase_batch(&self, account: &AccountId, batch: PurgeBatch)
        -> StoreResult<u64>;
}
