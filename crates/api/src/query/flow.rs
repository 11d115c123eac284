//! What the dashboard reads to tell why work waits (issue 75): the flow of
//! an account's endpoints (their circuits and deliveries in flight), counts
//! read with a bound, a page of deliveries, one delivery, one endpoint, and
//! what a bulk replay would revive. Every read is bounded whatever the
//! finished history holds: live deliveries come from the live queue, dead
//! ones from the index of dead rows by account (ADR 0032).

use std::collections::HashMap;
use std::time::Duration;

use control_plane_core::{
    AccountId, Alert, AttemptQuery, AttemptRecord, AttemptResult, AttemptStats, Circuit, Delivery,
    DeliveryId, DeliveryListRequest, DeliveryState, DynControlPlaneStore, Endpoint, EndpointId,
    EndpointKey, Event, Page, PageRequest, ReplayFilter, StoreError, Timestamp,
};

use super::{delivery_with_attempts, DeliveryWithAttempts};
use crate::error::ApiError;

/// Up to this many rows are read to count one thing on a page (deliveries
/// held behind an endpoint, its dead letters): a count that reaches it is
/// shown as "at least".
pub const COUNT_CAP: u32 = 1000;

/// Up to this many of the account's newest dead letters are read to count
/// them by endpoint: dead letters are finished history, so the read is
/// kept as small as a page of them, whatever the history holds (issue 75:
/// every page within 1.3 x of its time at 10,000 finished deliveries).
pub const DEAD_SAMPLE: u32 = 100;

/// How many of an endpoint's newest attempts its page reads for its latest
/// failures (one read of the index of attempts by endpoint).
pub const RECENT_ATTEMPTS: u32 = 100;

/// A count read with at most [`COUNT_CAP`] rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// How many were found.
    pub n: u64,
    /// True when there may be more than `n` (the read stopped at the cap).
    pub more: bool,
}

impl Count {
    pub(super) fn of<T>(page: &Page<T>) -> Count {
        Count {
            n: u64::try_from(page.items.len()).unwrap_or(u64::MAX),
            more: page.next.is_some(),
        }
    }
}

/// What decides whether an account's pending deliveries may go: its
/// endpoints, their circuits and their deliveries in flight (the
/// dashboard tells from it why a delivery waits).
pub struct Flow {
    /// The account's endpoints (all of them, or the one a page is about).
    pub endpoints: Vec<Endpoint>,
    /// Their circuits; an endpoint without one is closed.
    pub circuits: HashMap<EndpointId, Circuit>,
    /// Their leased deliveries (counted among the account's first 1,000).
    pub in_flight: HashMap<EndpointId, u64>,
    /// The service's in-flight cap for an endpoint without its own.
    pub default_cap: u32,
}

impl Flow {
    /// Endpoint `id`, if it still exists.
    pub fn endpoint(&self, id: EndpointId) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.id == id)
    }

    /// The circuit of endpoint `id` (closed when none is stored).
    pub fn circuit(&self, id: EndpointId) -> Circuit {
        self.circuits.get(&id).cloned().unwrap_or_default()
    }

    /// How many deliveries of endpoint `id` are in flight.
    pub fn in_flight_of(&self, id: EndpointId) -> u64 {
        self.in_flight.get(&id).copied().unwrap_or(0)
    }
}

/// The leased deliveries of `account` by endpoint (of its first 1,000).
pub(super) async fn in_flight_by_endpoint(
    store: &DynControlPlaneStore,
    account: &AccountId,
    endpoint: Option<EndpointId>,
) -> Result<HashMap<EndpointId, u64>, ApiError> {
    let leased = store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Leased),
            endpoint_id: endpoint,
            ..DeliveryListRequest::all(account.clone(), PageRequest::first(COUNT_CAP))
        })
        .await?;
    let mut in_flight: HashMap<EndpointId, u64> = HashMap::new();
    for d in &leased.items {
        *in_flight.entry(d.endpoint_id).or_default() += 1;
    }
    Ok(in_flight)
}

/// The flow of every endpoint of `account`, from three reads.
///
/// # Errors
/// The store's.
pub async fn flow(
    store: &DynControlPlaneStore,
    account: &AccountId,
    default_cap: u32,
) -> Result<Flow, ApiError> {
    Ok(Flow {
        endpoints: store.endpoint_list(account).await?,
        circuits: store.circuit_list(account).await?.into_iter().collect(),
        in_flight: in_flight_by_endpoint(store, account, None).await?,
        default_cap,
    })
}

/// The pending and dead deliveries of each endpoint of an account, counted
/// among the account's newest [`COUNT_CAP`] pending and [`DEAD_SAMPLE`]
/// dead (two bounded reads: the live queue and the index of dead rows).
pub struct StateCounts {
    /// Pending deliveries by endpoint.
    pub pending: HashMap<EndpointId, u64>,
    /// True when the account has more pending deliveries than were read.
    pub pending_more: bool,
    /// Dead deliveries by endpoint.
    pub dead: HashMap<EndpointId, u64>,
    /// True when the account has more dead deliveries than were read.
    pub dead_more: bool,
}

impl StateCounts {
    /// The pending deliveries of endpoint `id`.
    pub fn pending_of(&self, id: EndpointId) -> Count {
        Count {
            n: self.pending.get(&id).copied().unwrap_or(0),
            more: self.pending_more,
        }
    }

    /// The dead deliveries of endpoint `id`.
    pub fn dead_of(&self, id: EndpointId) -> Count {
        Count {
            n: self.dead.get(&id).copied().unwrap_or(0),
            more: self.dead_more,
        }
    }
}

/// The pending and dead deliveries of each endpoint of `account`.
///
/// # Errors
/// The store's.
pub async fn state_counts(
    store: &DynControlPlaneStore,
    account: &AccountId,
) -> Result<StateCounts, ApiError> {
    let mut out = StateCounts {
        pending: HashMap::new(),
        pending_more: false,
        dead: HashMap::new(),
        dead_more: false,
    };
    for (state, cap) in [
        (DeliveryState::Pending, COUNT_CAP),
        (DeliveryState::Dead, DEAD_SAMPLE),
    ] {
        let page = store
            .delivery_list(DeliveryListRequest {
                state: Some(state),
                ..DeliveryListRequest::all(account.clone(), PageRequest::first(cap))
            })
            .await?;
        let (counts, more) = if state == DeliveryState::Pending {
            (&mut out.pending, &mut out.pending_more)
        } else {
            (&mut out.dead, &mut out.dead_more)
        };
        *more = page.next.is_some();
        for d in &page.items {
            *counts.entry(d.endpoint_id).or_default() += 1;
        }
    }
    Ok(out)
}

/// A page of deliveries with the flow of the account's endpoints, to name
/// each one's endpoint and tell why it waits.
pub struct DeliveryPage {
    /// The deliveries, newest first.
    pub deliveries: Page<Delivery>,
    /// The account's endpoints, circuits and deliveries in flight.
    pub flow: Flow,
}

impl DeliveryPage {
    /// The URL of endpoint `id`, if it still exists.
    pub fn url_of(&self, id: EndpointId) -> Option<&str> {
        self.flow.endpoint(id).map(|e| e.destination_label())
    }
}

/// One page of the account's deliveries as `req` filters them (state,
/// endpoint, event).
///
/// # Errors
/// The store's.
pub async fn delivery_page(
    store: &DynControlPlaneStore,
    req: DeliveryListRequest,
    default_cap: u32,
) -> Result<DeliveryPage, ApiError> {
    let flow = flow(store, &req.account, default_cap).await?;
    let deliveries = store.delivery_list(req).await?;
    Ok(DeliveryPage { deliveries, flow })
}

/// A delivery as the dashboard shows it: with its attempts, its event, the
/// flow of its endpoint (none once the endpoint is deleted) and the alerts
/// that name it among the account's latest 100.
pub struct DeliveryRecord {
    /// The delivery and its attempts.
    pub delivery: DeliveryWithAttempts,
    /// The event it delivers.
    pub event: Event,
    /// Its endpoint (while it exists), its circuit and deliveries in flight.
    pub flow: Flow,
    /// The alerts that name the delivery, newest first.
    pub alerts: Vec<Alert>,
}

impl DeliveryRecord {
    /// Its endpoint's URL (`(poll endpoint)` for one without,
    /// [`control_plane_core::Endpoint::destination_label`]), while the
    /// endpoint exists.
    pub fn url(&self) -> Option<&str> {
        self.endpoint().map(|e| e.destination_label())
    }

    /// Its endpoint, while it exists.
    pub fn endpoint(&self) -> Option<&control_plane_core::Endpoint> {
        self.flow.endpoint(self.delivery.delivery.endpoint_id)
    }
}

/// The flow of one endpoint of `account`: empty once it is deleted.
async fn flow_of_one(
    store: &DynControlPlaneStore,
    account: &AccountId,
    id: EndpointId,
    default_cap: u32,
) -> Result<Flow, ApiError> {
    let endpoints = match store.endpoint_get(account, id).await {
        Ok(e) => vec![e],
        Err(StoreError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut circuits = HashMap::new();
    if !endpoints.is_empty() {
        circuits.insert(id, store.circuit_get(account, id).await?);
    }
    Ok(Flow {
        endpoints,
        circuits,
        in_flight: in_flight_by_endpoint(store, account, Some(id)).await?,
        default_cap,
    })
}

/// Delivery `id` of the account, with its event, its endpoint's flow and
/// its alerts.
///
/// # Errors
/// `404` for a delivery not of the account.
pub async fn delivery_record(
    store: &DynControlPlaneStore,
    account: &AccountId,
    id: DeliveryId,
    default_cap: u32,
) -> Result<DeliveryRecord, ApiError> {
    let delivery = delivery_with_attempts(store, account, id).await?;
    let event = store.event_get(account, delivery.delivery.event_id).await?;
    let flow = flow_of_one(store, account, delivery.delivery.endpoint_id, default_cap).await?;
    let alerts = store
        .alert_list(account, PageRequest::first(100))
        .await?
        .items
        .into_iter()
        .filter(|a| a.delivery_id == Some(id))
        .collect();
    Ok(DeliveryRecord {
        delivery,
        event,
        flow,
        alerts,
    })
}

/// One endpoint as its dashboard page shows it.
pub struct EndpointPage {
    /// The endpoint, its circuit and deliveries in flight.
    pub flow: Flow,
    /// Its pending deliveries.
    pub pending: Count,
    /// Its dead deliveries among the account's newest [`DEAD_SAMPLE`] dead.
    pub dead: Count,
    /// Its attempts of the last hour.
    pub last_hour: AttemptStats,
    /// Its attempts of the last day.
    pub last_day: AttemptStats,
    /// Its failed attempts among its newest [`RECENT_ATTEMPTS`], newest
    /// first (at most 10), with the receiver's answers.
    pub failures: Vec<AttemptRecord>,
    /// The account's event types with an example, that it accepts.
    pub examples: Vec<String>,
    /// The alerts that name it among the account's latest 100.
    pub alerts: Vec<Alert>,
}

impl EndpointPage {
    /// The endpoint.
    pub fn endpoint(&self) -> Option<&Endpoint> {
        self.flow.endpoints.first()
    }
}

/// Endpoint `id` of `account` at `now`, from a bounded number of reads
/// whatever the history: the live deliveries of the endpoint, the newest
/// dead letters of the account, the attempt rollup and the newest failures.
///
/// # Errors
/// `404` for an endpoint not of the account.
pub async fn endpoint_page(
    store: &DynControlPlaneStore,
    key: EndpointKey<'_>,
    now: Timestamp,
    default_cap: u32,
) -> Result<EndpointPage, ApiError> {
    let (account, id) = (key.account, key.id);
    let endpoint = store.endpoint_get(account, id).await?;
    let listed = |state, cap| DeliveryListRequest {
        state: Some(state),
        ..DeliveryListRequest::all(account.clone(), PageRequest::first(cap))
    };
    let pending = store
        .delivery_list(DeliveryListRequest {
            endpoint_id: Some(id),
            ..listed(DeliveryState::Pending, COUNT_CAP)
        })
        .await?;
    // The account's dead letters take the index of dead rows by account;
    // one endpoint's would scan its history (ADR 0032).
    let dead = store
        .delivery_list(listed(DeliveryState::Dead, DEAD_SAMPLE))
        .await?;
    // Its newest attempts, then the failed ones among them: a search by
    // result would scan the whole log of an endpoint that rarely fails.
    let failures = store
        .attempt_search(
            AttemptQuery::new(account.clone(), PageRequest::first(RECENT_ATTEMPTS)).of_endpoint(id),
        )
        .await?
        .items
        .into_iter()
        .filter(|a| a.result != AttemptResult::Delivered)
        .take(10)
        .collect();
    let examples = store
        .event_type_list(account)
        .await?
        .into_iter()
        .filter(|t| t.example.is_some() && endpoint.accepts(&t.name))
        .map(|t| t.name)
        .collect();
    let alerts = store
        .alert_list(account, PageRequest::first(100))
        .await?
        .items
        .into_iter()
        .filter(|a| a.endpoint_id == id)
        .collect();
    let hour = now.minus(Duration::from_secs(3600));
    let day = now.minus(Duration::from_secs(86_400));
    Ok(EndpointPage {
        last_hour: store
            .attempt_stats(EndpointKey::new(account, id), hour)
            .await?,
        last_day: store
            .attempt_stats(EndpointKey::new(account, id), day)
            .await?,
        flow: flow_of_one(store, account, id, default_cap).await?,
        pending: Count::of(&pending),
        dead: Count {
            n: u64::try_from(dead.items.iter().filter(|d| d.endpoint_id == id).count())
                .unwrap_or(u64::MAX),
            more: dead.next.is_some(),
        },
        failures,
        examples,
        alerts,
    })
}

/// What a bulk replay would revive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayPreview {
    /// How many dead deliveries.
    pub count: Count,
    /// Of how many endpoints (among the dead letters read).
    pub endpoints: usize,
    /// True when there may be more endpoints than `endpoints`.
    pub more_endpoints: bool,
}

/// What a bulk replay of `filter` would revive: how many (exactly, from the
/// account's counts, when the filter takes every dead letter; otherwise
/// among the account's newest [`DEAD_SAMPLE`]), and of how many endpoints
/// (among those read).
///
/// # Errors
/// The store's.
pub async fn replay_preview(
    store: &DynControlPlaneStore,
    filter: &ReplayFilter,
) -> Result<ReplayPreview, ApiError> {
    let dead = store
        .delivery_list(DeliveryListRequest {
            state: Some(DeliveryState::Dead),
            ..DeliveryListRequest::all(filter.account.clone(), PageRequest::first(DEAD_SAMPLE))
        })
        .await?;
    let matching: Vec<&Delivery> = dead
        .items
        .iter()
        .filter(|d| filter.endpoint_id.is_none_or(|e| e == d.endpoint_id))
        .filter(|d| filter.dead_since.is_none_or(|t| d.updated_at >= t))
        .filter(|d| filter.dead_until.is_none_or(|t| d.updated_at < t))
        .collect();
    let endpoints: std::collections::HashSet<EndpointId> =
        matching.iter().map(|d| d.endpoint_id).collect();
    let every = filter.endpoint_id.is_none() && filter.dead_since.is_none();
    let count = if every && filter.dead_until.is_none() && dead.next.is_some() {
        // Every dead letter: the exact number, from the counts kept as
        // deliveries finish (ADR 0032), not from a scan.
        let n = store
            .delivery_count_by_account_and_state()
            .await?
            .into_iter()
            .find(|(a, s, _)| *a == filter.account && *s == DeliveryState::Dead)
            .map_or(0, |(_, _, n)| n);
        Count { n, more: false }
    } else {
        Count {
            n: u64::try_from(matching.len()).unwrap_or(u64::MAX),
            more: dead.next.is_some(),
        }
    };
    Ok(ReplayPreview {
        count,
        endpoints: endpoints.len(),
        more_endpoints: dead.next.is_some(),
    })
}
