//! Events, the event-type catalogue, the delivery queue, the attempt log and circuits.

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AccountId, AttemptQuery, AttemptRecord, AttemptStats, Checked, Circuit, ClaimRequest,
    ClaimedDelivery, Delivery, DeliveryId, DeliveryListRequest, DeliveryOutcome, DeliveryState,
    EndpointId, EndpointKey, Enqueued, Event, EventId, EventListRequest, EventType, EventTypePut,
    Lease, OutcomeRecorded, Page, PollPage, PollRequest, PublishRequest, Published, ReplayFilter,
    RollupRow, StoreError, StoreResult, Timestamp,
};

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
    ///   `order.*` ([`crate::subscription_matches`]); a published
    ///   type never holds `*` (`wildcard_subscriptions_take_every_type_under_their_prefix`).
    /// - A type registered with a schema ([`CatalogueStore`]) is checked in
    ///   the publish's transaction (`a_publish_of_a_registered_type_is_checked_against_its_schema`).
    /// - An endpoint with a filter ([`crate::EventFilter`]) gets the events whose
    ///   type and payload pass it, decided in the publish's transaction; a
    ///   payload it cannot evaluate does not pass and fails nothing
    ///   (`endpoint_filters_decide_which_events_fan_out`).
    /// - The same `(account, idempotency_key)` returns the first event and
    ///   creates nothing (`publish_with_same_idempotency_key_creates_nothing_new`);
    ///   with another type or payload it is `InvalidInput` and the publish (or
    ///   batch) stores nothing (`an_idempotency_key_reused_for_another_request_is_refused`).
    /// - Sequence numbers strictly increase per endpoint (`sequence_numbers_strictly_increase_per_endpoint`).
    /// - The request's trace context is kept with the event and comes back
    ///   on each claimed delivery of it ([`crate::TraceParent`];
    ///   `the_trace_context_of_a_publish_reaches_its_deliveries`).
    ///
    /// # Errors
    /// `InvalidInput` for a key reused for another request, or a payload
    /// its registered schema refuses. An empty or oversized event type or
    /// key, one holding a control character
    /// (`control_characters_are_invalid_input`), and the types of
    /// operational events, which only the store publishes
    /// (`reserved_event_types_are_invalid_input`), are refused when the
    /// request is sealed ([`crate::Check::checked`]).
    ///
    /// # Cancellation safety
    /// Cancelling may or may not publish; never half (all deliveries or none).
    async fn event_publish(&self, req: Checked<PublishRequest>) -> StoreResult<Published> {
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
    async fn event_publish_batch(
        &self,
        reqs: Vec<Checked<PublishRequest>>,
    ) -> StoreResult<Vec<Published>>;

    /// Reads an event of `account`.
    ///
    /// # Errors
    /// `NotFound`.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event>;

    /// The event of `account` published with the idempotency key `key`, if
    /// there is one (an operator's lookup by the key a sender knows).
    ///
    /// # Behavior
    /// - Finds the event its key was published with, in its own account
    ///   only; an unknown key is `None`
    ///   (`an_event_is_found_by_its_idempotency_key`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn event_find_by_key(&self, account: &AccountId, key: &str)
        -> StoreResult<Option<Event>>;

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
    /// None of its own: sealing the request ([`crate::Check::checked`])
    /// refuses a bad name
    /// (with `*`, or reserved), a schema that does not compile, an example
    /// that does not match it, or a field too large.
    ///
    /// # Cancellation safety
    /// Cancelling may or may not store it.
    async fn event_type_put(&self, req: Checked<EventTypePut>) -> StoreResult<EventType>;

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
        endpoint: EndpointKey<'_>,
        name: &str,
    ) -> StoreResult<Published>;
}

/// The delivery queue: deliveries from enqueue to their end, and back again.
///
/// Every write under a [`Lease`] (`delivery_extend`, `delivery_release`,
/// `delivery_record_outcome(s)`) is decided by the one lease check,
/// [`crate::lease::fence`] (ADR 0002); in both adapters it is asked from
/// `delivery/outcome.rs` (`fenced_row` and `record_outcome(s)`) through
/// [`crate::lease::LeaseRow::fence`] and [`crate::lease::LeaseRow::fenced`]
/// (postgres also [`crate::lease::FinishedRow::fence`]).
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
        endpoint: EndpointKey<'_>,
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
    ///   (`claim_respects_the_in_flight_cap_under_concurrent_claimers`), also
    ///   a cap far above one claim under many claimers at once
    ///   (`a_large_cap_holds_under_many_concurrent_claimers`).
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
    /// None of its own: [`ClaimRequest::new`] refuses a limit outside
    /// 1..=1000 or a zero lease (`claim_rejects_bad_limits`).
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
    ///   (`outcomes_move_the_delivery`, `exhausted_attempts_end_dead`); the
    ///   attempts allowed are the endpoint's own when it has a retry setting,
    ///   also after a replay (`an_endpoint_retry_schedule_and_attempt_limit_are_its_own`).
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
    /// - `control_plane_runtime::recover` builds on it and on `delivery_enqueue`: an
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
    /// - Filters by the event's type and by creation time (`since`
    ///   inclusive, `until` exclusive), alone or with the other filters and
    ///   in every state (`deliveries_are_filtered_by_event_type_and_time`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>>;

    /// A subscription that moves whenever work may have become due: a publish,
    /// enqueue, replay, release or enable committed (on postgres, by any
    /// replica, through LISTEN/NOTIFY). Workers wait on it between empty
    /// claims, with polling as the fallback.
    ///
    /// # Behavior
    /// - A publish wakes a subscriber (`publish_wakes_idle_workers`).
    fn delivery_wakeups(&self) -> Box<dyn Wakeups>;

    /// Counts all deliveries by state (for `status` and metrics). Live
    /// states are counted in the live set, finished ones from tallies kept
    /// as deliveries finish, are replayed and are purged: the cost grows
    /// with the live work, never with the finished history (ADR 0032).
    ///
    /// # Behavior
    /// - Agrees with the per-account counts (`deliveries_are_counted_by_account_and_state`).
    /// - Follows every move of a delivery: publish, claim, retry, give up,
    ///   lease expiry, replay, resend, endpoint delete, retention
    ///   (`delivery_counts_follow_every_move`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>>;

    /// Counts all deliveries by account and state, ordered by account then
    /// state (for metrics, which bound the accounts they show), as
    /// [`DeliveryStore::delivery_count_by_state`] counts them.
    ///
    /// # Behavior
    /// - Every (account, state) with deliveries, exactly
    ///   (`deliveries_are_counted_by_account_and_state`,
    ///   `delivery_counts_follow_every_move`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn delivery_count_by_account_and_state(
        &self,
    ) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>>;
}

/// Poll endpoints (ADR 0051): their consumers read their deliveries.
#[async_trait]
pub trait PollStore: Send + Sync {
    /// Reads a poll endpoint's deliveries: first what was read before
    /// after the cursor `req.after` (positions in its attempt log), then
    /// its oldest pending deliveries by sequence, each recorded as
    /// delivered (an attempt of result `delivered`, its tally and rollup)
    /// in the same transaction, up to `req.limit` in all. Reads of one
    /// endpoint are serialised. A disabled endpoint hands out nothing new;
    /// what was read before is read again.
    ///
    /// # Behavior
    /// - Events come in publish order, each once, and each read one is
    ///   delivered with one attempt; the returned cursor reads on from the
    ///   last (`a_poll_reads_in_order_and_acknowledges_what_it_reads`).
    /// - A read with an earlier cursor returns the same events again and
    ///   delivers nothing twice; a replayed delivery is read again after
    ///   the rest (`a_poll_from_an_earlier_cursor_reads_the_same_events_again`).
    /// - Readers of one endpoint at once, each on its own cursor, all read
    ///   every event once in one order, each delivered once
    ///   (`concurrent_polls_of_one_endpoint_read_every_event_once_in_one_order`).
    /// - A claim never takes a poll endpoint's deliveries; event types and
    ///   filters choose its deliveries as for any endpoint; another
    ///   account's endpoint is not found, a pushed one is refused, and a
    ///   cursor ahead of every read of the endpoint is refused with nothing
    ///   handed out (`a_poll_endpoint_is_read_only_by_its_consumer`).
    ///
    /// # Errors
    /// `NotFound` for an endpoint that is not the account's or is deleted;
    /// `InvalidInput` for an endpoint with a URL
    /// ([`crate::not_a_poll_endpoint`]), or a cursor ahead of every read of
    /// the endpoint ([`crate::PollPage::read`]).
    ///
    /// # Cancellation safety
    /// A cancelled read may have delivered what it read; reading again
    /// with the same cursor returns it.
    async fn delivery_poll(&self, req: PollRequest) -> StoreResult<PollPage>;
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

    /// The attempts of an account the query asks for (an endpoint's, of a
    /// result, a status code, a time window), newest first, keyset-paginated.
    ///
    /// # Behavior
    /// - Newest first; following `next` visits every row once
    ///   (`attempt_log_pages_by_endpoint_newest_first`).
    /// - Each filter narrows, and they combine
    ///   (`attempts_are_searched_by_result_status_and_time`).
    ///
    /// # Errors
    /// `NotFound` for an endpoint that is not the account's.
    ///
    /// # Cancellation safety
    /// Safe.
    async fn attempt_search(&self, query: AttemptQuery) -> StoreResult<Page<AttemptRecord>>;

    /// The endpoint's attempts recorded since the minute `since` falls in:
    /// counts by result and the response time's p50 and p95, summed from
    /// the per-minute rollup written with each attempt, not from the log
    /// (ADR 0032). The rollup reaches back [`crate::ROLLUP_HORIZON`]; a
    /// percentile is the upper bound of the latency bucket that holds its
    /// nearest rank ([`AttemptStats::from_rollup`]).
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
        endpoint: EndpointKey<'_>,
        since: Timestamp,
    ) -> StoreResult<AttemptStats>;

    /// The attempt rollup of every endpoint of `account` since the minute
    /// `since` falls in, one row per endpoint, minute, result and latency
    /// bucket, in that order: what the dashboard's endpoints page reads in
    /// one call (stats with [`AttemptStats::from_rollup`], a response time
    /// per minute).
    ///
    /// # Behavior
    /// - Each endpoint's rows give what its `attempt_stats` gives; endpoints
    ///   of other accounts and endpoints without attempts have none
    ///   (`attempt_rollup_of_an_account_matches_each_endpoints_stats`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn attempt_rollup_of_account(
        &self,
        account: &AccountId,
        since: Timestamp,
    ) -> StoreResult<Vec<RollupRow>>;
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

    /// The circuit of every live endpoint of `account`, in one read (the
    /// dashboard's pages), in the order of `endpoint_list`.
    ///
    /// # Behavior
    /// - Each entry equals that endpoint's `circuit_get`; other accounts'
    ///   and deleted endpoints are left out (`circuits_are_listed_as_each_is_read`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn circuit_list(&self, account: &AccountId) -> StoreResult<Vec<(EndpointId, Circuit)>>;

    /// Circuits not closed (open or half-open) on live endpoints, across accounts (metrics).
    ///
    /// # Behavior
    /// - Counts a circuit from the failure that opens it (`circuit_opens_at_threshold`).
    ///
    /// # Cancellation safety
    /// Safe.
    async fn circuit_count_open(&self) -> StoreResult<u64>;
}

/// A subscription to "work may be due", from
/// [`DeliveryStore::delivery_wakeups`]. The port names only what a worker
/// does with it; the adapters' channel behind it is theirs (the store kit's).
#[async_trait]
pub trait Wakeups: Send {
    /// Marks every notification so far as seen; whether one was unseen.
    fn seen(&mut self) -> bool;

    /// Waits for a notification not yet seen and marks it seen; `false` when
    /// the store is gone and none will come. A notification sent between
    /// two waits is not lost.
    ///
    /// # Cancellation safety
    /// Safe: dropped before it returns, it marks nothing seen.
    async fn changed(&mut self) -> bool;
}
