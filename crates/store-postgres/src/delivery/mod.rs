//! Events, fan-out and the delivery queue: claims with `FOR UPDATE SKIP LOCKED`
//! and leases fenced by token (ADR 0002, ADR 0005), by stage: `publish`,
//! `claim`, `outcome` (with `transition`, what every change of a live
//! delivery writes) and `read`, the same files and function names as the
//! embedded adapter's.

use crate::delivery::claim::ClaimTx;
use crate::delivery::outcome::{extend, record_outcomes, release, replay_dead, requeue};
use crate::delivery::publish::{enqueue, publish_keyless};
use crate::delivery::read::{
    count_by_account_and_state, count_by_state, event_by_key, event_get, event_list, get, list,
};
use control_plane_core::{
    AccountId, Checked, ClaimRequest, ClaimedDelivery, Delivery, DeliveryId, DeliveryListRequest,
    DeliveryOutcome, DeliveryState, DeliveryStore, EndpointKey, Enqueued, Event, EventId,
    EventListRequest, EventStore, Lease, OutcomeRecorded, Page, PublishRequest, Published,
    ReplayFilter, Requeue, StoreResult, Wakeups,
};
use std::time::Duration;

use async_trait::async_trait;

use crate::delivery::claim::claim;
use crate::delivery::publish::publish;
use crate::error::PgResultExt;
use crate::store::{in_tx, PipelinedTx, PostgresStore, Tx};

mod claim;
mod outcome;
mod publish;
mod read;
mod transition;

pub use claim::claim_statement;
pub(crate) use outcome::deliver_polled;
pub use outcome::{LEASED, RECORD_DELIVERED};
pub(crate) use publish::publish_example_to;

impl PostgresStore {
    /// The outbox: publishes inside the caller's own transaction, so the
    /// event and its deliveries commit or roll back with the caller's
    /// business write. The caller's connection must reach this store's
    /// schema (its `search_path`, as [`PostgresStore::schema`] names).
    ///
    /// # Errors
    /// As [`EventStore::event_publish_batch`]; an error leaves the caller's
    /// transaction to be rolled back.
    pub async fn publish_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        reqs: Vec<Checked<PublishRequest>>,
    ) -> StoreResult<Vec<Published>> {
        let reqs = reqs.into_iter().map(Checked::into_inner).collect();
        publish(&Tx::new(tx.client(), None, self, self.now()), reqs).await
    }

    /// Wakes workers on every replica; call it after committing a
    /// transaction that used [`PostgresStore::publish_in`].
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached (workers still poll).
    pub async fn notify_committed(&self) -> StoreResult<()> {
        self.wakeup.notify();
        let client = self.client().await?;
        client
            .execute("SELECT pg_notify($1, '')", &[&self.channel])
            .await
            .map_err(crate::error::map)?;
        Ok(())
    }
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn event_publish_batch(
        &self,
        reqs: Vec<Checked<PublishRequest>>,
    ) -> StoreResult<Vec<Published>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let reqs: Vec<PublishRequest> = reqs.into_iter().map(Checked::into_inner).collect();
        if reqs.iter().all(|r| r.idempotency_key.is_none()) {
            return publish_keyless(self, &reqs).await;
        }
        let out = in_tx!(self, |t| publish(&t, reqs))?;
        self.wake().await;
        Ok(out)
    }

    async fn event_get(&self, account: &AccountId, id: EventId) -> StoreResult<Event> {
        in_tx!(self, |t| event_get(&t, account, id))
    }

    async fn event_find_by_key(
        &self,
        account: &AccountId,
        key: &str,
    ) -> StoreResult<Option<Event>> {
        in_tx!(self, |t| event_by_key(&t, account, key))
    }

    async fn event_list(&self, req: EventListRequest) -> StoreResult<Page<Event>> {
        in_tx!(self, |t| event_list(&t, &req))
    }
}

#[async_trait]
impl DeliveryStore for PostgresStore {
    async fn delivery_enqueue(
        &self,
        endpoint: EndpointKey<'_>,
        event: EventId,
    ) -> StoreResult<Enqueued> {
        let (account, endpoint) = (endpoint.account, endpoint.id);
        let out = in_tx!(self, |t| enqueue(&t, account, endpoint, event))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_claim(&self, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
        // `claim` sends the `BEGIN` itself, with its first statement.
        let tx = PipelinedTx::connect(self).await?;
        let out = {
            let client = tx.client()?;
            let t = Tx::new(client, Some(&client.statement_cache), self, self.now());
            let (out, state) = claim(&t, req).await?;
            if let ClaimTx::Open = state {
                t.batch_execute("COMMIT").await.db()?;
            }
            out
        };
        tx.ended();
        Ok(out)
    }

    async fn delivery_extend(&self, lease: &Lease, lease_for: Duration) -> StoreResult<Lease> {
        in_tx!(self, |t| extend(&t, lease, lease_for))
    }

    async fn delivery_release(&self, lease: &Lease) -> StoreResult<()> {
        let out = in_tx!(self, |t| release(&t, lease))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_record_outcomes(
        &self,
        batch: Vec<(Lease, DeliveryOutcome)>,
    ) -> StoreResult<Vec<StoreResult<OutcomeRecorded>>> {
        record_outcomes(self, batch).await
    }

    async fn delivery_replay(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let out = in_tx!(self, |t| requeue(&t, account, id, Requeue::Replay))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_resend(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        let out = in_tx!(self, |t| requeue(&t, account, id, Requeue::Resend))?;
        self.wake().await;
        Ok(out)
    }

    async fn delivery_replay_dead(&self, filter: ReplayFilter) -> StoreResult<u64> {
        let n = in_tx!(self, |t| replay_dead(&t, &filter))?;
        if n > 0 {
            self.wake().await;
        }
        Ok(n)
    }

    async fn delivery_get(&self, account: &AccountId, id: DeliveryId) -> StoreResult<Delivery> {
        in_tx!(self, |t| get(&t, account, id))
    }

    async fn delivery_list(&self, req: DeliveryListRequest) -> StoreResult<Page<Delivery>> {
        in_tx!(self, |t| list(&t, req))
    }

    fn delivery_wakeups(&self) -> Box<dyn Wakeups> {
        self.wakeup.subscribe()
    }

    async fn delivery_count_by_state(&self) -> StoreResult<Vec<(DeliveryState, u64)>> {
        in_tx!(self, |t| count_by_state(&t))
    }

    async fn delivery_count_by_account_and_state(
        &self,
    ) -> StoreResult<Vec<(AccountId, DeliveryState, u64)>> {
        in_tx!(self, |t| count_by_account_and_state(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{open_test_store, open_test_store_with};
    use control_plane_core::AttemptReport;
    use control_plane_core::Check;
    use control_plane_core::EndpointCreateRequest;
    use control_plane_core::EndpointStore;
    use control_plane_core::Secret;

    /// An endpoint of `account` on `store`, subscribed to every event.
    async fn hook(store: &PostgresStore, account: &AccountId) {
        store
            .endpoint_create(
                EndpointCreateRequest::new(
                    account.clone(),
                    "https://example.com/hook",
                    Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
                )
                .checked()
                .unwrap(),
            )
            .await
            .unwrap();
    }

    /// `n` deliveries of `account`'s one endpoint (see [`hook`]), published
    /// as keyless pairs and claimed.
    async fn published_and_claimed(
        store: &PostgresStore,
        account: &AccountId,
        n: u32,
    ) -> Vec<ClaimedDelivery> {
        hook(store, account).await;
        let req = PublishRequest::new(account.clone(), "a.b", serde_json::json!({}));
        for _ in 0..n / 2 {
            store
                .event_publish_batch(
                    control_plane_core::Checked::all(vec![req.clone(), req.clone()]).unwrap(),
                )
                .await
                .unwrap();
        }
        let claimed = store
            .delivery_claim(ClaimRequest::new("w", n, Duration::from_secs(30)).unwrap())
            .await
            .unwrap();
        assert_eq!(claimed.len(), n as usize);
        claimed
    }

    /// An attempt answered with `code` in 3 ms.
    fn report(code: u16) -> AttemptReport {
        AttemptReport {
            status_code: Some(code),
            error: None,
            latency_ms: 3,
            response_body: None,
        }
    }

    /// Outcomes commit without waiting for the disk unless the store is
    /// configured otherwise (ADR 0034), when the server's own setting
    /// applies: a trigger on the attempt log notes
    /// the `synchronous_commit` that each recording transaction runs with,
    /// for a batch the fast statement takes whole and for one that needs
    /// the general path (a failure).
    #[tokio::test]
    async fn outcomes_commit_as_the_store_is_configured() {
        for synchronous in [false, true] {
            let (store, admin) =
                open_test_store_with(|c| c.synchronous_outcomes = synchronous).await;
            let schema = store.schema().to_string();
            admin
                .batch_execute(&format!(
                    "CREATE TABLE {schema}.seen (setting text); \
                     CREATE FUNCTION {schema}.note() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN INSERT INTO {schema}.seen VALUES (current_setting('synchronous_commit')); \
                     RETURN NULL; END $$; \
                     CREATE TRIGGER note AFTER INSERT ON {schema}.attempts \
                     FOR EACH STATEMENT EXECUTE FUNCTION {schema}.note()"
                ))
                .await
                .unwrap();
            let account = AccountId::new("a").unwrap();
            let claimed = published_and_claimed(&store, &account, 2).await;
            let ok = store
                .delivery_record_outcomes(vec![(
                    claimed[0].lease.clone(),
                    DeliveryOutcome::Delivered(report(200)),
                )])
                .await
                .unwrap();
            assert_eq!(ok[0].as_ref().unwrap().state, DeliveryState::Delivered);
            let failed = store
                .delivery_record_outcomes(vec![(
                    claimed[1].lease.clone(),
                    DeliveryOutcome::GiveUp(report(400)),
                )])
                .await
                .unwrap();
            assert_eq!(failed[0].as_ref().unwrap().state, DeliveryState::Dead);
            let seen = texts(&admin, &format!("SELECT setting FROM {schema}.seen")).await;
            // Synchronous, the server's own setting applies (on, unless the
            // cluster is run without it).
            let server: String = admin
                .query_one("SHOW synchronous_commit", &[])
                .await
                .unwrap()
                .get(0);
            let expected = if synchronous { server.as_str() } else { "off" };
            assert_eq!(seen, vec![expected; 2], "synchronous: {synchronous}");
            admin
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await
                .unwrap();
        }
    }

    /// A pipelined publish whose delivery insert fails after its event
    /// insert succeeded stores neither: the statements run in one
    /// transaction, and the `COMMIT` sent behind them rolls it back.
    #[tokio::test]
    async fn a_pipelined_publish_that_fails_part_way_stores_nothing() {
        let (store, admin) = open_test_store().await;
        let schema = store.schema().to_string();
        let account = AccountId::new("a").unwrap();
        hook(&store, &account).await;
        admin
            .batch_execute(&format!(
                "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
                 CREATE TRIGGER refuse BEFORE INSERT ON {schema}.deliveries \
                 FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse()"
            ))
            .await
            .unwrap();
        let req = PublishRequest::new(account.clone(), "a.b", serde_json::json!({}));
        let events = format!("SELECT count(*) FROM {schema}.events");
        let failed = store
            .event_publish_batch(
                control_plane_core::Checked::all(vec![req.clone(), req.clone()]).unwrap(),
            )
            .await;
        assert!(failed.is_err(), "{failed:?}");
        let stored: i64 = admin.query_one(&events, &[]).await.unwrap().get(0);
        assert_eq!(stored, 0, "the events outlived the failed delivery insert");
        // The pool's connection is usable again, outside any transaction.
        admin
            .batch_execute(&format!("DROP TRIGGER refuse ON {schema}.deliveries"))
            .await
            .unwrap();
        let published = store
            .event_publish_batch(control_plane_core::Checked::all(vec![req]).unwrap())
            .await
            .unwrap();
        assert_eq!(published[0].deliveries.len(), 1);
        let stored: i64 = admin.query_one(&events, &[]).await.unwrap().get(0);
        assert_eq!(stored, 1);
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
    /// The delivery path's statements (a keyless publish, a claim, an
    /// outcome batch with a success and a failure) run their cached generic
    /// plan (ADR 0040), and the same connection's other calls still plan for
    /// their parameters (the session's setting): PostgreSQL counts both
    /// kinds per prepared statement of the store's one pooled connection.
    #[tokio::test]
    async fn the_delivery_path_runs_generic_plans_and_other_calls_do_not() {
        let (store, admin) = open_test_store().await;
        let account = AccountId::new("a").unwrap();
        let claimed = published_and_claimed(&store, &account, 6).await;
        let outcomes = claimed
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let outcome = if i == 0 {
                    DeliveryOutcome::GiveUp(report(400))
                } else {
                    DeliveryOutcome::Delivered(report(200))
                };
                (c.lease.clone(), outcome)
            })
            .collect();
        for recorded in store.delivery_record_outcomes(outcomes).await.unwrap() {
            recorded.unwrap();
        }
        let plans = |sql: String| {
            let store = store.clone();
            async move {
                let client = store.pool.get().await.unwrap();
                let row = client
                    .query_opt(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                         WHERE statement = $1",
                        &[&sql],
                    )
                    .await
                    .unwrap();
                row.map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
                    .unwrap_or_else(|| panic!("not prepared on the connection: {sql}"))
            }
        };
        let list = format!(
            "SELECT {} FROM endpoints WHERE account = $1 AND deleted_at IS NULL ORDER BY created_at, id",
            control_plane_store_kit::columns::ENDPOINT_COLS
        );
        for sql in [
            publish::INSERT_EVENTS.to_string(),
            publish::INSERT_DELIVERIES.to_string(),
            publish::LOCK_ORDERED.to_string(),
            RECORD_DELIVERED.to_string(),
            list.clone(),
        ] {
            let (generic, custom) = plans(sql.clone()).await;
            assert!(
                generic >= 1 && custom == 0,
                "{generic} generic, {custom} custom plans: {sql}"
            );
        }
        // The same endpoint list, read through the API's call.
        assert_eq!(store.endpoint_list(&account).await.unwrap().len(), 1);
        let (_, custom) = plans(list).await;
        assert_eq!(custom, 1, "the endpoint list outside the delivery path");
        admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", store.schema()))
            .await
            .unwrap();
    }
    /// The generic plans of the delivery path's write statements, made on
    /// empty tables (the worst statistics they can be made with), read each
    /// row by index: no sequential scan, no hash or merge join, and a live
    /// row by its whole key, not among its endpoint's leases (ADR 0040).
    #[tokio::test]
    async fn the_delivery_path_generic_plans_read_by_index() {
        let (store, admin) = open_test_store().await;
        let u = "ARRAY[gen_random_uuid()]";
        // Each with its arguments and, where it finds a live row, how.
        let statements = [
            (
                publish::INSERT_EVENTS,
                format!("{u}, ARRAY['a'], ARRAY['t'], ARRAY['{{}}'], ARRAY[NULL::text], 0, ARRAY[NULL::text]"),
                None,
            ),
            (publish::INSERT_DELIVERIES, format!("{u}, ARRAY['a'], {u}, {u}, 5, 0"), None),
            (publish::LOCK_ORDERED, u.to_string(), None),
            (RECORD_DELIVERED, outcome_args(), Some(BY_WHOLE_KEY)),
        ];
        for (sql, args, finds) in statements {
            let plan = generic_plan(&store, &admin, sql, &args).await;
            assert!(!plan.contains("Seq Scan"), "a whole table scanned:\n{plan}");
            assert!(
                !plan.contains("Hash Join") && !plan.contains("Merge Join"),
                "whole tables joined:\n{plan}"
            );
            if let Some(finds) = finds {
                assert!(
                    plan.contains(finds),
                    "a live row not found by its whole key:\n{plan}"
                );
            }
        }
        admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", store.schema()))
            .await
            .unwrap();
    }

    /// How the outcome statement must find a live row: by its whole key.
    const BY_WHOLE_KEY: &str = "Index Cond: ((l.endpoint_id = d.endpoint_id) AND (l.seq = d.seq))";

    /// Arguments of [`RECORD_DELIVERED`] for one success.
    fn outcome_args() -> String {
        let u = "ARRAY[gen_random_uuid()]";
        format!(
            "{u}, {u}, ARRAY[NULL::text], ARRAY[200::bigint], ARRAY[1::bigint], 0, \
             ARRAY[NULL::text], ARRAY[1::smallint], 0, '{LEASED}'"
        )
    }

    /// The plan `sql` runs with `args` under the delivery path's settings
    /// (ADR 0040), prepared in `store`'s schema: the generic one.
    async fn generic_plan(
        store: &PostgresStore,
        admin: &tokio_postgres::Client,
        sql: &str,
        args: &str,
    ) -> String {
        admin
            .batch_execute(&format!(
                "BEGIN; SET LOCAL search_path TO {}; {}; PREPARE p AS {sql}",
                store.schema(),
                crate::store::GENERIC_PLANS
            ))
            .await
            .unwrap();
        let plan = texts(admin, &format!("EXPLAIN (VERBOSE) EXECUTE p ({args})")).await;
        admin.batch_execute("ROLLBACK; DEALLOCATE p").await.unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("$1"), "not the generic plan:\n{plan}");
        plan
    }

    /// The outcome statement's generic plan made where one endpoint holds
    /// 200,000 live rows, 1,000 of them leased, before the table has
    /// statistics (as in a burn-down's first seconds): the partial index of
    /// leases is then the smallest index by `endpoint_id`, and a plan that
    /// could use it would scan every lease of the endpoint per outcome (233
    /// ms per batch of 100, ADR 0040). The state as a parameter keeps it on
    /// the primary key.
    #[tokio::test]
    async fn the_outcome_generic_plan_finds_a_live_row_by_its_key_beside_many_leases() {
        let (store, admin) = open_test_store().await;
        admin
            .batch_execute(&format!(
                "INSERT INTO {}.delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, \
                 max_attempts, due_at, lease_token, lease_expires_at, updated_at) \
                 SELECT '00000000-0000-0000-0000-000000000001', n, gen_random_uuid(), 'a', \
                 CASE WHEN n <= 1000 THEN 'leased' ELSE 'pending' END, 0, 5, 0, \
                 CASE WHEN n <= 1000 THEN gen_random_uuid() END, CASE WHEN n <= 1000 THEN 1 END, 0 \
                 FROM generate_series(1, 200000) n",
                store.schema()
            ))
            .await
            .unwrap();
        let plan = generic_plan(&store, &admin, RECORD_DELIVERED, &outcome_args()).await;
        assert!(
            plan.contains(BY_WHOLE_KEY),
            "a live row not found by its whole key:\n{plan}"
        );
        assert!(!plan.contains("delivery_queue_leased"), "{plan}");
        admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", store.schema()))
            .await
            .unwrap();
    }

    /// The first column of what `sql` returns, as text.
    async fn texts(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
        let rows = client.query(sql, &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }
}
