//! The live index's own rules, without a table.
use control_plane_core::LeaseToken;

use super::*;

fn built() -> LiveIndex {
    windowed(1_000)
}

fn queue(index: &LiveIndex, e: EndpointId) -> Option<&EndpointQueue> {
    match index {
        LiveIndex::Built { queues, .. } => queues.get(&e),
        _ => None,
    }
}

fn live(row: LeaseRow) -> LiveRow {
    LiveRow {
        row,
        event_id: EventId::new(),
        created_at: Timestamp::from_millis(0),
        last_error: None,
        updated_at: Timestamp::from_millis(0),
    }
}

fn pending_row(e: EndpointId, seq: i64, id: DeliveryId, due: i64) -> LiveRow {
    live(LeaseRow {
        id,
        seq,
        account: AccountId::new("a").unwrap(),
        endpoint_id: e,
        attempts: 0,
        max_attempts: 8,
        due_at: Timestamp::from_millis(due),
        state: DeliveryState::Pending,
        lease_token: None,
        lease_expires_at: None,
        last_outcome: None,
    })
}

fn leased_row(e: EndpointId, seq: i64, id: DeliveryId, expires: i64) -> LeaseRow {
    LeaseRow {
        id,
        seq,
        account: AccountId::new("a").unwrap(),
        endpoint_id: e,
        attempts: 1,
        max_attempts: 8,
        due_at: Timestamp::from_millis(0),
        state: DeliveryState::Leased,
        lease_token: Some(LeaseToken::new()),
        lease_expires_at: Some(Timestamp::from_millis(expires)),
        last_outcome: None,
    }
}

/// Pending deliveries are served by due time then seq; a lease takes
/// one out of the due set, keeps its row, and counts until it expires;
/// a finished one leaves the endpoint, and an endpoint with nothing live
/// is dropped.
#[test]
fn deliveries_move_between_due_leased_and_gone() {
    let e = EndpointId::new();
    let (a, b, c) = (DeliveryId::new(), DeliveryId::new(), DeliveryId::new());
    let mut index = built();
    let first = pending_row(e, 1, a, 100);
    index.put(first.clone());
    index.put(pending_row(e, 2, b, 50));
    index.put(pending_row(e, 3, c, 500));
    assert_eq!(
        index.pending(a),
        Some(&first),
        "a pending row is kept whole"
    );
    let q = queue(&index, e).unwrap();
    let due: Vec<i64> = q.due_at(100).map(|(_, seq, _)| *seq).collect();
    assert_eq!(due, [2, 1], "due by time, the later one not yet");
    assert_eq!(
        q.due_head(100),
        Some((100, 1, a)),
        "the head is the lowest seq"
    );

    let row = leased_row(e, 1, a, 1_000);
    index.moved(&row, None, Timestamp::from_millis(0));
    assert_eq!(index.leased(a), Some(&row));
    assert_eq!(index.pending(a), None);
    let q = queue(&index, e).unwrap();
    assert_eq!(q.due_at(100).count(), 1);
    assert_eq!(q.in_flight(999), 1);
    assert_eq!(q.in_flight(1_000), 0, "an expired lease is not in flight");
    assert_eq!(
        q.due_head(1_000),
        None,
        "a leased head holds an ordered endpoint"
    );
    assert!(index.may_have_expired(Timestamp::from_millis(1_000)));
    assert!(!index.may_have_expired(Timestamp::from_millis(999)));

    index.extend(
        a,
        Timestamp::from_millis(2_000),
        Timestamp::from_millis(1_500),
    );
    assert_eq!(queue(&index, e).unwrap().in_flight(1_500), 1);
    assert_eq!(
        index.leased(a).and_then(|r| r.lease_expires_at),
        Some(Timestamp::from_millis(2_000))
    );

    let mut retry = row.clone();
    retry.state = DeliveryState::Pending;
    retry.due_at = Timestamp::from_millis(700);
    index.moved(
        &retry,
        Some(Some("503".to_string())),
        Timestamp::from_millis(0),
    );
    let kept = index.pending(a).expect("pending again");
    assert_eq!(
        (kept.event_id, kept.last_error.as_deref()),
        (first.event_id, Some("503")),
        "a move keeps the event and takes the new error"
    );
    assert_eq!(
        queue(&index, e).unwrap().in_flight(0),
        0,
        "a retry frees the lease"
    );
    assert_eq!(index.leased(a), None);
    for id in [a, b, c] {
        let mut done = index.pending(id).expect("pending").row.clone();
        done.state = DeliveryState::Delivered;
        index.moved(&done, None, Timestamp::from_millis(0));
    }
    assert!(queue(&index, e).is_none());
    let LiveIndex::Built { len, .. } = index else {
        panic!("still built")
    };
    assert_eq!(len, 0);
}

/// Changes to a stale index are dropped: it is rebuilt from the table.
#[test]
fn a_stale_index_ignores_changes_until_rebuilt() {
    let mut index = built();
    index.forget();
    let (e, id) = (EndpointId::new(), DeliveryId::new());
    index.put(pending_row(e, 1, id, 0));
    index.put(live(leased_row(e, 2, DeliveryId::new(), 10)));
    assert_eq!(index, LiveIndex::Stale);
    assert!(!index.is_built());
    assert!(index.may_have_expired(Timestamp::from_millis(0)));
}

/// A move of a delivery the kept index does not hold means it is out of
/// step: it is dropped, to be rebuilt from the table.
#[test]
fn a_move_of_an_unknown_delivery_drops_the_index() {
    let mut index = built();
    let row = leased_row(EndpointId::new(), 1, DeliveryId::new(), 10);
    index.moved(&row, None, Timestamp::from_millis(0));
    assert_eq!(index, LiveIndex::Stale);
}

fn windowed(window: usize) -> LiveIndex {
    LiveIndex::empty(LiveBounds {
        limit: 1_000,
        window,
    })
}

/// Past its window an endpoint's pending deliveries are counted, not kept;
/// a claim is short of them only when one past the window may be due
/// before the last one it would take; a retry below the window's top stays
/// in the window.
#[test]
fn a_backlog_past_its_window_is_counted_not_kept() {
    let e = EndpointId::new();
    let mut index = windowed(2);
    let ids: Vec<DeliveryId> = (0..5).map(|_| DeliveryId::new()).collect();
    for (seq, id) in (1..=5).zip(&ids) {
        index.put(pending_row(e, seq, *id, 100 + seq));
    }
    let q = queue(&index, e).unwrap();
    let kept: Vec<i64> = q.pending_by_seq().map(|(seq, _)| seq).collect();
    assert_eq!(kept, [1, 2], "the window holds the lowest seqs");
    assert_eq!(q.overflow().map(|(a, n)| (a.as_str(), n)), Some(("a", 3)));
    let LiveIndex::Built { len, .. } = &index else {
        panic!("still built")
    };
    assert_eq!(*len, 2, "only kept rows count toward the limit");
    assert!(!q.short_for_claim(102, 3), "nothing past the window is due");
    assert!(q.short_for_claim(103, 3), "seq 3 is due: more must be read");
    assert!(!q.short_for_claim(500, 2), "the two oldest due are kept");
    assert!(q.short_for_seqs(3));
    assert!(!q.short_for_seqs(2));

    // Seq 1 is leased, then comes back as a retry due much later: it
    // stays in the window, and the claim of two is now short.
    let mut row = leased_row(e, 1, ids[0], 10_000);
    index.moved(&row, None, Timestamp::from_millis(0));
    row.state = DeliveryState::Pending;
    row.lease_token = None;
    row.lease_expires_at = None;
    row.due_at = Timestamp::from_millis(9_000);
    index.moved(&row, None, Timestamp::from_millis(0));
    let q = queue(&index, e).unwrap();
    assert_eq!(q.pending_by_seq().count(), 2);
    assert_eq!(q.overflow().map(|(_, n)| n), Some(3));
    assert!(q.short_for_claim(500, 2), "only seq 2 is due in the window");
    assert!(
        !q.short_for_claim(500, 1),
        "seq 2 is due before any past it"
    );

    // An endpoint that only overflows stays in the index.
    for id in [ids[0], ids[1]] {
        let mut done = index.pending(id).expect("pending").row.clone();
        done.state = DeliveryState::Delivered;
        index.moved(&done, None, Timestamp::from_millis(0));
    }
    let q = queue(&index, e).expect("kept for its overflow");
    assert_eq!(q.pending_by_seq().count(), 0);
    assert!(q.short_for_claim(500, 1));
}

/// A disabled endpoint's backlog many times the index's limit: the index
/// stays kept (claims of the other endpoint never scan the table), the
/// counts include the backlog, and once the endpoint is enabled every one
/// of its deliveries is claimed once, in order, a window at a time. The
/// store checks the index against the table at every claim.
#[tokio::test]
async fn a_waiting_backlog_past_the_windows_keeps_the_index_and_loses_nothing() {
    use crate::store::Lane;
    use crate::EmbeddedConfig;
    use control_plane_core::{
        AttemptReport, Check, ClaimRequest, DeliveryOutcome, DeliveryStore, Enablement,
        EndpointCreateRequest, EndpointKey, EndpointStore, EventStore, ManualClock, PublishRequest,
        Secret,
    };
    use std::sync::Arc;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig {
        live_index_limit: 50,
        live_window: 10,
        check_against_table: true,
        ..EmbeddedConfig::new(dir.path().join("s.duckdb"))
    };
    let store = crate::EmbeddedStore::open(config, Arc::new(ManualClock::default()))
        .await
        .unwrap();
    let account = AccountId::new("a").unwrap();
    let mut ids = Vec::new();
    for kind in ["held", "live"] {
        let mut req = EndpointCreateRequest::new(
            account.clone(),
            format!("https://example.com/{kind}"),
            Secret::new("whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0"),
        );
        req.event_types = vec![format!("{kind}.t")];
        req.max_in_flight = Some(1_000);
        ids.push(
            store
                .endpoint_create(req.checked().unwrap())
                .await
                .unwrap()
                .id,
        );
    }
    let (held, live) = (ids[0], ids[1]);
    let key = EndpointKey::new(&account, held);
    store
        .endpoint_set_enabled(key, Enablement::Disabled { reason: None })
        .await
        .unwrap();
    for (kind, n) in [("held", 200), ("live", 20)] {
        for i in 0..n {
            let req = PublishRequest::new(
                account.clone(),
                format!("{kind}.t"),
                serde_json::json!({ "i": i }),
            );
            store.event_publish(req.checked().unwrap()).await.unwrap();
        }
    }
    let kept = || async {
        store
            .call(Lane::Work, |w| w.tx(|t| Ok(t.live_queues()?.is_some())))
            .await
            .unwrap()
    };
    let claim = |limit| ClaimRequest::new("w", limit, Duration::from_secs(60)).unwrap();
    let got = store.delivery_claim(claim(100)).await.unwrap();
    assert_eq!(got.len(), 20);
    assert!(got.iter().all(|c| c.delivery.endpoint_id == live));
    assert!(
        kept().await,
        "220 live deliveries, 50 kept at most: the index stays"
    );
    let pending = store.delivery_count_by_state().await.unwrap();
    assert!(
        pending.contains(&(DeliveryState::Pending, 200)),
        "{pending:?}"
    );

    store
        .endpoint_set_enabled(key, Enablement::Enabled)
        .await
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        let got = store.delivery_claim(claim(7)).await.unwrap();
        if got.is_empty() {
            break;
        }
        for c in got {
            assert_eq!(c.delivery.endpoint_id, held);
            seqs.push(c.delivery.seq);
            let ok = DeliveryOutcome::Delivered(AttemptReport::default());
            store.delivery_record_outcome(&c.lease, ok).await.unwrap();
        }
        assert!(kept().await);
    }
    assert_eq!(seqs.len(), 200, "each held delivery claimed once");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
    let left = store.delivery_count_by_state().await.unwrap();
    assert!(
        !left.iter().any(|(s, _)| *s == DeliveryState::Pending),
        "{left:?}"
    );
}
