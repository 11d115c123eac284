//! Contracts of the delivery listing's filters by the event's type and
//! the creation time.

use crate::contracts::fixtures::{
    acct, claim, endpoint, fail_at, ok, publish_ok, publish_req, record, with_attempts,
};
use crate::StoreFactory;
use control_plane_core::{Clock, DeliveryListRequest, DeliveryState, PageRequest};
use std::time::Duration;

/// `DeliveryStore::delivery_list`: the event's type and the creation time
/// filter a listing in every state, alone, together and with the other
/// filters, and page like the rest. Each answer is checked against the
/// unfiltered listing filtered here.
pub async fn deliveries_are_filtered_by_event_type_and_time(f: &dyn StoreFactory) {
    let h = f.open(with_attempts(1)).await;
    let e1 = endpoint(&h, "a", false).await;
    endpoint(&h, "a", false).await;
    endpoint(&h, "b", false).await;
    let start = h.clock.now();
    let mut types = std::collections::HashMap::new();
    for ty in ["a.one", "a.two", "a.one", "a.two"] {
        let p = publish_ok(&h, publish_req("a", ty)).await;
        types.insert(p.event.id, ty);
        publish_ok(&h, publish_req("b", ty)).await;
        h.clock.advance(Duration::from_secs(1));
    }
    // One delivered, one dead, one leased; the rest pending.
    let c = claim(&h, 3).await;
    assert_eq!(c.len(), 3, "{c:?}");
    record(&h, &c[0], ok()).await;
    let later = h.clock.now().plus(Duration::from_secs(60));
    assert_eq!(
        record(&h, &c[1], fail_at(later)).await.state,
        DeliveryState::Dead
    );
    let first_event = *types.keys().next().unwrap();
    let list = |state, (endpoint_id, event_id), event_type: Option<&str>, since, until, page| {
        let mut req = DeliveryListRequest::all(acct("a"), page);
        req.state = state;
        req.endpoint_id = endpoint_id;
        req.event_id = event_id;
        req.event_type = event_type.map(str::to_string);
        req.since = since;
        req.until = until;
        h.store.delivery_list(req)
    };
    let all = list(
        None,
        (None, None),
        None,
        None,
        None,
        PageRequest::first(100),
    )
    .await
    .unwrap()
    .items;
    assert_eq!(all.len(), 8);
    let at = |s: u64| Some(start.plus(Duration::from_secs(s)));
    let states = [
        None,
        Some(DeliveryState::Pending),
        Some(DeliveryState::Leased),
        Some(DeliveryState::Delivered),
        Some(DeliveryState::Dead),
    ];
    let mut nonempty = 0;
    for state in states {
        let pairs = [(None, None), (Some(e1.id), None), (None, Some(first_event))];
        for (endpoint_id, event_id) in pairs {
            for ty in [None, Some("a.one"), Some("a.two"), Some("c.none")] {
                for (since, until) in [(None, None), (at(1), None), (None, at(2)), (at(1), at(3))] {
                    let by = (endpoint_id, event_id);
                    let got = list(state, by, ty, since, until, PageRequest::first(100))
                        .await
                        .unwrap()
                        .items;
                    let want: Vec<_> = all
                        .iter()
                        .filter(|d| state.is_none_or(|s| d.state == s))
                        .filter(|d| endpoint_id.is_none_or(|e| d.endpoint_id == e))
                        .filter(|d| event_id.is_none_or(|e| d.event_id == e))
                        .filter(|d| ty.is_none_or(|t| types.get(&d.event_id) == Some(&t)))
                        .filter(|d| since.is_none_or(|s| d.created_at >= s))
                        .filter(|d| until.is_none_or(|u| d.created_at < u))
                        .cloned()
                        .collect();
                    assert_eq!(
                        got, want,
                        "state {state:?}, by {by:?}, type {ty:?}, {since:?}..{until:?}"
                    );
                    nonempty += usize::from(!got.is_empty());
                }
            }
        }
    }
    assert!(
        nonempty > 40,
        "the filters were tried on real rows: {nonempty}"
    );
    // Pages of one through a type and a time window: newest first, no overlap.
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let p = list(
            None,
            (None, None),
            Some("a.one"),
            at(1),
            None,
            PageRequest::new(1, after).unwrap(),
        )
        .await
        .unwrap();
        seen.extend(p.items.iter().map(|d| d.seq));
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<i64> = all
        .iter()
        .filter(|d| types.get(&d.event_id) == Some(&"a.one") && Some(d.created_at) >= at(1))
        .map(|d| d.seq)
        .collect();
    assert_eq!((seen.len(), &seen), (2, &want));
}
