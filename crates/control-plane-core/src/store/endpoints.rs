//! Endpoints: created, read, changed, rotated, enabled and removed.

use async_trait::async_trait;

use crate::{
    AccountId, Checked, Enablement, Endpoint, EndpointCreateRequest, EndpointId, EndpointKey,
    EndpointUpdateRequest, SecretRotation, StoreResult,
};

/// Endpoints: destinations owned by one account.
#[async_trait]
pub trait EndpointStore: Send + Sync {
    /// Creates an endpoint, enabled, with a closed circuit.
    ///
    /// # Behavior
    /// - The stored endpoint reads back equal (`endpoint_create_then_get_round_trips`).
    /// - With a quota ([`crate::EndpointCreateRequest::quota`]), creates that
    ///   race, in any number of processes, make no more live endpoints than
    ///   it; the others are `OverQuota` and write nothing
    ///   (`creates_racing_at_an_endpoint_quota_make_no_more_than_it`).
    /// - Its seal refuses a signing secret outside the one rule of secrets
    ///   ([`crate::signing::validate_signing_secret`];
    ///   `a_signing_secret_is_checked_and_keeps_its_scheme`).
    /// - Its own retry setting ([`crate::EndpointRetry`]) gives its new
    ///   deliveries its attempt limit instead of `StoreOptions::max_attempts`,
    ///   goes with every claim of them, and is changed or removed
    ///   (`Some(None)`) by an update
    ///   (`an_endpoint_retry_schedule_and_attempt_limit_are_its_own`).
    /// - A broker destination ([`crate::Destination`]) is stored and claimed
    ///   exactly as given (`a_broker_destination_is_stored_and_claimed_as_given`).
    ///
    /// # Errors
    /// None of its own: the request was checked when it was sealed
    /// ([`crate::Check::checked`]), which refuses a URL that is not an
    /// absolute `http(s)` URL or a broker's ([`crate::Destination::parse`];
    /// `endpoint_create_rejects_bad_url`).
    ///
    /// # Cancellation safety
    /// Cancelling may or may not create the endpoint.
    async fn endpoint_create(&self, req: Checked<EndpointCreateRequest>) -> StoreResult<Endpoint>;

    /// Reads an endpoint of `account`.
    ///
    /// # Errors
    /// `NotFound` when it does not exist, was deleted, or belongs to another
    /// account (`endpoint_of_another_account_is_not_found`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn endpoint_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint>;

    /// Lists the endpoints of `account`, oldest first.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn endpoint_list(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>>;

    /// Changes the given fields.
    ///
    /// # Behavior
    /// - Fields not given keep their values (`endpoint_update_changes_only_given_fields`).
    /// - A filter is set, changed and removed (`Some(None)`)
    ///   (`endpoint_filters_decide_which_events_fan_out`).
    /// - Custom headers are replaced as a whole; an empty set removes them
    ///   (`custom_headers_are_checked_replaced_and_claimed`).
    /// - OAuth2 client credentials are checked, replaced, removed
    ///   (`Some(None)`), kept by other changes and handed to the claimer
    ///   (`oauth2_credentials_are_checked_replaced_removed_and_claimed`).
    /// - A URL of another origin is `InvalidInput` while custom headers or
    ///   OAuth2 credentials would follow it unasked (the same contract).
    /// - A client certificate and key are checked (PEM, the key the
    ///   certificate's, `https` only), replaced, removed (`Some(None)`),
    ///   kept by other changes, never moved to another origin unasked and
    ///   handed to the claimer
    ///   (`client_certificates_are_checked_replaced_removed_and_claimed`).
    /// - A jq program (checked when built, [`crate::Transform::parse`]) is
    ///   kept by other changes, replaced, removed (`Some(None)`) and handed
    ///   to the claimer as it is at the claim
    ///   (`a_transform_is_checked_kept_replaced_removed_and_claimed`).
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` for a bad URL.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not apply the change.
    async fn endpoint_update(
        &self,
        endpoint: EndpointKey<'_>,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint>;

    /// Replaces the signing secret; the old one keeps signing for `grace`.
    ///
    /// # Behavior
    /// - Both secrets sign until the grace period ends (`rotate_secret_keeps_previous_for_grace`).
    /// - The new secret meets the one rule of secrets and keeps the endpoint's
    ///   scheme ([`crate::signing::check_rotation`]); a refused one changes
    ///   nothing (`a_signing_secret_is_checked_and_keeps_its_scheme`).
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` for a bad secret or another scheme.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not rotate.
    async fn endpoint_rotate_secret(
        &self,
        endpoint: EndpointKey<'_>,
        rotation: SecretRotation,
    ) -> StoreResult<Endpoint>;

    /// Seals the credentials of up to `limit` endpoints (deleted ones
    /// included) that are not sealed under the store's current key: plain
    /// text and values under a previous key are rewritten (ADR 0022).
    /// `control-plane rotate-key` calls it until it answers 0.
    ///
    /// # Behavior
    /// - Secrets read back unchanged, and a store opened with the current key
    ///   alone reads them (`tests/secrets.rs` of each adapter).
    ///
    /// # Errors
    /// `InvalidInput` when the store has no key to seal with; `Unavailable`
    /// for a value sealed under a key the store does not hold.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not rewrite a batch; every value stays readable.
    async fn endpoint_reseal_secrets(&self, limit: u32) -> StoreResult<u64>;

    /// Enables or disables an endpoint.
    ///
    /// # Behavior
    /// - A disabled endpoint's deliveries are held, not dropped, and are claimed
    ///   again once it is enabled (`disabled_endpoint_holds_deliveries_until_enabled`).
    /// - The reason is checked here, by every adapter ([`crate::Enablement::into_row`]);
    ///   a refused one changes nothing (`a_disable_reason_is_checked_by_the_store`).
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` for a reason that is empty, over 500 bytes
    /// or holds NUL.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not apply the change.
    async fn endpoint_set_enabled(
        &self,
        endpoint: EndpointKey<'_>,
        enablement: Enablement,
    ) -> StoreResult<Endpoint>;

    /// Deletes an endpoint and parks its undelivered deliveries as `dead`
    /// ("endpoint removed"); returns how many were parked.
    ///
    /// # Behavior
    /// - Pending and leased deliveries become dead; a lease on them is lost
    ///   (`deleting_endpoint_parks_deliveries_as_dead`).
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not delete; it never deletes half.
    async fn endpoint_delete(&self, account: &AccountId, id: EndpointId) -> StoreResult<u64>;

    /// Disabled endpoints that are not deleted, across accounts (`status`).
    ///
    /// # Behavior
    /// - Counts an endpoint from its disabling to its enabling
    ///   (`disabled_endpoint_holds_deliveries_until_enabled`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn endpoint_count_disabled(&self) -> StoreResult<u64>;
}
