//! The query layer: what the JSON routes of this crate and the dashboard
//! (crate `dashboard`) read and do through the store, written once. Each
//! function takes the store (or the API's state) and an account the caller
//! was already checked to reach, and returns plain values: view structs of
//! the store's own types, never JSON or HTML. How they are shown is the
//! caller's (`crate::views` for JSON, the dashboard's templates for HTML).

use control_plane_core::EndpointKey;
use std::collections::HashMap;
use std::time::Duration;

use control_plane_core::rollup_minute;
use control_plane_core::{
    AccountId, Alert, AttemptRecord, AttemptResult, AttemptStats, Check, Circuit, CircuitMode,
    Delivery, DeliveryId, DeliveryListRequest, DeliveryState, DynControlPlaneStore, Endpoint,
    EndpointCreateRequest, EndpointId, EventType, PageRequest, Published, Recovery, RollupRow,
    Secret, SecretRotation, SignatureScheme, StoreError, Task, TaskEnqueueRequest, TaskId,
    Timestamp, UsageMetric, RECOVER_TASK, ROLLUP_MINUTE_MS,
};

use crate::error::ApiError;
use crate::ApiState;

mod flow;

use flow::in_flight_by_endpoint;
pub use flow::{
    delivery_page, delivery_record, endpoint_page, flow, replay_preview, state_counts, Count,
    DeliveryPage, DeliveryRecord, EndpointPage, Flow, ReplayPreview, StateCounts, COUNT_CAP,
    DEAD_SAMPLE, RECENT_ATTEMPTS,
};

/// A page request from a listing's `limit` (default 50) and `cursor`
/// parameters.
///
/// # Errors
/// `400` for a cursor this API did not give.
pub fn page_request(limit: Option<u32>, cursor: Option<&str>) -> Result<PageRequest, ApiError> {
    let after = cursor
        .map(|v| {
            v.parse().map_err(|_| {
                ApiError::bad_request(format!("cursor {v:?} is not one this API gave"))
            })
        })
        .transpose()?;
    Ok(PageRequest::new(limit.unwrap_or(50), after)?)
}

/// An optional delivery state from a query parameter (empty means none):
/// the one parse of the API and the dashboard.
///
/// # Errors
/// `422` naming the states there are.
pub fn delivery_state(v: Option<&str>) -> Result<Option<DeliveryState>, ApiError> {
    Ok(v.filter(|v| !v.is_empty())
        .map(str::parse::<DeliveryState>)
        .transpose()?)
}

/// Queues the recovery of one endpoint's window as a task (the endpoint
/// must be the account's).
///
/// # Errors
/// `404` for an endpoint not of `account`; the store's errors.
pub async fn queue_recovery(
    store: &DynControlPlaneStore,
    account: AccountId,
    recovery: Recovery,
) -> Result<Task, ApiError> {
    store.endpoint_get(&account, recovery.endpoint_id).await?;
    let payload =
        serde_json::to_value(&recovery).map_err(|e| ApiError::invalid(format!("recovery: {e}")))?;
    queue_task(store, account, RECOVER_TASK, payload).await
}

/// Queues a task of one of the service's own kinds (`kind`), its id the
/// kind's last word and a time-ordered UUID (`recover-…`, `erase-…`).
///
/// # Errors
/// The store's.
pub async fn queue_task(
    store: &DynControlPlaneStore,
    account: AccountId,
    kind: &str,
    payload: serde_json::Value,
) -> Result<Task, ApiError> {
    let prefix = kind.rsplit('.').next().unwrap_or(kind);
    let enqueued = store
        .workflow_enqueue(
            TaskEnqueueRequest {
                id: TaskId::new(format!("{prefix}-{}", uuid::Uuid::now_v7()))?,
                account,
                kind: kind.into(),
                payload,
                run_at: None,
            }
            .checked()?,
        )
        .await?;
    Ok(enqueued.task)
}

/// Creates an endpoint within its account's quota of endpoints
/// (`CONTROLPLANE_QUOTA_ENDPOINTS`): what the API's create and the portal's
/// share.
///
/// # Errors
/// `403` past the quota; `422` for a request the store refuses.
pub async fn create_endpoint(
    state: &ApiState,
    mut req: EndpointCreateRequest,
) -> Result<Endpoint, ApiError> {
    // Counted by the store in the create's own transaction, so that
    // creates racing in any number of processes cannot pass the quota
    // together.
    req.quota = Some(state.quotas.endpoints);
    let account = req.account.clone();
    match state.store.endpoint_create(req.checked()?).await {
        Err(StoreError::OverQuota { holds, quota, .. }) => Err(over_quota(
            &account,
            "endpoints",
            holds,
            quota,
            "CONTROLPLANE_QUOTA_ENDPOINTS",
        )),
        r => Ok(r?),
    }
}

/// Refuses what would take `account` past one of its quotas: `403`
/// naming the setting, what the account holds and what it may hold.
pub(crate) fn over_quota(
    account: &AccountId,
    what: &str,
    holds: u64,
    quota: u64,
    setting: &str,
) -> ApiError {
    ApiError::forbidden(format!(
        "account {account} would hold {holds} {what}, over its quota of {quota} \
         ({setting}); remove some, or ask the operator to raise it"
    ))
}

/// A caller's signing secret of `scheme` after checking it, or a fresh one.
///
/// # Errors
/// `422` for a secret of the wrong form or scheme.
pub fn given_or_new_secret(
    given: Option<String>,
    scheme: SignatureScheme,
) -> Result<String, ApiError> {
    match given {
        Some(given) => crate::auth::validate_secret(&given, scheme).map(|()| given),
        None => crate::auth::new_secret(scheme),
    }
}

/// Rotates the signing secret of endpoint `key` to a fresh one of its
/// scheme, or to `given` after checking it; the previous secret keeps
/// signing for the service's rotation grace. Returns the endpoint and its
/// new secret (shown once).
///
/// # Errors
/// `404` for an endpoint not of the account, `422` for a given secret of
/// the wrong form.
pub async fn rotate_secret(
    state: &ApiState,
    key: EndpointKey<'_>,
    given: Option<String>,
) -> Result<(Endpoint, String), ApiError> {
    let current = state.store.endpoint_get(key.account, key.id).await?;
    let scheme = SignatureScheme::of(current.secrets.current.expose());
    let secret = given_or_new_secret(given, scheme)?;
    let e = state
        .store
        .endpoint_rotate_secret(
            key,
            SecretRotation {
                secret: Secret::new(secret.clone()),
                grace: state.rotation_grace,
            },
        )
        .await?;
    Ok((e, secret))
}

/// Publishes the example of event type `name` to one endpoint, and counts
/// it as a published event in the account's usage.
///
/// # Errors
/// `404` for a type or endpoint not of the account, `422` for a type
/// without an example.
pub async fn send_example(
    state: &ApiState,
    account: &AccountId,
    name: &str,
    endpoint: EndpointId,
) -> Result<Published, ApiError> {
    let published = state
        .store
        .event_type_send_example(EndpointKey::new(account, endpoint), name)
        .await?;
    state.usage.add(account, UsageMetric::EventsPublished, 1);
    Ok(published)
}

/// Every account with deliveries, with how many it has (of every state).
///
/// # Errors
/// The store's.
pub async fn account_totals(
    store: &DynControlPlaneStore,
) -> Result<Vec<(AccountId, u64)>, ApiError> {
    let mut totals: Vec<(AccountId, u64)> = Vec::new();
    for (account, _, n) in store.delivery_count_by_account_and_state().await? {
        match totals.last_mut() {
            Some((a, total)) if *a == account => *total += n,
            _ => totals.push((account, n)),
        }
    }
    Ok(totals)
}

/// One account at a glance: what the dashboard's overview shows.
pub struct Overview {
    /// Deliveries by state.
    pub counts: HashMap<DeliveryState, u64>,
    /// Deliveries delivered in each of the last 30 minutes, oldest first
    /// (delivered attempts, from the attempt rollup).
    pub per_minute: [u64; 30],
    /// Attempts that failed or whose lease expired in each of the same
    /// minutes.
    pub failed_per_minute: [u64; 30],
    /// Endpoints whose circuit is not closed (of the first 500), with it.
    pub open_circuits: Vec<(Endpoint, Circuit)>,
    /// Disabled endpoints (of the first 500).
    pub disabled: Vec<Endpoint>,
    /// The pending deliveries held behind each disabled endpoint or circuit
    /// that is not closed (of the first [`HELD_ENDPOINTS`] such endpoints).
    pub held: HashMap<EndpointId, Count>,
    /// The newest alerts, at most 10.
    pub alerts: Vec<Alert>,
}

/// The overview counts the held deliveries of at most this many endpoints
/// (one bounded read of the live queue each).
pub const HELD_ENDPOINTS: usize = 20;

impl Overview {
    /// How many deliveries of the account are in `state`.
    pub fn count(&self, state: DeliveryState) -> u64 {
        self.counts.get(&state).copied().unwrap_or(0)
    }

    /// How many pending deliveries are held by disabled endpoints and
    /// circuits that are not closed, in all.
    pub fn held_total(&self) -> Count {
        self.held.values().fold(Count::default(), |a, c| Count {
            n: a.n + c.n,
            more: a.more || c.more,
        })
    }
}

/// The overview of `account` at `now`.
///
/// # Errors
/// The store's.
pub async fn overview(
    store: &DynControlPlaneStore,
    account: &AccountId,
    now: Timestamp,
) -> Result<Overview, ApiError> {
    let mut counts = HashMap::new();
    for (a, state, n) in store.delivery_count_by_account_and_state().await? {
        if a == *account {
            counts.insert(state, n);
        }
    }
    // Delivered and failed attempts per minute, from the attempt rollup
    // (ADR 0032).
    let first_minute = rollup_minute(now) - 29 * ROLLUP_MINUTE_MS;
    let (mut per_minute, mut failed_per_minute) = ([0u64; 30], [0u64; 30]);
    let since = Timestamp::from_millis(first_minute);
    for r in store.attempt_rollup_of_account(account, since).await? {
        let slot = usize::try_from((r.minute - first_minute) / ROLLUP_MINUTE_MS).ok();
        let minutes = match r.result {
            AttemptResult::Delivered => &mut per_minute,
            AttemptResult::Failed | AttemptResult::LeaseExpired => &mut failed_per_minute,
        };
        if let Some(n) = slot.and_then(|i| minutes.get_mut(i)) {
            *n += u64::try_from(r.n).unwrap_or(0);
        }
    }
    let mut open_circuits = Vec::new();
    let mut disabled = Vec::new();
    let mut circuits: HashMap<EndpointId, Circuit> =
        store.circuit_list(account).await?.into_iter().collect();
    for e in store.endpoint_list(account).await?.into_iter().take(500) {
        if !e.enabled {
            disabled.push(e.clone());
        }
        if let Some(c) = circuits.remove(&e.id) {
            if c.mode != CircuitMode::Closed {
                open_circuits.push((e, c));
            }
        }
    }
    let alerts = store
        .alert_list(account, PageRequest::first(10))
        .await?
        .items;
    let mut held = HashMap::new();
    let holding = disabled
        .iter()
        .map(|e| e.id)
        .chain(open_circuits.iter().map(|(e, _)| e.id));
    for id in holding.take(HELD_ENDPOINTS) {
        if held.contains_key(&id) {
            continue;
        }
        let pending = store
            .delivery_list(DeliveryListRequest {
                state: Some(DeliveryState::Pending),
                endpoint_id: Some(id),
                ..DeliveryListRequest::all(account.clone(), PageRequest::first(COUNT_CAP))
            })
            .await?;
        held.insert(id, Count::of(&pending));
    }
    Ok(Overview {
        counts,
        per_minute,
        failed_per_minute,
        open_circuits,
        disabled,
        held,
        alerts,
    })
}

/// One endpoint's health: what a row of the dashboard's endpoints page
/// shows.
pub struct EndpointHealth {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Its circuit.
    pub circuit: Circuit,
    /// Its leased deliveries (counted among the account's first 1,000).
    pub in_flight: u64,
    /// Its attempts of the last hour.
    pub last_hour: AttemptStats,
    /// The median response time of each of the last 30 minutes, oldest
    /// first, in ms (0 for a minute without attempts).
    pub latencies: Vec<u64>,
}

/// The health of the account's first 200 endpoints at `now`, from four
/// reads whatever the number of endpoints: the leased deliveries, the
/// endpoints, their circuits and the attempt rollup of the last hour.
///
/// # Errors
/// The store's.
pub async fn endpoint_health(
    store: &DynControlPlaneStore,
    account: &AccountId,
    now: Timestamp,
) -> Result<Vec<EndpointHealth>, ApiError> {
    let in_flight = in_flight_by_endpoint(store, account, None).await?;
    let hour_ago = now.minus(Duration::from_secs(3600));
    let mut circuits: HashMap<EndpointId, Circuit> =
        store.circuit_list(account).await?.into_iter().collect();
    let mut rollup: HashMap<EndpointId, Vec<RollupRow>> = HashMap::new();
    for row in store.attempt_rollup_of_account(account, hour_ago).await? {
        rollup.entry(row.endpoint_id).or_default().push(row);
    }
    let first_minute = rollup_minute(now) - 29 * ROLLUP_MINUTE_MS;
    let mut out = Vec::new();
    for endpoint in store.endpoint_list(account).await?.into_iter().take(200) {
        let rows = rollup.remove(&endpoint.id).unwrap_or_default();
        let counts = |rows: &mut dyn Iterator<Item = &RollupRow>| {
            AttemptStats::from_rollup(
                rows.map(|r| (r.result, r.bucket, u64::try_from(r.n).unwrap_or(0)))
                    .collect::<Vec<_>>(),
            )
        };
        let last_hour = counts(&mut rows.iter());
        let latencies = (0..30)
            .map(|i| {
                let minute = first_minute + i * ROLLUP_MINUTE_MS;
                counts(&mut rows.iter().filter(|r| r.minute == minute))
                    .p50_latency_ms
                    .unwrap_or(0)
            })
            .collect();
        out.push(EndpointHealth {
            in_flight: in_flight.get(&endpoint.id).copied().unwrap_or(0),
            circuit: circuits.remove(&endpoint.id).unwrap_or_default(),
            latencies,
            endpoint,
            last_hour,
        });
    }
    Ok(out)
}

/// A delivery with its attempt log.
pub struct DeliveryWithAttempts {
    /// The delivery.
    pub delivery: Delivery,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
}

/// Delivery `id` of the account with its attempts.
///
/// # Errors
/// `404` for a delivery not of the account.
pub async fn delivery_with_attempts(
    store: &DynControlPlaneStore,
    account: &AccountId,
    id: DeliveryId,
) -> Result<DeliveryWithAttempts, ApiError> {
    let delivery = store.delivery_get(account, id).await?;
    let attempts = store.attempt_list_for_delivery(account, id).await?;
    Ok(DeliveryWithAttempts { delivery, attempts })
}

/// The account's event types, with its endpoints (where an example can be
/// sent).
pub struct Catalogue {
    /// The registered types.
    pub types: Vec<EventType>,
    /// Every endpoint of the account.
    pub endpoints: Vec<Endpoint>,
}

/// The catalogue of the account.
///
/// # Errors
/// The store's.
pub async fn catalogue(
    store: &DynControlPlaneStore,
    account: &AccountId,
) -> Result<Catalogue, ApiError> {
    Ok(Catalogue {
        endpoints: store.endpoint_list(account).await?,
        types: store.event_type_list(account).await?,
    })
}

/// Task `id` of the account, `None` when the id is malformed or no such
/// task exists (a lookup by hand, not a path).
///
/// # Errors
/// The store's, but not found.
pub async fn find_task(
    store: &DynControlPlaneStore,
    account: &AccountId,
    id: &str,
) -> Result<Option<Task>, ApiError> {
    let Ok(id) = TaskId::new(id) else {
        return Ok(None);
    };
    match store.workflow_get(account, &id).await {
        Ok(t) => Ok(Some(t)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
