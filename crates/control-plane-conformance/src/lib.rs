#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// This crate *is* a test suite: its functions assert, and a failed assertion
// is how a contract reports a broken adapter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use control_plane_core::{DynControlPlaneStore, ManualClock, StoreOptions};

pub mod contracts;
pub mod model;
pub mod model_test;
pub mod secrets;

/// One isolated store for one contract: a fresh file or schema, driven by a
/// manual clock.
pub struct Harness {
    /// The store under test.
    pub store: DynControlPlaneStore,
    /// The clock the store reads; tests move it instead of sleeping.
    pub clock: Arc<ManualClock>,
    /// Keeps the namespace alive (temporary directory, schema guard).
    pub guard: Box<dyn Any + Send + Sync>,
}

/// Opens isolated stores. An adapter implements it once and passes it to
/// [`conformance_suite!`].
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A fresh, empty store in its own namespace with `options`.
    async fn open(&self, options: StoreOptions) -> Harness;

    /// Another handle on `h`'s store as a second process would open it:
    /// its own connections and its own housekeeping gate, the same clock and
    /// `options`. Contracts about replicas claim through several of these.
    /// The default is `h`'s own handle, right for an adapter with one
    /// process per store (the embedded one).
    async fn replica(&self, h: &Harness, options: StoreOptions) -> DynControlPlaneStore {
        let _ = options;
        h.store.clone()
    }
}

/// Stamps every contract onto an adapter as a test. This macro is the only
/// list of contracts: a contract not named here does not run anywhere.
///
/// ```text
/// control_plane_conformance::conformance_suite!(MyFactory::new());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@stamp $factory;
            endpoint_create_then_get_round_trips,
            creates_racing_at_an_endpoint_quota_make_no_more_than_it,
            endpoint_create_rejects_bad_url,
            endpoint_of_another_account_is_not_found,
            endpoint_update_changes_only_given_fields,
            rotate_secret_keeps_previous_for_grace,
            publish_fans_out_to_matching_endpoints,
            the_trace_context_of_a_publish_reaches_its_deliveries,
            endpoint_filters_decide_which_events_fan_out,
            event_types_are_registered_replaced_and_deleted,
            a_publish_of_a_registered_type_is_checked_against_its_schema,
            an_example_is_sent_to_one_endpoint,
            wildcard_subscriptions_take_every_type_under_their_prefix,
            custom_headers_are_checked_replaced_and_claimed,
            a_claim_sends_with_the_endpoint_as_it_is_now,
            a_broker_destination_is_stored_and_claimed_as_given,
            an_endpoint_retry_schedule_and_attempt_limit_are_its_own,
            a_disable_reason_is_checked_by_the_store,
            a_signing_secret_is_checked_and_keeps_its_scheme,
            erasing_an_account_removes_its_rows_and_no_others,
            oauth2_credentials_are_checked_replaced_removed_and_claimed,
            client_certificates_are_checked_replaced_removed_and_claimed,
            a_transform_is_checked_kept_replaced_removed_and_claimed,
            publish_with_same_idempotency_key_creates_nothing_new,
            an_idempotency_key_reused_for_another_request_is_refused,
            publish_batch_is_all_or_nothing,
            control_characters_are_invalid_input,
            reserved_event_types_are_invalid_input,
            enqueue_is_insert_wins_under_concurrency,
            sequence_numbers_strictly_increase_per_endpoint,
            claim_returns_oldest_due_first_within_limit,
            claim_is_exclusive_under_concurrent_claimers,
            claim_increments_attempt_number,
            claim_rejects_bad_limits,
            claim_respects_the_in_flight_cap_under_concurrent_claimers,
            a_large_cap_holds_under_many_concurrent_claimers,
            claim_respects_the_rate_limit_under_concurrent_claimers,
            quiet_endpoint_is_claimed_next_despite_a_backlog,
            claims_are_shared_fairly_between_accounts,
            a_freed_slot_goes_to_the_quiet_endpoint_not_the_slow_backlogs,
            the_account_holding_the_fewest_leases_gets_the_next_slots,
            a_throttled_endpoint_gets_its_lowered_cap_within_the_budget,
            every_due_delivery_is_eventually_claimed,
            expired_lease_is_claimable_again_and_logged,
            worker_crashing_every_attempt_still_runs_out_of_attempts,
            stale_lease_token_gets_lease_lost_and_changes_nothing,
            repeated_outcome_is_a_noop,
            outcomes_move_the_delivery,
            exhausted_attempts_end_dead,
            gone_disables_endpoint_and_holds_delivery,
            replay_gives_a_dead_delivery_a_fresh_budget,
            a_finished_delivery_is_resent_under_its_id,
            recovering_an_endpoint_sends_its_window_again_once,
            a_recovery_goes_on_from_its_last_reported_page,
            a_retried_delivery_keeps_its_place_and_its_log,
            a_replayed_delivery_keeps_its_place_and_fences_its_old_lease,
            bulk_replay_revives_matching_dead_deliveries_once,
            attempt_stats_count_results_and_rank_latencies,
            attempt_rollup_of_an_account_matches_each_endpoints_stats,
            event_list_filters_and_pages_newest_first,
            an_event_is_found_by_its_idempotency_key,
            release_keeps_the_attempt_budget,
            extend_renews_a_live_lease,
            delivery_list_filters_and_paginates,
            deliveries_are_filtered_by_event_type_and_time,
            attempt_log_lists_by_delivery_oldest_first,
            attempts_keep_the_start_of_each_answer,
            attempt_log_pages_by_endpoint_newest_first,
            attempts_are_searched_by_result_status_and_time,
            circuit_opens_at_threshold,
            circuits_are_listed_as_each_is_read,
            circuit_admits_exactly_one_probe_after_cooldown,
            circuit_closes_on_probe_success,
            circuit_reopens_longer_after_failed_probe,
            endpoint_is_disabled_after_failing_for_the_window,
            disabled_endpoint_holds_deliveries_until_enabled,
            deliveries_are_counted_by_account_and_state,
            delivery_counts_follow_every_move,
            deleting_endpoint_parks_deliveries_as_dead,
            ordered_endpoint_has_one_delivery_in_flight_lowest_first,
            accounts_never_see_each_others_deliveries,
            publish_wakes_idle_workers,
            outcome_batches_agree_with_single_outcomes,
            a_success_is_recorded_alike_on_every_path,
            workflow_enqueue_is_idempotent_and_conflicts_on_difference,
            workflow_claim_takes_due_tasks_of_given_kinds,
            workflow_claim_is_exclusive_under_concurrent_claimers,
            workflow_fail_backs_off_then_dead_letters,
            workflow_non_retryable_failure_dead_letters_at_once,
            workflow_staged_result_is_finalized_without_rerun,
            workflow_account_scoping_fails_closed,
            workflow_same_id_in_two_accounts_stays_apart,
            workflow_release_keeps_the_attempt_budget,
            workflow_heartbeat_extends_and_stale_lease_is_lost,
            workflow_heartbeat_stores_progress_for_readers_and_the_next_run,
            workflow_expired_lease_is_claimable_again,
            workflow_dead_letters_are_listed_and_retried,
            workflow_tasks_are_listed_by_state,
            idempotency_begin_reports_every_outcome,
            idempotency_abandon_frees_the_key,
            idempotency_complete_with_a_stale_token_is_an_error,
            idempotency_records_expire_and_are_swept,
            an_unfinished_idempotency_record_is_held_only_for_its_lease,
            revoking_a_key_drops_its_idempotency_records,
            a_rotated_out_secret_is_cleared_after_its_grace,
            tick_is_single_flight_until_completed_or_expired,
            tick_state_is_kept_and_interval_respected,
            usage_batches_are_idempotent_and_queryable_by_window,
            alerts_are_recorded_with_their_transitions,
            alerts_are_published_to_endpoints_that_subscribe_by_name,
            account_keys_are_found_by_hash_and_revoked,
            a_session_lives_until_it_expires_or_ends,
            a_session_is_extended_listed_and_revoked,
            a_poll_reads_in_order_and_acknowledges_what_it_reads,
            a_poll_from_an_earlier_cursor_reads_the_same_events_again,
            a_poll_endpoint_is_read_only_by_its_consumer,
            concurrent_polls_of_one_endpoint_read_every_event_once_in_one_order,
            portal_links_are_listed_and_revoked_per_account,
            a_portal_link_is_redeemed_once,
            a_portal_link_is_found_until_revoked_or_expired,
            maintenance_purges_old_history_in_batches,
            retention_purges_events_left_without_deliveries,
            retention_purges_dead_deliveries_of_deleted_endpoints,
            retention_purges_completed_tasks_only,
            retention_purges_old_alerts,
            retention_purges_ended_usage_windows,
            maintenance_runs_on_a_single_flight_tick,
        );

        #[test]
        fn delivery_model_agrees_with_adapter() {
            $crate::model_test::run(&$factory);
        }

        #[test]
        fn delivery_model_agrees_on_sequences_found_before() {
            $crate::model_test::run_found(&$factory);
        }

        #[test]
        fn workflow_model_agrees_with_adapter() {
            $crate::model_test::run_workflow(&$factory);
        }
    };
    (@stamp $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::contracts::$name(&$factory).await;
            }
        )*
    };
}
