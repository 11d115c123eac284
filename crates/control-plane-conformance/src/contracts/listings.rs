//! Contracts of what the store lists and counts of finished and live
//! deliveries: listings, counts by state, the attempt log, its search, its
//! stats and rollup.

use crate::contracts::fixtures::{
    acct, attempts, claim, endpoint, endpoint_for, fail_at, ok, open, publish, purge_all, record,
    rows, with_attempts, LEASE,
};
use crate::{Harness, StoreFactory};
use control_plane_core::{
    latency_bucket, latency_bucket_bound, AttemptQuery, AttemptRecord, AttemptReport,
    AttemptResult, AttemptStats, Clock, Delivery, DeliveryListRequest, DeliveryOutcome,
    DeliveryState, EndpointKey, PageRequest, ReplayFilter, StoreError,
};
use std::collections::HashSet;
use std::time::Duration;

/// `AttemptLogStore::attempt_stats`: one endpoint's window, nearest-rank latencies.
pub async fn attempt_stats_count_results_and_rank_latencies(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e = endpoint(&h, "a", false).await;
    let quiet = endpoint_for(&h, "a", &["other.type"]).await;
    let answered = |latency_ms: u64| AttemptReport {
        status_code: Some(200),
        error: None,
        latency_ms,
        response_body: None,
    };
    // One attempt two hours ago, then four in the last hour.
    publish(&h, "a").await;
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, DeliveryOutcome::Delivered(answered(1000))).await;
    h.clock.advance(Duration::from_secs(2 * 3600));
    for _ in 0..4 {
        publish(&h, "a").await;
    }
    let recent = claim(&h, 10).await;
    assert_eq!(recent.len(), 4);
    for (c, ms) in recent.iter().zip([40, 10, 30, 20]) {
        let outcome = if ms == 30 {
            DeliveryOutcome::Retry {
                at: h.clock.now().plus(Duration::from_secs(60)),
                report: answered(ms),
            }
        } else {
            DeliveryOutcome::Delivered(answered(ms))
        };
        record(&h, c, outcome).await;
    }
    let now = h.clock.now();
    let hour = h
        .store
        .attempt_stats(
            EndpointKey::new(&acct("a"), e.id),
            now.minus(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    // Percentiles come from the rollup's latency buckets: the exact nearest
    // rank (20 and 40 ms here) reported as its bucket's upper bound.
    let bucket = |ms| Some(latency_bucket_bound(latency_bucket(ms)));
    assert_eq!(
        hour,
        AttemptStats {
            delivered: 3,
            failed: 1,
            lease_expired: 0,
            p50_latency_ms: bucket(20),
            p95_latency_ms: bucket(40),
        }
    );
    assert_eq!(hour.success_rate(), Some(0.75));
    let day = h
        .store
        .attempt_stats(
            EndpointKey::new(&acct("a"), e.id),
            now.minus(Duration::from_secs(86_400)),
        )
        .await
        .unwrap();
    assert_eq!((day.delivered, day.failed), (4, 1));
    assert_eq!(
        (day.p50_latency_ms, day.p95_latency_ms),
        (bucket(30), bucket(1000))
    );
    let none = h
        .store
        .attempt_stats(
            EndpointKey::new(&acct("a"), quiet.id),
            now.minus(Duration::from_secs(86_400)),
        )
        .await
        .unwrap();
    assert_eq!(none, AttemptStats::default());
    let r = h
        .store
        .attempt_stats(
            EndpointKey::new(&acct("b"), e.id),
            now.minus(Duration::from_secs(86_400)),
        )
        .await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
}

/// `DeliveryStore::delivery_list`: filters and keyset pages.
pub async fn delivery_list_filters_and_paginates(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    endpoint(&h, "a", false).await;
    let mut events = Vec::new();
    for _ in 0..5 {
        events.push(publish(&h, "a").await);
    }
    let list = |state, endpoint_id, event_id, page| {
        h.store.delivery_list(DeliveryListRequest {
            state,
            endpoint_id,
            event_id,
            ..DeliveryListRequest::all(acct("a"), page)
        })
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = list(None, None, None, PageRequest::new(3, after).unwrap())
            .await
            .unwrap();
        assert!(p.items.len() <= 3);
        seen.extend(p.items.iter().map(|d| d.seq));
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no overlap: {seen:?}"
    );
    let by_ep = list(None, Some(e1.id), None, PageRequest::first(100))
        .await
        .unwrap();
    assert_eq!(by_ep.items.len(), 5);
    assert!(by_ep.items.iter().all(|d| d.endpoint_id == e1.id));
    let by_ev = list(
        None,
        None,
        Some(events[2].event.id),
        PageRequest::first(100),
    )
    .await
    .unwrap();
    assert_eq!(by_ev.items.len(), 2);
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, ok()).await;
    let delivered = list(
        Some(DeliveryState::Delivered),
        None,
        None,
        PageRequest::first(100),
    )
    .await
    .unwrap();
    assert_eq!(
        delivered.items.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![c.delivery.id]
    );
    assert_eq!(delivered.next, None);
    // A limit of 0 cannot be asked for: the page request refuses it when
    // built (and `first` brings a limit into 1..=1000).
    assert!(matches!(
        PageRequest::new(0, None),
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(PageRequest::first(0).limit(), 1);
    assert_eq!(PageRequest::first(5000).limit(), 1000);
}

/// `AttemptLogStore::attempt_list_for_delivery`: oldest first.
pub async fn attempt_log_lists_by_delivery_oldest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    let id = publish(&h, "a").await.deliveries[0];
    for _ in 0..2 {
        let c = claim(&h, 1).await.remove(0);
        record(&h, &c, fail_at(h.clock.now())).await;
        h.clock.advance(Duration::from_secs(1));
    }
    let c = claim(&h, 1).await.remove(0);
    record(&h, &c, ok()).await;
    let log = attempts(&h, "a", id).await;
    assert_eq!(
        log.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        log.iter().map(|a| a.result).collect::<Vec<_>>(),
        vec![
            AttemptResult::Failed,
            AttemptResult::Failed,
            AttemptResult::Delivered
        ]
    );
    assert!(log
        .windows(2)
        .all(|w| w[0].recorded_at < w[1].recorded_at && w[0].id < w[1].id));
    assert!(log.iter().all(|a| a.delivery_id == id));
}

/// `AttemptLogStore::attempt_search` of an endpoint: newest first, pages
/// cover every row once.
pub async fn attempt_log_pages_by_endpoint_newest_first(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", false).await;
    for _ in 0..4 {
        publish(&h, "a").await;
    }
    for c in claim(&h, 8).await {
        record(&h, &c, fail_at(h.clock.now())).await;
    }
    for c in claim(&h, 8)
        .await
        .into_iter()
        .filter(|c| c.delivery.endpoint_id == e1.id)
        .take(3)
    {
        record(&h, &c, ok()).await;
    }
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let p = h
            .store
            .attempt_search(
                AttemptQuery::new(acct("a"), PageRequest::new(3, after).unwrap())
                    .of_endpoint(e1.id),
            )
            .await
            .unwrap();
        rows.extend(p.items);
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|a| a.endpoint_id == e1.id));
    assert!(rows.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert_eq!(rows[0].result, AttemptResult::Delivered);
    let e2_rows = h
        .store
        .attempt_search(AttemptQuery::new(acct("a"), PageRequest::first(100)).of_endpoint(e2.id))
        .await
        .unwrap();
    assert_eq!(e2_rows.items.len(), 4);
    let other = h
        .store
        .attempt_search(AttemptQuery::new(acct("b"), PageRequest::first(10)).of_endpoint(e1.id))
        .await;
    assert!(matches!(other, Err(StoreError::NotFound { .. })));
}

/// `AttemptLogStore::attempt_search` with filters: by result, by status
/// code, by time window and across an account's endpoints, each narrowing,
/// combined; nothing of another account.
pub async fn attempts_are_searched_by_result_status_and_time(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    publish(&h, "a").await;
    publish(&h, "a").await;
    publish(&h, "b").await;
    // First round, at t0: every attempt fails with a 500.
    let t0 = h.clock.now();
    let failed = AttemptReport {
        status_code: Some(500),
        error: Some("HTTP 500".into()),
        latency_ms: 3,
        response_body: None,
    };
    for c in claim(&h, 10).await {
        let at = h.clock.now();
        record(
            &h,
            &c,
            DeliveryOutcome::Retry {
                at,
                report: failed.clone(),
            },
        )
        .await;
    }
    // Second round, a minute later: e1's succeed, e2's fail with a 503.
    h.clock.advance(Duration::from_secs(60));
    let t1 = h.clock.now();
    for c in claim(&h, 10).await {
        let outcome = if c.delivery.endpoint_id == e1.id {
            ok()
        } else {
            DeliveryOutcome::Retry {
                at: h.clock.now(),
                report: AttemptReport {
                    status_code: Some(503),
                    ..failed.clone()
                },
            }
        };
        record(&h, &c, outcome).await;
    }
    let search = |q: AttemptQuery| {
        let h = &h;
        async move { h.store.attempt_search(q).await.unwrap().items }
    };
    let of_a = || AttemptQuery::new(acct("a"), PageRequest::first(100));
    let everything = search(of_a()).await;
    assert_eq!(everything.len(), 8, "2 events x 2 endpoints x 2 rounds");
    assert!(everything.iter().all(|r| r.account == acct("a")));
    assert!(everything.windows(2).all(|w| w[0].id > w[1].id));
    let q = AttemptQuery {
        result: Some(AttemptResult::Delivered),
        ..of_a()
    };
    let delivered = search(q).await;
    assert_eq!(delivered.len(), 2);
    assert!(delivered.iter().all(|r| r.endpoint_id == e1.id));
    let q = AttemptQuery {
        status_code: Some(500),
        ..of_a()
    };
    let five_hundreds = search(q).await;
    assert_eq!(five_hundreds.len(), 4);
    assert!(five_hundreds.iter().all(|r| r.recorded_at == t0));
    let q = AttemptQuery {
        since: Some(t1),
        ..of_a()
    };
    assert_eq!(search(q).await.len(), 4);
    let q = AttemptQuery {
        until: Some(t1),
        ..of_a()
    };
    assert_eq!(search(q).await.len(), 4);
    let q = AttemptQuery {
        result: Some(AttemptResult::Failed),
        since: Some(t1),
        ..of_a().of_endpoint(e2.id)
    };
    let late_failures = search(q).await;
    assert_eq!(late_failures.len(), 2);
    assert!(late_failures
        .iter()
        .all(|r| r.endpoint_id == e2.id && r.status_code == Some(503)));
    // Paged with filters: the pages cover the rows once.
    let q = AttemptQuery {
        result: Some(AttemptResult::Failed),
        page: PageRequest::first(4),
        ..of_a()
    };
    let first = h.store.attempt_search(q.clone()).await.unwrap();
    assert_eq!(first.items.len(), 4);
    let rest = h
        .store
        .attempt_search(AttemptQuery {
            page: PageRequest::new(4, first.next).unwrap(),
            ..q
        })
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 2);
    assert!(rest.next.is_none());
    assert!(rest.items[0].id < first.items[3].id);
}

/// `DeliveryStore::delivery_count_by_account_and_state`: exact counts per
/// account and state, which sum to `delivery_count_by_state`.
pub async fn deliveries_are_counted_by_account_and_state(f: &dyn StoreFactory) {
    let h = open(f).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    for _ in 0..3 {
        publish(&h, "a").await;
    }
    publish(&h, "b").await;
    let c = claim(&h, 2).await;
    record(&h, &c[0], ok()).await;
    let mut counts = h.store.delivery_count_by_account_and_state().await.unwrap();
    counts.sort_by(|x, y| (x.0.as_str(), x.1.as_str()).cmp(&(y.0.as_str(), y.1.as_str())));
    let leased_account = c[1].delivery.account.as_str().to_string();
    let delivered_account = c[0].delivery.account.as_str().to_string();
    let mut expected: Vec<(String, DeliveryState, u64)> = Vec::new();
    for account in ["a", "b"] {
        let total = if account == "a" { 3 } else { 1 };
        let delivered = u64::from(account == delivered_account);
        let leased = u64::from(account == leased_account);
        for (state, n) in [
            (DeliveryState::Delivered, delivered),
            (DeliveryState::Leased, leased),
            (DeliveryState::Pending, total - delivered - leased),
        ] {
            if n > 0 {
                expected.push((account.to_string(), state, n));
            }
        }
    }
    expected.sort_by(|x, y| (x.0.as_str(), x.1.as_str()).cmp(&(y.0.as_str(), y.1.as_str())));
    let got: Vec<(String, DeliveryState, u64)> = counts
        .iter()
        .map(|(a, s, n)| (a.as_str().to_string(), *s, *n))
        .collect();
    assert_eq!(got, expected);
    let mut by_state = h.store.delivery_count_by_state().await.unwrap();
    by_state.sort_by_key(|(s, _)| s.as_str());
    let mut summed: std::collections::BTreeMap<&str, u64> = Default::default();
    for (_, s, n) in &counts {
        *summed.entry(s.as_str()).or_default() += n;
    }
    let by_state: Vec<(&str, u64)> = by_state.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    assert_eq!(by_state, summed.into_iter().collect::<Vec<_>>());
}

/// `AttemptLogStore::attempt_list_for_delivery`: each attempt keeps the
/// start of the answer's body as reported, on every path an outcome takes
/// (a single retry, a batch of successes), a NUL replaced (PostgreSQL text
/// cannot hold one), and none for a lost lease.
pub async fn attempts_keep_the_start_of_each_answer(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(3)).await;
    endpoint(&h, "a", false).await;
    let first = publish(&h, "a").await.deliveries[0];
    let second = publish(&h, "a").await.deliveries[0];
    let report = |code: u16, body: Option<&str>| AttemptReport {
        status_code: Some(code),
        error: None,
        latency_ms: 5,
        response_body: body.map(str::to_string),
    };
    let c = claim(&h, 2).await;
    let retry = DeliveryOutcome::Retry {
        at: h.clock.now(),
        report: report(503, Some("busy,\0 try later")),
    };
    record(&h, &c[0], retry).await;
    // The other one's lease runs out: its attempt has no answer at all.
    h.clock.advance(LEASE + Duration::from_secs(1));
    let again = claim(&h, 2).await;
    assert_eq!(again.len(), 2);
    let batch = again
        .iter()
        .map(|c| {
            let body = (c.delivery.id == first).then_some("{\"ok\":true}");
            (
                c.lease.clone(),
                DeliveryOutcome::Delivered(report(200, body)),
            )
        })
        .collect();
    for r in h.store.delivery_record_outcomes(batch).await.unwrap() {
        assert!(!r.unwrap().duplicate);
    }
    let bodies = |log: Vec<AttemptRecord>| -> Vec<Option<String>> {
        log.into_iter().map(|a| a.response_body).collect()
    };
    let log = attempts(&h, "a", first).await;
    assert_eq!(
        bodies(log),
        [
            Some("busy,\u{FFFD} try later".to_string()),
            Some("{\"ok\":true}".to_string())
        ]
    );
    let log = attempts(&h, "a", second).await;
    assert_eq!(
        bodies(log),
        [None, None],
        "a lost lease, then a success without a body"
    );
}

/// Every delivery of `account` in `state` (all states for `None`), paged
/// through `per_page` at a time.
async fn listed(
    h: &Harness,
    account: &str,
    state: Option<DeliveryState>,
    per_page: u32,
) -> Vec<Delivery> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let p = h
            .store
            .delivery_list(DeliveryListRequest {
                state,
                ..DeliveryListRequest::all(
                    acct(account),
                    PageRequest::new(per_page, after).unwrap(),
                )
            })
            .await
            .unwrap();
        all.extend(p.items);
        match p.next {
            Some(n) => after = Some(n),
            None => return all,
        }
    }
}

/// Counts by account and state as the listings see them: every delivery of
/// `accounts`, paged through, counted by state (rows with none left out).
/// Each state's own listing, paged two at a time, holds the same
/// deliveries, newest first.
async fn counted_by_listing(h: &Harness, accounts: &[&str]) -> Vec<(String, DeliveryState, u64)> {
    let mut counts: std::collections::BTreeMap<(String, &'static str), (DeliveryState, u64)> =
        Default::default();
    for account in accounts {
        let all = listed(h, account, None, 50).await;
        for d in &all {
            counts
                .entry((account.to_string(), d.state.as_str()))
                .or_insert((d.state, 0))
                .1 += 1;
        }
        for state in [
            DeliveryState::Pending,
            DeliveryState::Leased,
            DeliveryState::Delivered,
            DeliveryState::Dead,
        ] {
            let want: Vec<&Delivery> = all.iter().filter(|d| d.state == state).collect();
            let got = listed(h, account, Some(state), 2).await;
            assert_eq!(
                got.iter().collect::<Vec<_>>(),
                want,
                "the {state:?} listing of {account}"
            );
        }
    }
    counts
        .into_iter()
        .map(|((a, _), (s, n))| (a, s, n))
        .collect()
}

/// Both count methods against the listings, after `step`.
async fn counts_agree(h: &Harness, step: &str) {
    let want = counted_by_listing(h, &["a", "b"]).await;
    let mut got: Vec<(String, DeliveryState, u64)> = h
        .store
        .delivery_count_by_account_and_state()
        .await
        .unwrap()
        .into_iter()
        .map(|(a, s, n)| (a.as_str().to_string(), s, n))
        .collect();
    got.sort_by(|x, y| (x.0.as_str(), x.1.as_str()).cmp(&(y.0.as_str(), y.1.as_str())));
    assert_eq!(got, want, "by account and state, after {step}");
    let mut summed: std::collections::BTreeMap<&str, u64> = Default::default();
    for (_, s, n) in &want {
        *summed.entry(s.as_str()).or_default() += n;
    }
    let mut by_state: Vec<(&str, u64)> = h
        .store
        .delivery_count_by_state()
        .await
        .unwrap()
        .iter()
        .map(|(s, n)| (s.as_str(), *n))
        .collect();
    by_state.sort();
    assert_eq!(
        by_state,
        summed.into_iter().collect::<Vec<_>>(),
        "by state, after {step}"
    );
}

/// `DeliveryStore::delivery_count_by_state` and
/// `delivery_count_by_account_and_state`: the counts, kept as deliveries
/// move rather than counted from the history, agree with the listings after
/// every kind of move.
pub async fn delivery_counts_follow_every_move(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(2)).await;
    endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    for _ in 0..6 {
        publish(&h, "a").await;
    }
    for _ in 0..2 {
        publish(&h, "b").await;
    }
    counts_agree(&h, "publish").await;
    let c = claim(&h, 8).await;
    assert_eq!(c.len(), 8);
    counts_agree(&h, "claim").await;
    record(&h, &c[0], ok()).await;
    record(&h, &c[1], ok()).await;
    record(&h, &c[2], fail_at(h.clock.now())).await;
    record(&h, &c[3], DeliveryOutcome::GiveUp(AttemptReport::default())).await;
    counts_agree(&h, "delivered, retried and given up").await;
    // The rest of the leases expire; the next claim's sweep logs them.
    h.clock.advance(LEASE + Duration::from_secs(1));
    let again = claim(&h, 100).await;
    counts_agree(&h, "lease expiry").await;
    // Second attempts of every delivery: half fail for good (the attempt
    // budget is 2), half are delivered.
    for (i, c) in again.iter().enumerate() {
        let outcome = if i % 2 == 0 {
            fail_at(h.clock.now())
        } else {
            ok()
        };
        record(&h, c, outcome).await;
    }
    counts_agree(&h, "exhausted attempts").await;
    h.store
        .delivery_replay(&acct(c[3].delivery.account.as_str()), c[3].delivery.id)
        .await
        .unwrap();
    h.store
        .delivery_resend(&acct(c[0].delivery.account.as_str()), c[0].delivery.id)
        .await
        .unwrap();
    counts_agree(&h, "replay and resend").await;
    h.store
        .delivery_replay_dead(ReplayFilter::all(acct("b")))
        .await
        .unwrap();
    counts_agree(&h, "bulk replay").await;
    h.store.endpoint_delete(&acct("a"), e2.id).await.unwrap();
    counts_agree(&h, "endpoint delete").await;
    // Everything left is delivered, then the history ages out.
    loop {
        let c = claim(&h, 100).await;
        if c.is_empty() {
            break;
        }
        for c in &c {
            record(&h, c, ok()).await;
        }
    }
    counts_agree(&h, "all delivered").await;
    let retention = Duration::from_secs(3600);
    h.clock.advance(retention + Duration::from_secs(1));
    let purged = purge_all(&h, retention).await;
    assert!(purged.deliveries > 0, "{purged:?}");
    counts_agree(&h, "retention").await;
}

/// `AttemptLogStore::attempt_rollup_of_account`: one read gives, summed per
/// endpoint, what `attempt_stats` gives each endpoint of the account, and
/// nothing of other accounts or of endpoints without attempts.
pub async fn attempt_rollup_of_an_account_matches_each_endpoints_stats(f: &dyn StoreFactory) {
    let h = open(f).await;
    let e1 = endpoint(&h, "a", false).await;
    let e2 = endpoint(&h, "a", false).await;
    let quiet = endpoint_for(&h, "a", &["other.type"]).await;
    endpoint(&h, "b", false).await;
    for round in 0..3u64 {
        // Two attempts of each endpoint per round, alike: two deltas of one
        // rollup key, which maintenance folds.
        for _ in 0..2 {
            publish(&h, "a").await;
            publish(&h, "b").await;
        }
        let claimed = claim(&h, 100).await;
        for c in &claimed {
            let report = AttemptReport {
                status_code: Some(200),
                error: None,
                latency_ms: 5 + 40 * round,
                response_body: None,
            };
            let outcome = if round == 1 {
                DeliveryOutcome::GiveUp(report)
            } else {
                DeliveryOutcome::Delivered(report)
            };
            record(&h, c, outcome).await;
        }
        // Each round in its own minute.
        h.clock.advance(Duration::from_secs(61));
    }
    let since = h.clock.now().minus(Duration::from_secs(3600));
    // Maintenance folds the rollup's deltas into one row per key: what they
    // sum to stays the same.
    let a = acct("a");
    let key = EndpointKey::new(&a, e1.id);
    let unfolded = h.store.attempt_stats(key, since).await.unwrap();
    h.store
        .maintenance_purge(Duration::from_secs(86_400), rows(500))
        .await
        .unwrap();
    let folded = h.store.attempt_stats(key, since).await.unwrap();
    assert_eq!(folded, unfolded, "the same stats after the fold");
    let rows = h
        .store
        .attempt_rollup_of_account(&acct("a"), since)
        .await
        .unwrap();
    let mut sorted = rows.clone();
    sorted.sort();
    assert_eq!(rows, sorted, "in key order");
    let minutes: HashSet<i64> = rows.iter().map(|r| r.minute).collect();
    assert_eq!(minutes.len(), 3, "a row per minute: {rows:?}");
    for e in [&e1, &e2] {
        let one = h
            .store
            .attempt_stats(EndpointKey::new(&acct("a"), e.id), since)
            .await
            .unwrap();
        assert_eq!(one.answered(), 6, "{one:?}");
        assert_eq!(one.failed, 2, "{one:?}");
        let summed = AttemptStats::from_rollup(
            rows.iter()
                .filter(|r| r.endpoint_id == e.id)
                .map(|r| (r.result, r.bucket, r.n as u64)),
        );
        assert_eq!(summed, one);
    }
    assert!(rows
        .iter()
        .all(|r| r.endpoint_id == e1.id || r.endpoint_id == e2.id));
    assert!(rows.iter().all(|r| r.endpoint_id != quiet.id));
}
