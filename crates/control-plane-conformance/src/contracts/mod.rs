//! Every contract of the port as a plain async function, one file per area
//! over one `fixtures` module. Run them through
//! [`crate::conformance_suite!`]; each names the rustdoc bullet it enforces.

mod catalogue;
mod circuits;
mod delivery;
mod destinations;
mod endpoints;
mod fairness;
mod fixtures;

pub(crate) use fixtures::client_tls;
mod history;
mod listing_filters;
mod listings;
mod operations;
mod poll;
mod portal;
mod publish;
mod retention;
mod workflow;

pub use catalogue::{
    a_publish_of_a_registered_type_is_checked_against_its_schema,
    an_example_is_sent_to_one_endpoint, event_types_are_registered_replaced_and_deleted,
    wildcard_subscriptions_take_every_type_under_their_prefix,
};
pub use circuits::{
    circuit_admits_exactly_one_probe_after_cooldown, circuit_closes_on_probe_success,
    circuit_opens_at_threshold, circuit_reopens_longer_after_failed_probe,
    circuits_are_listed_as_each_is_read, endpoint_is_disabled_after_failing_for_the_window,
    gone_disables_endpoint_and_holds_delivery,
};
pub use delivery::{
    a_retried_delivery_keeps_its_place_and_its_log, a_success_is_recorded_alike_on_every_path,
    an_endpoint_retry_schedule_and_attempt_limit_are_its_own, claim_increments_attempt_number,
    claim_is_exclusive_under_concurrent_claimers, claim_rejects_bad_limits,
    claim_returns_oldest_due_first_within_limit, exhausted_attempts_end_dead,
    expired_lease_is_claimable_again_and_logged, extend_renews_a_live_lease,
    outcome_batches_agree_with_single_outcomes, outcomes_move_the_delivery,
    release_keeps_the_attempt_budget, repeated_outcome_is_a_noop,
    stale_lease_token_gets_lease_lost_and_changes_nothing,
    worker_crashing_every_attempt_still_runs_out_of_attempts,
};
pub use destinations::{
    a_broker_destination_is_stored_and_claimed_as_given,
    a_claim_sends_with_the_endpoint_as_it_is_now,
    a_transform_is_checked_kept_replaced_removed_and_claimed,
    client_certificates_are_checked_replaced_removed_and_claimed,
    custom_headers_are_checked_replaced_and_claimed,
    oauth2_credentials_are_checked_replaced_removed_and_claimed,
};
pub use endpoints::{
    a_disable_reason_is_checked_by_the_store, a_rotated_out_secret_is_cleared_after_its_grace,
    a_signing_secret_is_checked_and_keeps_its_scheme, account_keys_are_found_by_hash_and_revoked,
    creates_racing_at_an_endpoint_quota_make_no_more_than_it,
    deleting_endpoint_parks_deliveries_as_dead, disabled_endpoint_holds_deliveries_until_enabled,
    endpoint_create_rejects_bad_url, endpoint_create_then_get_round_trips,
    endpoint_filters_decide_which_events_fan_out, endpoint_of_another_account_is_not_found,
    endpoint_update_changes_only_given_fields, rotate_secret_keeps_previous_for_grace,
};
pub use fairness::{
    a_freed_slot_goes_to_the_quiet_endpoint_not_the_slow_backlogs,
    a_large_cap_holds_under_many_concurrent_claimers,
    a_throttled_endpoint_gets_its_lowered_cap_within_the_budget,
    claim_respects_the_in_flight_cap_under_concurrent_claimers,
    claim_respects_the_rate_limit_under_concurrent_claimers,
    claims_are_shared_fairly_between_accounts, every_due_delivery_is_eventually_claimed,
    ordered_endpoint_has_one_delivery_in_flight_lowest_first,
    quiet_endpoint_is_claimed_next_despite_a_backlog,
    the_account_holding_the_fewest_leases_gets_the_next_slots,
};
pub use history::{
    a_finished_delivery_is_resent_under_its_id, a_recovery_goes_on_from_its_last_reported_page,
    a_replayed_delivery_keeps_its_place_and_fences_its_old_lease,
    bulk_replay_revives_matching_dead_deliveries_once,
    recovering_an_endpoint_sends_its_window_again_once,
    replay_gives_a_dead_delivery_a_fresh_budget,
};
pub use listing_filters::deliveries_are_filtered_by_event_type_and_time;
pub use listings::{
    attempt_log_lists_by_delivery_oldest_first, attempt_log_pages_by_endpoint_newest_first,
    attempt_rollup_of_an_account_matches_each_endpoints_stats,
    attempt_stats_count_results_and_rank_latencies,
    attempts_are_searched_by_result_status_and_time, attempts_keep_the_start_of_each_answer,
    deliveries_are_counted_by_account_and_state, delivery_counts_follow_every_move,
    delivery_list_filters_and_paginates,
};
pub use operations::{
    a_session_is_extended_listed_and_revoked, a_session_lives_until_it_expires_or_ends,
    alerts_are_published_to_endpoints_that_subscribe_by_name,
    alerts_are_recorded_with_their_transitions,
    an_unfinished_idempotency_record_is_held_only_for_its_lease, idempotency_abandon_frees_the_key,
    idempotency_begin_reports_every_outcome, idempotency_complete_with_a_stale_token_is_an_error,
    idempotency_records_expire_and_are_swept, revoking_a_key_drops_its_idempotency_records,
    tick_is_single_flight_until_completed_or_expired, tick_state_is_kept_and_interval_respected,
    usage_batches_are_idempotent_and_queryable_by_window,
};
pub use poll::{
    a_poll_endpoint_is_read_only_by_its_consumer,
    a_poll_from_an_earlier_cursor_reads_the_same_events_again,
    a_poll_reads_in_order_and_acknowledges_what_it_reads,
    concurrent_polls_of_one_endpoint_read_every_event_once_in_one_order,
};
pub use portal::{
    a_portal_link_is_found_until_revoked_or_expired, a_portal_link_is_redeemed_once,
    portal_links_are_listed_and_revoked_per_account,
};
pub use publish::{
    accounts_never_see_each_others_deliveries, an_event_is_found_by_its_idempotency_key,
    an_idempotency_key_reused_for_another_request_is_refused, control_characters_are_invalid_input,
    enqueue_is_insert_wins_under_concurrency, event_list_filters_and_pages_newest_first,
    publish_batch_is_all_or_nothing, publish_fans_out_to_matching_endpoints,
    publish_wakes_idle_workers, publish_with_same_idempotency_key_creates_nothing_new,
    reserved_event_types_are_invalid_input, sequence_numbers_strictly_increase_per_endpoint,
    the_trace_context_of_a_publish_reaches_its_deliveries,
};
pub use retention::{
    erasing_an_account_removes_its_rows_and_no_others, maintenance_purges_old_history_in_batches,
    maintenance_runs_on_a_single_flight_tick, retention_purges_completed_tasks_only,
    retention_purges_dead_deliveries_of_deleted_endpoints, retention_purges_ended_usage_windows,
    retention_purges_events_left_without_deliveries, retention_purges_old_alerts,
};
pub use workflow::{
    workflow_account_scoping_fails_closed, workflow_claim_is_exclusive_under_concurrent_claimers,
    workflow_claim_takes_due_tasks_of_given_kinds, workflow_dead_letters_are_listed_and_retried,
    workflow_enqueue_is_idempotent_and_conflicts_on_difference,
    workflow_expired_lease_is_claimable_again, workflow_fail_backs_off_then_dead_letters,
    workflow_heartbeat_extends_and_stale_lease_is_lost,
    workflow_heartbeat_stores_progress_for_readers_and_the_next_run,
    workflow_non_retryable_failure_dead_letters_at_once, workflow_release_keeps_the_attempt_budget,
    workflow_same_id_in_two_accounts_stays_apart,
    workflow_staged_result_is_finalized_without_rerun, workflow_tasks_are_listed_by_state,
};
