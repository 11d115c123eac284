//! The port: one narrow trait per area, united in [`ControlPlaneStore`].
//!
//! Every `# Behavior` bullet names the conformance test (in
//! `control-plane-conformance`) that holds it. A time-dependent decision reads
//! the store's injected [`crate::Clock`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Timestamp;
use crate::error::StoreResult;
use crate::policy::Circuit;
use crate::workflow::*;
use crate::*;

/// Endpoints: destinations owned by one account.
#[async_trait]
pub trait EndpointStore: Send + Sync {
    /// Creates an endpoint, enabled, with a closed circuit.
    ///
    /// # Behavior
    /// - The stored endpoint reads back equal (`endpoint_create_then_get_round_trips`).
    ///
    /// # Errors
    /// `InvalidInput` for a URL that is not absolute `http(s)` (`endpoint_create_rejects_bad_url`).
    ///
    /// # Cancellation safety
    /// Cancelling may or may not create the endpoint.
    async fn endpoint_create(&self, req: EndpointCreateRequest) -> StoreResult<Endpoint>;

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
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` for a bad URL.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not apply the change.
    async fn endpoint_update(
        &self,
        account: &AccountId,
        id: EndpointId,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint>;

    /// Replaces the signing secret; the old one keeps signing for `grace`.
    ///
    /// # Behavior
    /// - Both secrets sign until the grace period ends (`rotate_secret_keeps_previous_for_grace`).
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not rotate.
    async fn endpoint_rotate_secret(
        &self,
        account: &AccountId,
        id: EndpointId,
        secret: Secret,
        grace: Duration,
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
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not apply the change.
    async fn endpoint_set_enabled(
        &self,
        account: &AccountId,
        id: EndpointId,
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

/// Events: publishing them (with their fan-out to deliveries, in the same
/// transaction) and reading them back.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Stores an event and one delivery per matching endpoint of the account,
    /// in one transaction.
    ///
    /// # Behavior
    /// - One delivery per matching endpoint, enabled or not (disabled ones are
    ///   held); none for filtered-out or deleted ones (`publish_fans_out_to_matching_endpoints`).
    /// - An endpoint subscribes by type name, `*` or a prefix such as
    ///   `order.*` ([`crate::catalogue::subscription_matches`]); a published
    ///   type never holds `*` (`wildcard_subscriptions_take_every_type_under_their_prefix`).
    /// - A type registered with a schema ([`CatalogueStore`]) is checked in
    ///   the publish's transaction (`a_publish_of_a_registered_type_is_checked_against_its_schema`).
    /// - An endpoint with a filter ([`crate::filter`]) gets the events whose
    ///   type and payload pass it, decided in the publish's transaction; a
    ///   payload it cannot evaluate does not pass and fails nothing
    ///   (`endpoint_filters_decide_which_events_fan_out`).
    /// - The same `(account, idempotency_key)` returns the first event and
    ///   creates nothing (`publish_with_same_idempotency_key_creates_nothing_new`);
    ///   with another type or payload it is `InvalidInput` and the publish (or
    ///   batch) stores nothing (`an_idempotency_key_reused_for_another_request_is_refused`).
    /// - Sequence numbers strictly increase per endpoint (`sequence_numbers_strictly_increase_per_endpoint`).
    /// - The request's trace context is kept with the event and comes back
    ///   on each claimed delivery of it ([`crate::trace`];
    ///   `the_trace_context_of_a_publish_reaches_its_deliveries`).
    ///
    /// # Errors
    /// `InvalidInput` for an empty or oversized event type or key, or one
    /// holding a control character, alike on every adapter
    /// (`control_characters_are_invalid_input`); for the types of
    /// operational events, which only the store publishes
    /// (`reserved_event_types_are_invalid_input`).
    ///
    /// # Cancellation safety
    /// Cancelling may or may not publish; never half (all deliveries or none).
    async fn event_publish(&self, req: PublishRequest) -> StoreResult<Published> {
        let mut one = self.event_publish_batch(vec![req]).await?;
        one.pop()
            .ok_or_else(|| StoreError::Backend("publish returned no event".into()))
    }

    /// Publishes many events in one transaction: all or nothing.
    ///
    /// # Behavior
    /// - One invalid request fails the batch and stores nothing
    ///   (`publish_batch_is_all_or_nothing`).
    ///
    /// # Cancellation safety
    /// As [`EventStore::event_publish`].
    async fn event_publish_batch(&self, reqs: Vec<PublishRequest>) -> StoreResult<Vec<Published>>;

    /// Reads an event of `account`.
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event>;

    /// The account's events, newest first, filtered by type and publication
    /// time. A page may hold more than `limit` events: those published in
    /// the same millisecond as its last one come with it (see
    /// [`crate::TimeCut`]).
    ///
    /// # Behavior
    /// - Filters by type and time; following `next` visits every event once
    ///   (`event_list_filters_and_pages_newest_first`).
    ///
    /// # Errors
    /// `InvalidInput` for a bad page.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_list(&self, req: EventListRequest) -> StoreResult<Page<Event>>;
}

/// The event-type catalogue (ADR 0025): types an account registers with a
/// description, an optional JSON Schema for their payloads and an example.
#[async_trait]
pub trait CatalogueStore: Send + Sync {
    /// Registers a type, or replaces everything an earlier registration of
    /// the same name said (its `created_at` is kept).
    ///
    /// # Behavior
    /// - Stored, read back, replaced and listed by name
    ///   (`event_types_are_registered_replaced_and_deleted`).
    /// - From then on a publish of the type whose payload does not match the
    ///   schema fails with `InvalidInput` naming the path, and stores nothing,
    ///   not even the rest of its batch
    ///   (`a_publish_of_a_registered_type_is_checked_against_its_schema`).
    ///
    /// # Errors
    /// `InvalidInput` as [`crate::EventTypePut::validate`] says: a bad name
    /// (with `*`, or reserved), a schema that does not compile, an example
    /// that does not match it, or a field too large.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not store it.
    async fn event_type_put(&self, req: EventTypePut) -> StoreResult<EventType>;

    /// One registered type of `account`.
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_type_get(&self, account: &AccountId, name: &str) -> StoreResult<EventType>;

    /// Every registered type of `account`, by name.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_type_list(&self, account: &AccountId) -> StoreResult<Vec<EventType>>;

    /// Removes a type from the catalogue: its publishes are no longer
    /// checked. Events already published keep their type.
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not remove it.
    async fn event_type_delete(&self, account: &AccountId, name: &str) -> StoreResult<()>;

    /// Publishes the type's example as an event delivered to `endpoint` only,
    /// whatever the endpoint's subscriptions and filter say: "send example".
    ///
    /// # Behavior
    /// - One event of the type with the example as payload, one delivery to
    ///   `endpoint`, none to any other endpoint
    ///   (`an_example_is_sent_to_one_endpoint`).
    ///
    /// # Errors
    /// `NotFound` for a type or endpoint not of `account`; `InvalidInput`
    /// when the type has no example.
    ///
    /// # Cancellation safety
    /// As [`EventStore::event_publish`].
    async fn event_type_send_example(
        &self,
        account: &AccountId,
        name: &str,
        endpoint: EndpointId,
    ) -> StoreResult<Published>;
}

/// The delivery queue: deliveries from enqueue to their end, and back again.
///
/// Every write under a [`Lease`] (`delivery_extend`, `delivery_release`,
/// `delivery_record_outcome(s)`) is decided by the one lease check,
/// [`crate::lease::fence`] (ADR 0002); in both adapters it is called from
/// `delivery/outcome.rs` (`fenced_row` and `record_outcome(s)`), on what
/// `LeaseRow::held` reads off the row.
#[async_trait]
pub trait DeliveryStore: Send + Sync {
    /// Creates the delivery of `(endpoint, event)` if it does not exist.
    ///
    /// # Behavior
    /// - Insert-wins: of any number of concurrent callers exactly one sees
    ///   `won = true`, and all see the same delivery id
    ///   (`enqueue_is_insert_wins_under_concurrency`).
    ///
    /// # Errors
    /// `NotFound` for an endpoint or event not of `account`.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not create the delivery; a retry reports `won = false` then.
    async fn delivery_enqueue(
        &self,
        account: &AccountId,
        endpoint: EndpointId,
        event: EventId,
    ) -> StoreResult<Enqueued>;

    /// Leases up to `limit` due deliveries, shared fairly among endpoints and
    /// accounts within each endpoint's in-flight cap and rate limit (ADR 0009).
    ///
    /// # Behavior
    /// - Expired leases are swept first: the lost attempt is logged as
    ///   `lease_expired` and the delivery is due again, or dead when its
    ///   attempts are used up (`expired_lease_is_claimable_again_and_logged`,
    ///   `worker_crashing_every_attempt_still_runs_out_of_attempts`).
    /// - Within an endpoint oldest due first, at most `limit`, nothing not yet
    ///   due (`claim_returns_oldest_due_first_within_limit`).
    /// - Across endpoints and accounts by max-min fairness
    ///   (`flow::share_claim`): each delivery of the claim goes to the account
    ///   holding the fewest live leases, within it to the endpoint holding the
    ///   fewest, so a freed slot never goes to the oldest backlog ahead of a
    ///   quiet endpoint (`a_freed_slot_goes_to_the_quiet_endpoint_not_the_slow_backlogs`,
    ///   `the_account_holding_the_fewest_leases_gets_the_next_slots`); a
    ///   backlog never hides another endpoint's due delivery from the next
    ///   claim (`quiet_endpoint_is_claimed_next_despite_a_backlog`,
    ///   `claims_are_shared_fairly_between_accounts`); nothing starves
    ///   (`every_due_delivery_is_eventually_claimed`).
    /// - The request's `throttle` lowers the caps of the endpoints it lists
    ///   (counted against every claimer's leases) and bounds what they get
    ///   together to its budget (`a_throttled_endpoint_gets_its_lowered_cap_within_the_budget`).
    /// - Leased deliveries of an endpoint never exceed its cap, across every
    ///   claimer; expired leases free their slot
    ///   (`claim_respects_the_in_flight_cap_under_concurrent_claimers`).
    /// - A rate-limited endpoint is claimed at most at its rate, bursts of one
    ///   second; what waits stays `pending` and spends no attempt
    ///   (`claim_respects_the_rate_limit_under_concurrent_claimers`).
    /// - Exclusive: one delivery is held by at most one live lease, whatever
    ///   the number of concurrent claimers (`claim_is_exclusive_under_concurrent_claimers`).
    /// - The attempt number increments at claim (`claim_increments_attempt_number`).
    /// - Each claim hands out the endpoint as it is now (URL, secrets,
    ///   headers, enabled, removed), whatever changed since the last one
    ///   (`a_claim_sends_with_the_endpoint_as_it_is_now`).
    /// - Disabled endpoints and open circuits are skipped; after the cooldown
    ///   exactly one delivery is claimed as the probe, ahead of ordinary ones
    ///   (`circuit_admits_exactly_one_probe_after_cooldown`).
    /// - An ordered endpoint has one delivery in flight, the lowest sequence not
    ///   yet final (`ordered_endpoint_has_one_delivery_in_flight_lowest_first`).
    ///
    /// # Errors
    /// `InvalidInput` for a limit outside 1..=1000 or a zero lease
    /// (`claim_rejects_bad_limits`).
    ///
    /// # Cancellation safety
    /// Cancelling after the claim committed leaves the leases to expire.
    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>>;

    /// Renews a live lease for `lease_for` from now.
    ///
    /// # Behavior
    /// - Moves the expiry; a stale token is `LeaseLost` (`extend_renews_a_live_lease`).
    ///
    /// # Errors
    /// `LeaseLost` when the token is stale or the lease already expired.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease>;

    /// Returns a leased delivery to `pending`, due now, without consuming its attempt.
    ///
    /// # Behavior
    /// - The attempt budget is unchanged (`release_keeps_the_attempt_budget`).
    ///
    /// # Errors
    /// `LeaseLost` for a stale token.
    ///
    /// # Cancellation safety
    /// Safe to retry (a retry after success is `LeaseLost`).
    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()>;

    /// Records an attempt's outcome: moves the delivery, appends to the
    /// attempt log and updates the circuit, in one transaction.
    ///
    /// # Behavior
    /// - Fenced by the token: a stale token is `LeaseLost` and changes nothing
    ///   (`stale_lease_token_gets_lease_lost_and_changes_nothing`).
    /// - The same outcome again is a no-op reported as `duplicate`
    ///   (`repeated_outcome_is_a_noop`).
    /// - A retry keeps the delivery's identity, sequence number and attempt
    ///   log; its lease is lost once the delivery is claimed again
    ///   (`a_retried_delivery_keeps_its_place_and_its_log`).
    /// - Delivered, retry, give-up and exhaustion transitions
    ///   (`outcomes_move_the_delivery`, `exhausted_attempts_end_dead`).
    /// - `Gone` disables the endpoint and holds the delivery (`gone_disables_endpoint_and_holds_delivery`).
    /// - The circuit opens at its threshold, closes on a probe's success and
    ///   re-opens with a longer cooldown on its failure (`circuit_opens_at_threshold`,
    ///   `circuit_closes_on_probe_success`, `circuit_reopens_longer_after_failed_probe`).
    /// - An endpoint failing without success for the disable window is disabled
    ///   (`endpoint_is_disabled_after_failing_for_the_window`).
    ///
    /// # Errors
    /// `LeaseLost`; `Conflict` when a different outcome was already recorded with this token.
    ///
    /// # Cancellation safety
    /// Safe to retry: a repeat is a duplicate.
    async fn delivery_record_outcome(
        &self,
        lease: &Lease,
        outcome: DeliveryOutcome,
    ) -> StoreResult<OutcomeRecorded> {
        self.delivery_record_outcomes(vec![(lease.clone(), outcome)])
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Backend("no outcome was recorded".into())))
    }

    /// Records a batch of outcomes (a worker's completion batch) in one
    /// transaction: each item answers what
    /// [`DeliveryStore::delivery_record_outcome`] would answer for it, in order.
    ///
    /// # Behavior
    /// - Per-item results agree with single calls, repeats and stale leases
    ///   included (`outcome_batches_agree_with_single_outcomes`).
    /// - A success leaves the same delivery, attempt-log row and circuit
    ///   whichever path records it: alone in a batch of successes (which an
    ///   adapter may write with one set statement) or beside a repeat of its
    ///   own lease (which takes the general transition)
    ///   (`a_success_is_recorded_alike_on_every_path`).
    ///
    /// # Errors
    /// A backend failure fails the call; items may or may not have been
    /// recorded (an adapter may commit the common successes first), so the
    /// caller records them again one by one, where repeats are duplicates.
    ///
    /// # Cancellation safety
    /// Safe to retry: repeats are duplicates.
    ///
    /// Required: [`DeliveryStore::delivery_record_outcome`] is this with a
    /// batch of one, so the two can never call each other in a loop.
    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>>;

    /// Moves a `dead` delivery back to `pending`, due now, with a fresh attempt budget.
    ///
    /// # Behavior
    /// - Dead becomes pending and claimable (`replay_gives_a_dead_delivery_a_fresh_budget`).
    /// - It keeps its sequence number (the head of an ordered endpoint again)
    ///   and its attempt log, and the lease that ended it is lost
    ///   (`a_replayed_delivery_keeps_its_place_and_fences_its_old_lease`).
    ///
    /// # Errors
    /// `NotFound`; `Conflict` when it is not dead or its endpoint was deleted.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not replay.
    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery>;

    /// Sends a finished delivery again: a `delivered` or `dead` one goes
    /// back to `pending`, due now, with a fresh attempt budget, under the
    /// same id, so its receiver can tell it is the same message.
    ///
    /// # Behavior
    /// - Delivered or dead becomes pending and claimable, keeping its id,
    ///   sequence number and attempt log; the lease that finished it is lost
    ///   (`a_finished_delivery_is_resent_under_its_id`).
    /// - [`crate::recover()`] builds on it and on `delivery_enqueue`: an
    ///   endpoint gets a window's events again, once each
    ///   (`recovering_an_endpoint_sends_its_window_again_once`), and a run
    ///   cut short goes on from its last page
    ///   (`a_recovery_goes_on_from_its_last_reported_page`).
    ///
    /// # Errors
    /// `NotFound`; `Conflict` when it is pending or leased, or its endpoint
    /// was deleted.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not resend.
    async fn delivery_resend(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery>;

    /// Replays, as [`DeliveryStore::delivery_replay`] does, every dead
    /// delivery of the filter's account that matches it (its endpoint; the
    /// time it died, in `[dead_since, dead_until)`), in one transaction, and
    /// returns how many. Deliveries of deleted endpoints stay dead.
    ///
    /// # Behavior
    /// - Only matching dead deliveries of that account are revived, each with
    ///   a fresh budget; replaying again revives none
    ///   (`bulk_replay_revives_matching_dead_deliveries_once`).
    ///
    /// # Errors
    /// None beyond the backend's.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not replay (all or none).
    async fn delivery_replay_dead(&self, filter: ReplayFilter) -> StoreResult<u64>;

    /// Reads a delivery of `account`.
    ///
    /// # Behavior
    /// - Every read and write of a delivery is scoped to its account: another
    ///   account's delivery is `NotFound` (`accounts_never_see_each_others_deliveries`).
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery>;

    /// Lists deliveries newest first (by sequence), filtered, keyset-paginated.
    ///
    /// # Behavior
    /// - Filters by state, endpoint and event; pages do not overlap
    ///   (`delivery_list_filters_and_paginates`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>>;

    /// A receiver that changes whenever work may have become due: a publish,
    /// enqueue, replay, release or enable committed (on postgres, by any
    /// replica, through LISTEN/NOTIFY). Workers wait on it between empty
    /// claims, with polling as the fallback.
    ///
    /// # Behavior
    /// - A publish wakes a subscriber (`publish_wakes_idle_workers`).
    fn delivery_wakeups(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Counts all deliveries by state (for `status` and metrics).
    ///
    /// # Behavior
    /// - Agrees with the per-account counts (`deliveries_are_counted_by_account_and_state`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>>;

    /// Counts all deliveries by account and state, ordered by account then
    /// state, in one scan (for metrics, which bound the accounts they show).
    ///
    /// # Behavior
    /// - Every (account, state) with deliveries, exactly
    ///   (`deliveries_are_counted_by_account_and_state`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_count_by_account_and_state(
        &self,
    ) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>>;
}

/// The append-only attempt log.
#[async_trait]
pub trait AttemptLogStore: Send + Sync {
    /// The attempts of one delivery, oldest first.
    ///
    /// # Behavior
    /// - Oldest first, numbered from 1 (`attempt_log_lists_by_delivery_oldest_first`).
    /// - Each attempt keeps the start of its answer's body as reported, on
    ///   every path an outcome takes (`attempts_keep_the_start_of_each_answer`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn attempt_list_for_delivery(
        &self,
        account: &AccountId,
        id: DeliveryId,
    ) -> StoreResult<Vec<AttemptRecord>>;

    /// The attempts of one endpoint, newest first, keyset-paginated.
    ///
    /// # Behavior
    /// - Newest first; following `next` visits every row once
    ///   (`attempt_log_pages_by_endpoint_newest_first`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn attempt_list_for_endpoint(
        &self,
        account: &AccountId,
        id: EndpointId,
        page: PageRequest,
    ) -> StoreResult<Page<AttemptRecord>>;

    /// The endpoint's attempts recorded at or after `since`: counts by
    /// result and the response time's p50 and p95 (nearest rank, see
    /// [`crate::nearest_rank`]).
    ///
    /// # Behavior
    /// - Counts and ranks only that endpoint's attempts in the window
    ///   (`attempt_stats_count_results_and_rank_latencies`).
    ///
    /// # Errors
    /// `NotFound` for an endpoint of another account.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn attempt_stats(
        &self,
        account: &AccountId,
        id: EndpointId,
        since: Timestamp,
    ) -> StoreResult<AttemptStats>;
}

/// Circuit-breaker state.
#[async_trait]
pub trait CircuitStore: Send + Sync {
    /// The circuit of an endpoint of `account`.
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn circuit_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Circuit>;

    /// Circuits not closed (open or half-open) on live endpoints, across accounts (metrics).
    ///
    /// # Behavior
    /// - Counts a circuit from the failure that opens it (`circuit_opens_at_threshold`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn circuit_count_open(&self) -> StoreResult<u64>;
}

/// The workflow handoff queue: leased jobs handed between processes.
///
/// Heartbeats, staged results, completions, failures and releases are
/// decided by the same lease check as deliveries, [`crate::lease::fence`],
/// on what `TaskRow::held` reads off the row in each adapter's `workflow.rs`.
#[async_trait]
pub trait WorkflowStore: Send + Sync {
    /// Enqueues a task, idempotent on its id within its account.
    ///
    /// # Behavior
    /// - The same id with the same kind and payload returns the existing
    ///   task; with either different it is `Conflict`. Ids are scoped by
    ///   account: another account's task of the same id is a different task,
    ///   and enqueueing never reveals that it exists
    ///   (`workflow_enqueue_is_idempotent_and_conflicts_on_difference`).
    ///
    /// # Errors
    /// `Conflict`; `InvalidInput` for an empty or oversized kind.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_enqueue(&self, req: TaskEnqueueRequest) -> StoreResult<TaskEnqueued>;

    /// Leases up to `limit` due tasks of the given kinds, oldest due first.
    ///
    /// # Behavior
    /// - Only due tasks of the given kinds (`workflow_claim_takes_due_tasks_of_given_kinds`).
    /// - Exclusive across concurrent claimers (`workflow_claim_is_exclusive_under_concurrent_claimers`).
    /// - Expired leases are swept first: due again, or dead-lettered when the
    ///   attempts are used up (`workflow_expired_lease_is_claimable_again`); a
    ///   task whose handler staged a result is completed with it instead
    ///   (`workflow_staged_result_is_finalized_without_rerun`).
    ///
    /// # Errors
    /// `InvalidInput` for no kinds, a limit outside 1..=1000 or a zero lease.
    ///
    /// # Cancellation safety
    /// Leases of a claim cancelled after its commit expire.
    async fn workflow_claim(&self, req: TaskClaimRequest) -> StoreResult<Vec<ClaimedTask>>;

    /// Extends a live lease while the handler runs, and stores `progress`
    /// when given (what the handler has done so far; `None` keeps the last).
    ///
    /// # Behavior
    /// - A stale or expired lease is `LeaseLost` (`workflow_heartbeat_extends_and_stale_lease_is_lost`).
    /// - The progress is readable at once ([`WorkflowStore::workflow_get`]),
    ///   kept through completion, failure and a lost lease, and given to the
    ///   next claim of the task; a lost lease's progress is not stored
    ///   (`workflow_heartbeat_stores_progress_for_readers_and_the_next_run`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_heartbeat(
        &self,
        lease: &TaskLease,
        lease_for: Duration,
        progress: Option<serde_json::Value>,
    ) -> StoreResult<TaskLease>;

    /// Stores the handler's result before completion, so a crash between the
    /// two never runs the handler again.
    ///
    /// # Errors
    /// `LeaseLost`; `NotFound` under another account.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_stage_result(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<()>;

    /// Completes a task with its result. A repeat with the same lease returns the task.
    ///
    /// # Behavior
    /// - A lease reaches its own account's task only, also when another
    ///   account has a task of the same id (`workflow_same_id_in_two_accounts_stays_apart`).
    ///
    /// # Errors
    /// `LeaseLost`; `NotFound` when the lease names another account
    /// (`workflow_account_scoping_fails_closed`); `Conflict` when the lease
    /// already failed the task.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_complete(
        &self,
        lease: &TaskLease,
        result: serde_json::Value,
    ) -> StoreResult<Task>;

    /// Records a failure: backs off (capped exponential, jittered) when
    /// retryable and attempts remain, dead-letters otherwise.
    ///
    /// # Behavior
    /// - Backoff, then dead letter with the last error (`workflow_fail_backs_off_then_dead_letters`).
    /// - Non-retryable: dead-lettered at once (`workflow_non_retryable_failure_dead_letters_at_once`).
    ///
    /// # Errors
    /// As [`WorkflowStore::workflow_complete`].
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_fail(
        &self,
        lease: &TaskLease,
        error: String,
        failure: TaskFailure,
    ) -> StoreResult<Task>;

    /// Returns a leased task to `pending` without spending its attempt (shutdown).
    ///
    /// # Behavior
    /// - The attempt budget is unchanged (`workflow_release_keeps_the_attempt_budget`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn workflow_release(&self, lease: &TaskLease) -> StoreResult<()>;

    /// Reads a task of `account`.
    ///
    /// # Errors
    /// `NotFound`, also for another account's task.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn workflow_get(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task>;

    /// Dead-lettered tasks of `account`, newest first.
    ///
    /// # Behavior
    /// - Lists them with their last error; retry makes one due again with a
    ///   fresh budget (`workflow_dead_letters_are_listed_and_retried`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn workflow_list_dead(
        &self,
        account: &AccountId,
        page: PageRequest,
    ) -> StoreResult<Page<Task>>;

    /// Moves a dead-lettered task back to `pending` with a fresh attempt budget.
    ///
    /// # Errors
    /// `NotFound`; `Conflict` when it is not dead-lettered.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not retry.
    async fn workflow_retry_dead(&self, account: &AccountId, id: &TaskId) -> StoreResult<Task>;
}

/// Request idempotency records.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims `(scope, key)` for a request with `request_hash`, for `ttl`.
    ///
    /// # Behavior
    /// - `Started` for a new or expired key, `InProgress` while its owner runs,
    ///   `Replay` with the stored response once completed, `Mismatch` for a
    ///   different request (`idempotency_begin_reports_every_outcome`).
    ///
    /// # Errors
    /// `InvalidInput` for an empty scope or key; a failure to persist is an
    /// error, never a `Started`.
    ///
    /// # Cancellation safety
    /// A cancelled begin may hold the key until the TTL passes.
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        ttl: Duration,
    ) -> StoreResult<IdempotencyBegin>;

    /// Stores the response; later begins replay it.
    ///
    /// # Errors
    /// `LeaseLost` when the token no longer owns the key
    /// (`idempotency_complete_with_a_stale_token_is_an_error`).
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()>;

    /// Frees the key after a failed handler.
    ///
    /// # Behavior
    /// - The next begin is `Started` (`idempotency_abandon_frees_the_key`).
    ///
    /// # Errors
    /// `LeaseLost` when the token no longer owns the key.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()>;
}

/// Single-flight periodic work.
#[async_trait]
pub trait TickStore: Send + Sync {
    /// Claims the tick `name` unless another holder's lease is live or it
    /// completed less than `every` ago.
    ///
    /// # Behavior
    /// - At most one holder across replicas until completion or expiry
    ///   (`tick_is_single_flight_until_completed_or_expired`); the stored state
    ///   comes back and `every` is respected (`tick_state_is_kept_and_interval_respected`).
    ///
    /// # Errors
    /// `InvalidInput` for an empty or oversized name.
    ///
    /// # Cancellation safety
    /// A cancelled claim may hold the tick until its lease expires.
    async fn tick_claim(
        &self,
        name: &str,
        lease_for: Duration,
        every: Duration,
    ) -> StoreResult<Option<TickLease>>;

    /// Stores the tick's state and frees it.
    ///
    /// # Errors
    /// `LeaseLost` when the lease is stale.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()>;
}

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
    /// # Errors
    /// `InvalidInput` for an empty or oversized batch id.
    ///
    /// # Cancellation safety
    /// Safe to retry.
    async fn usage_record(&self, batch: UsageBatch) -> StoreResult<bool>;

    /// Totals of `account` in the windows starting in `[from, to)`, by window then metric.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn usage_query(
        &self,
        account: &AccountId,
        from: Timestamp,
        to: Timestamp,
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
    /// `Conflict` when the hash is already stored; `InvalidInput` for an empty
    /// or oversized hash.
    ///
    /// # Cancellation safety
    /// A cancelled call may or may not have stored the key.
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &str,
    ) -> StoreResult<AccountKey>;

    /// The key whose hash is `key_hash`, if stored and not revoked.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>>;

    /// Revokes a key of `account`.
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

/// Retention.
#[async_trait]
pub trait MaintenanceStore: Send + Sync {
    /// Removes one small batch (at most `batch` rows per table) of finished
    /// history older than `retention`: delivered deliveries, dead deliveries
    /// of deleted endpoints, attempt-log rows, events left without
    /// deliveries, completed tasks, alerts, usage
    /// windows (and their batch ids), expired idempotency records and expired
    /// dashboard sessions.
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
    /// - `maintenance::run_maintenance` runs it on one replica per interval,
    ///   on a tick (`maintenance_runs_on_a_single_flight_tick`).
    ///
    /// # Errors
    /// `InvalidInput` for a batch outside 1..=10000.
    ///
    /// # Cancellation safety
    /// Safe: each batch commits on its own.
    async fn maintenance_purge(&self, retention: Duration, batch: u32) -> StoreResult<PurgeReport>;
}

/// The whole port. Object-safe; used as [`DynControlPlaneStore`].
#[async_trait]
pub trait ControlPlaneStore:
    EndpointStore
    + EventStore
    + CatalogueStore
    + DeliveryStore
    + AttemptLogStore
    + CircuitStore
    + WorkflowStore
    + IdempotencyStore
    + TickStore
    + UsageStore
    + AlertStore
    + AccountKeyStore
    + SessionStore
    + MaintenanceStore
{
    /// The adapter's name (`embedded`, `postgres`).
    fn backend_name(&self) -> &'static str;

    /// How many write transactions the store usefully runs at once: a
    /// caller that groups writes (the API's publisher, ADR 0015) keeps this
    /// many groups in flight. More only splits groups that would have
    /// shared a commit (ADR 0023).
    fn write_concurrency(&self) -> usize;

    /// Checks that the backend answers (readiness).
    ///
    /// # Errors
    /// `Unavailable` when it does not.
    async fn ping(&self) -> StoreResult<()>;
}

/// The port as a shared trait object.
pub type DynControlPlaneStore = Arc<dyn ControlPlaneStore>;
