//! Endpoints and their circuits (stored on the endpoint row).

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::{
    custom_headers_text, AccountId, Checked, Circuit, CircuitMode, CircuitStore, ClientCredentials,
    ClientTls, DeliveryState, Enablement, Endpoint, EndpointCreateRequest, EndpointId, EndpointKey,
    EndpointRetry, EndpointStore, EndpointUpdateRequest, EventFilter, RateBudget, Secret,
    SecretRotation, SigningSecrets, StoreError, StoreResult, Timestamp, Transform,
};
use control_plane_store_kit::columns::ENDPOINT_COLS;
use control_plane_store_kit::reseal_candidates;
use control_plane_store_kit::sealing::{Slot, StoredCredentials, RESEAL_UPDATE};
use duckdb::{params, OptionalExt, Row};

use crate::cache::Sender;
use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::{conversion, RowExt};

/// The endpoint as read, its credentials opened with the transaction's keys.
fn opened(t: &Tx<'_>, e: Endpoint) -> StoreResult<Endpoint> {
    t.keys.open_endpoint(e)
}

pub(crate) fn row_to_endpoint(r: &Row<'_>) -> duckdb::Result<Endpoint> {
    let types: String = r.get(6)?;
    let event_types: Vec<String> = serde_json::from_str(&types).map_err(|e| conversion(6, e))?;
    Ok(Endpoint {
        id: r.col(0)?,
        account: r.col(1)?,
        url: r.get(2)?,
        secrets: SigningSecrets {
            current: r.col(3)?,
            previous: r.col(4)?,
            previous_expires_at: r.col(5)?,
        },
        event_types,
        enabled: r.get(7)?,
        disabled_reason: r.get(8)?,
        rate_limit_per_s: r.get(9)?,
        ordered: r.get(10)?,
        description: r.get(11)?,
        created_at: r.col(12)?,
        updated_at: r.col(13)?,
        max_in_flight: r.get(14)?,
        filter: r.col(15)?,
        headers: r.col(16)?,
        oauth2: r.col(17)?,
        retry: EndpointRetry::from_stored(r.get::<_, Option<String>>(18)?.as_deref(), r.get(19)?)
            .map_err(|e| conversion(18, e))?,
        client_tls: r.col(20)?,
        transform: r.get::<_, Option<String>>(21)?.map(Transform::stored),
    })
}

fn types_json(types: &[String]) -> StoreResult<String> {
    serde_json::to_string(types).map_err(|e| StoreError::InvalidInput(format!("event types: {e}")))
}

pub(crate) fn create(t: &mut Tx<'_>, req: Checked<EndpointCreateRequest>) -> StoreResult<Endpoint> {
    if let Some(quota) = req.quota {
        within_quota(t, &req.account, quota)?;
    }
    let id = EndpointId::new();
    t.execute(
        "INSERT INTO endpoints (id, account, url, secret, event_types, enabled, rate_limit_per_s, ordered, \
         description, created_at, updated_at, circuit_mode, circuit_failures, circuit_reopen_count, max_in_flight, filter, headers, oauth2, retry_schedule, max_attempts, client_tls, transform) \
         VALUES ($1, $2, $3, $4, $5, true, $6, $7, $8, $9, $14, 'closed', 0, 0, $10, $11, $12, $13, $15, $16, $17, $18)",
        params![
            id.to_string(),
            req.account.as_str(),
            req.url,
            t.keys.seal(id.0.as_bytes(), Slot::Current, &req.secret)?,
            types_json(&req.event_types)?,
            req.rate_limit_per_s,
            req.ordered,
            req.description,
            t.now.as_millis(),
            req.max_in_flight,
            req.filter.as_ref().map(EventFilter::to_text),
            t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::Headers,
                custom_headers_text(&req.headers)?.as_ref()
            )?,
            t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::OAuth2,
                req.oauth2.as_ref().map(ClientCredentials::to_text).transpose()?.as_ref()
            )?,
            t.now.as_millis(),
            req.retry.as_ref().map(EndpointRetry::schedule_text),
            req.retry.as_ref().map(|r| i64::from(r.max_attempts())),
            t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::ClientTls,
                req.client_tls.as_ref().map(ClientTls::to_text).transpose()?.as_ref()
            )?,
            req.transform.as_ref().map(Transform::as_str),
        ],
    )
    .db()?;
    t.fan_out.forget(&req.account);
    get(t, &req.account, id)
}

/// `OverQuota` unless `account` holds fewer than `quota` live endpoints:
/// with one writer, the count and the create's insert are one step.
fn within_quota(t: &Tx<'_>, account: &AccountId, quota: u32) -> StoreResult<()> {
    let holds: i64 = t
        .query_row(
            "SELECT count(*) FROM endpoints WHERE account = $1 AND deleted_at IS NULL",
            params![account.as_str()],
            |r| r.get(0),
        )
        .db()?;
    StoreError::within_quota("endpoints", holds, quota)
}

/// A live (not deleted) endpoint of `account`.
pub(crate) fn get(t: &Tx<'_>, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
    t.query_row(
        &format!("SELECT {ENDPOINT_COLS} FROM endpoints WHERE id = $1 AND account = $2 AND deleted_at IS NULL"),
        params![id.to_string(), account.as_str()],
        row_to_endpoint,
    )
    .optional()
    .db()?
    .ok_or_else(|| StoreError::not_found("endpoint", id))
    .and_then(|e| opened(t, e))
}

/// The live endpoints of `account`, oldest first, their secrets opened.
pub(crate) fn list(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
    list_sealed(t, account)?
        .into_iter()
        .map(|e| opened(t, e))
        .collect()
}

/// The live endpoints of `account` as fan-out reads them, from the writer's
/// cache ([`crate::cache::FanOutCache`]) when they have not changed since
/// they were last read.
pub(crate) fn fan_out_set(
    t: &mut Tx<'_>,
    account: &AccountId,
) -> StoreResult<std::sync::Arc<[Endpoint]>> {
    if let Some(endpoints) = t.fan_out.get(account) {
        // The tests check the cache against the table at every use, as they
        // check the live index.
        if t.check_against_table {
            type Seen = (EndpointId, Vec<String>, Option<String>, u32);
            let seen = |e: &[Endpoint]| -> Vec<Seen> {
                e.iter()
                    .map(|e| {
                        let filter = e.filter.as_ref().map(EventFilter::to_text);
                        (e.id, e.event_types.clone(), filter, e.attempt_limit(0))
                    })
                    .collect()
            };
            if seen(&endpoints) != seen(&list_sealed(t, account)?) {
                return Err(StoreError::Backend(format!(
                    "the fan-out cache of account {account} is out of step with the endpoints table"
                )));
            }
        }
        return Ok(endpoints);
    }
    let endpoints: std::sync::Arc<[Endpoint]> = list_sealed(t, account)?.into();
    t.fan_out.insert(account, endpoints.clone());
    Ok(endpoints)
}

/// [`list`] with the secrets left as stored: for fan-out, which reads no
/// secret and should not pay to open them.
pub(crate) fn list_sealed(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {ENDPOINT_COLS} FROM endpoints WHERE account = $1 AND deleted_at IS NULL ORDER BY created_at, id"
        ))
        .db()?;
    let rows = st
        .query_map(params![account.as_str()], row_to_endpoint)
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

pub(crate) fn update(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    req: EndpointUpdateRequest,
) -> StoreResult<Endpoint> {
    let mut e = get(t, account, id)?;
    req.apply_to(&mut e)?;
    t.execute(
        "UPDATE endpoints SET url = $1, event_types = $2, ordered = $3, rate_limit_per_s = $4, \
         description = $5, updated_at = $6, max_in_flight = $8, filter = $9, headers = $10, oauth2 = $11, \
         retry_schedule = $12, max_attempts = $13, client_tls = $14, transform = $15 WHERE id = $7",
        params![
            e.url,
            types_json(&e.event_types)?,
            e.ordered,
            e.rate_limit_per_s,
            e.description,
            t.now.as_millis(),
            id.to_string(),
            e.max_in_flight,
            e.filter.as_ref().map(EventFilter::to_text),
            t.keys
                .seal_optional(id.0.as_bytes(), Slot::Headers, e.headers.as_ref())?,
            t.keys
                .seal_optional(id.0.as_bytes(), Slot::OAuth2, e.oauth2.as_ref())?,
            e.retry.as_ref().map(EndpointRetry::schedule_text),
            e.retry.as_ref().map(|r| i64::from(r.max_attempts())),
            t.keys
                .seal_optional(id.0.as_bytes(), Slot::ClientTls, e.client_tls.as_ref())?,
            e.transform.as_ref().map(Transform::as_str)
        ],
    )
    .db()?;
    t.fan_out.forget(account);
    t.senders.forget(id);
    get(t, account, id)
}

pub(crate) fn rotate_secret(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    secret: Secret,
    grace: Duration,
) -> StoreResult<Endpoint> {
    let e = get(t, account, id)?;
    control_plane_core::check_rotation(&e.secrets.current, &secret)?;
    t.execute(
        "UPDATE endpoints SET secret = $1, previous_secret = $2, previous_expires_at = $3, updated_at = $4 WHERE id = $5",
        params![
            t.keys.seal(id.0.as_bytes(), Slot::Current, &secret)?,
            t.keys.seal(id.0.as_bytes(), Slot::Previous, &e.secrets.current)?,
            t.now.plus(grace).as_millis(),
            t.now.as_millis(),
            id.to_string()
        ],
    )
    .db()?;
    t.senders.forget(id);
    get(t, account, id)
}

/// Seals the credentials of up to `limit` endpoints (deleted ones included)
/// that are not sealed under the current key; how many it rewrote.
pub(crate) fn reseal(t: &mut Tx<'_>, limit: u32) -> StoreResult<u64> {
    let pattern = t.keys.current_pattern()?;
    let rows = {
        let mut st = t.prepare(reseal_candidates!()).db()?;
        let rows = st
            .query_map(params![pattern, limit], |r| {
                let stored = StoredCredentials {
                    secret: r.get(1)?,
                    previous: r.get(2)?,
                    headers: r.get(3)?,
                    oauth2: r.get(4)?,
                    client_tls: r.get(5)?,
                };
                Ok((r.col::<uuid::Uuid>(0)?, stored))
            })
            .db()?;
        rows.collect::<Result<Vec<_>, _>>().db()?
    };
    for (id, stored) in &rows {
        let c = t.keys.reseal_credentials(id.as_bytes(), stored)?;
        t.execute(
            RESEAL_UPDATE,
            params![
                c.secret,
                c.previous,
                id.to_string(),
                c.headers,
                c.oauth2,
                c.client_tls
            ],
        )
        .db()?;
        t.senders.forget(EndpointId(*id));
    }
    Ok(rows.len() as u64)
}

pub(crate) fn set_enabled(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    enablement: Enablement,
) -> StoreResult<Endpoint> {
    get(t, account, id)?;
    let (enabled, reason) = enablement.into_row()?;
    t.execute(
        "UPDATE endpoints SET enabled = $1, disabled_reason = $2, updated_at = $3 WHERE id = $4",
        params![enabled, reason, t.now.as_millis(), id.to_string()],
    )
    .db()?;
    t.senders.forget(id);
    get(t, account, id)
}

/// Disables an endpoint for a reason found by the store (410, failing window).
pub(crate) fn disable(t: &mut Tx<'_>, id: EndpointId, reason: &str) -> StoreResult<bool> {
    let n = t
        .execute(
            "UPDATE endpoints SET enabled = false, disabled_reason = $1, updated_at = $2 WHERE id = $3 AND enabled",
            params![reason, t.now.as_millis(), id.to_string()],
        )
        .db()?;
    t.senders.forget(id);
    Ok(n == 1)
}

pub(crate) fn delete(t: &mut Tx<'_>, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
    get(t, account, id)?;
    t.execute(
        "UPDATE endpoints SET deleted_at = $1, updated_at = $1 WHERE id = $2",
        params![t.now.as_millis(), id.to_string()],
    )
    .db()?;
    t.fan_out.forget(account);
    t.senders.forget(id);
    let parked = crate::delivery::dead_letters::moved_seqs(
        t,
        "UPDATE deliveries SET state = 'dead', last_error = 'endpoint removed', lease_token = NULL, \
         lease_expires_at = NULL, leased_by = NULL, last_outcome = NULL, updated_at = $1 \
         WHERE endpoint_id = $2 AND state IN ('pending', 'leased') RETURNING seq",
        params![t.now.as_millis(), id.to_string()],
    )?;
    let n = parked.len() as u64;
    if n > 0 {
        crate::delivery::dead_letters::dead_letters_add(t, &parked)?;
        t.live_mut().forget();
        // An endpoint's deliveries are of its account.
        t.finished_mut().added(account, DeliveryState::Dead, n);
    }
    Ok(n)
}

/// `live` is false for a poll endpoint too: nothing is sent to it (ADR 0051).
const SENDERS: &str = "SELECT id, account, enabled AND deleted_at IS NULL AND url <> '', max_in_flight, rate_limit_per_s, \
     budget_tokens, budget_at, ordered, url, secret, previous_secret, previous_expires_at, headers, oauth2, \
     retry_schedule, max_attempts, client_tls, transform FROM endpoints WHERE id IN (SELECT unnest($1::VARCHAR[]))";

fn read_senders(
    t: &Tx<'_>,
    ids: &[EndpointId],
) -> StoreResult<std::collections::HashMap<EndpointId, Sender>> {
    let mut st = t.prepare(SENDERS).db()?;
    let rows = st
        .query_map(params![crate::util::list::text(ids)], |r| {
            let budget = RateBudget::stored(r.get(5)?, r.get(6)?);
            let sender = Sender {
                account: r.get(1)?,
                live: r.get(2)?,
                cap: r.get(3)?,
                rate: r.get(4)?,
                budget,
                ordered: r.get(7)?,
                url: r.get(8)?,
                secrets: (r.get(9)?, r.get(10)?, r.col(11)?),
                headers: r.get(12)?,
                oauth2: r.get(13)?,
                retry: EndpointRetry::from_stored(
                    r.get::<_, Option<String>>(14)?.as_deref(),
                    r.get(15)?,
                )
                .map_err(|e| conversion(14, e))?,
                client_tls: r.get(16)?,
                transform: r.get::<_, Option<String>>(17)?.map(Transform::stored),
            };
            Ok((r.col(0)?, sender))
        })
        .db()?;
    rows.collect::<Result<_, _>>().db()
}

/// What claims read of the endpoints `ids` (those that exist), from the
/// writer's cache ([`crate::cache::SenderCache`]); the ones it lacks are
/// read in one statement and kept.
pub(crate) fn senders(
    t: &mut Tx<'_>,
    ids: &[EndpointId],
) -> StoreResult<std::collections::HashMap<EndpointId, Sender>> {
    let mut out = std::collections::HashMap::with_capacity(ids.len());
    let mut missing = Vec::new();
    for id in ids {
        match t.senders.get(*id) {
            Some(s) => {
                out.insert(*id, s.clone());
            }
            None => missing.push(*id),
        }
    }
    // The tests check the cache against the table at every use.
    if t.check_against_table && !out.is_empty() {
        let kept: Vec<EndpointId> = out.keys().copied().collect();
        if read_senders(t, &kept)? != out {
            return Err(StoreError::Backend(
                "the endpoint cache is out of step with the endpoints table".into(),
            ));
        }
    }
    if !missing.is_empty() {
        for (id, s) in read_senders(t, &missing)? {
            t.senders.insert(id, s.clone());
            out.insert(id, s);
        }
    }
    Ok(out)
}

/// The circuit of an endpoint (deleted or not), from the writer's cache
/// ([`crate::cache::CircuitCache`]) when it has one.
pub(crate) fn load_circuit(t: &mut Tx<'_>, id: EndpointId) -> StoreResult<Circuit> {
    if let Some(c) = t.circuits.get(id).cloned() {
        // The tests check the cache against the table at every use.
        if t.check_against_table && read_circuit(t, id)? != c {
            return Err(StoreError::Backend(format!(
                "the circuit cache of endpoint {id} is out of step with the endpoints table"
            )));
        }
        return Ok(c);
    }
    let c = read_circuit(t, id)?;
    t.circuits.insert(id, c.clone());
    Ok(c)
}

/// A stored circuit mode or probe id that does not parse reads as closed /
/// none: the circuit is read inside every claim, and one bad row must not
/// stop the claims of every endpoint.
fn row_to_circuit(r: &Row<'_>) -> duckdb::Result<Circuit> {
    Ok(Circuit {
        mode: r.col(0).unwrap_or(CircuitMode::Closed),
        consecutive_failures: r.get(1)?,
        open_until: r.col(2)?,
        reopen_count: r.get(3)?,
        failing_since: r.col(4)?,
        probe: r.col(5).unwrap_or(None),
    })
}

/// The circuit as the endpoints table holds it.
fn read_circuit(t: &Tx<'_>, id: EndpointId) -> StoreResult<Circuit> {
    t.query_row(
        "SELECT circuit_mode, circuit_failures, circuit_open_until, circuit_reopen_count, \
         circuit_failing_since, circuit_probe FROM endpoints WHERE id = $1",
        params![id.to_string()],
        row_to_circuit,
    )
    .optional()
    .db()?
    .ok_or_else(|| StoreError::not_found("endpoint", id))
}

pub(crate) fn save_circuit(t: &mut Tx<'_>, id: EndpointId, c: &Circuit) -> StoreResult<()> {
    t.execute(
        "UPDATE endpoints SET circuit_mode = $1, circuit_failures = $2, circuit_open_until = $3, \
         circuit_reopen_count = $4, circuit_failing_since = $5, circuit_probe = $6 WHERE id = $7",
        params![
            c.mode.as_str(),
            i64::from(c.consecutive_failures),
            c.open_until.map(Timestamp::as_millis),
            i64::from(c.reopen_count),
            c.failing_since.map(Timestamp::as_millis),
            c.probe.map(|p| p.to_string()),
            id.to_string()
        ],
    )
    .db()?;
    t.circuits.insert(id, c.clone());
    Ok(())
}

/// The circuit of an endpoint of `account`, for the port.
/// Circuits that are not closed, on live endpoints.
fn count_open(t: &Tx<'_>) -> StoreResult<u64> {
    let n: i64 = t
        .query_row(
            "SELECT count(*) FROM endpoints WHERE circuit_mode <> 'closed' AND deleted_at IS NULL",
            [],
            |r| r.get(0),
        )
        .db()?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn count_disabled(t: &Tx<'_>) -> StoreResult<u64> {
    let n: i64 = t
        .query_row(
            "SELECT count(*) FROM endpoints WHERE NOT enabled AND deleted_at IS NULL",
            [],
            |r| r.get(0),
        )
        .db()?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The circuits of the live endpoints of `account`, in listing order: one
/// transaction on the writer, each circuit from its cache.
fn circuit_list(t: &mut Tx<'_>, account: &AccountId) -> StoreResult<Vec<(EndpointId, Circuit)>> {
    let ids: Vec<EndpointId> = list_sealed(t, account)?.into_iter().map(|e| e.id).collect();
    ids.into_iter()
        .map(|id| Ok((id, load_circuit(t, id)?)))
        .collect()
}

pub(crate) fn circuit_of(
    t: &mut Tx<'_>,
    account: &AccountId,
    id: EndpointId,
) -> StoreResult<Circuit> {
    get(t, account, id)?;
    load_circuit(t, id)
}

#[async_trait]
impl EndpointStore for EmbeddedStore {
    async fn endpoint_create(&self, req: Checked<EndpointCreateRequest>) -> StoreResult<Endpoint> {
        self.tx(move |t| create(t, req)).await
    }

    async fn endpoint_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
        let account = account.clone();
        self.tx(move |t| get(t, &account, id)).await
    }

    async fn endpoint_list(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let account = account.clone();
        self.tx(move |t| list(t, &account)).await
    }

    async fn endpoint_update(
        &self,
        endpoint: EndpointKey<'_>,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        let account = account.clone();
        self.tx(move |t| update(t, &account, id, req)).await
    }

    async fn endpoint_rotate_secret(
        &self,
        endpoint: EndpointKey<'_>,
        rotation: SecretRotation,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        let SecretRotation { secret, grace } = rotation;
        let account = account.clone();
        self.tx(move |t| rotate_secret(t, &account, id, secret, grace))
            .await
    }

    async fn endpoint_reseal_secrets(&self, limit: u32) -> StoreResult<u64> {
        self.tx(move |t| reseal(t, limit)).await
    }

    async fn endpoint_set_enabled(
        &self,
        endpoint: EndpointKey<'_>,
        enablement: Enablement,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        let enabled = enablement == Enablement::Enabled;
        let account = account.clone();
        let e = self
            .tx(move |t| set_enabled(t, &account, id, enablement))
            .await?;
        if enabled {
            self.wakeup.notify();
        }
        Ok(e)
    }

    async fn endpoint_delete(&self, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
        let account = account.clone();
        self.tx(move |t| delete(t, &account, id)).await
    }

    async fn endpoint_count_disabled(&self) -> StoreResult<u64> {
        self.tx(|t| count_disabled(t)).await
    }
}

#[async_trait]
impl CircuitStore for EmbeddedStore {
    async fn circuit_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Circuit> {
        let account = account.clone();
        self.tx(move |t| circuit_of(t, &account, id)).await
    }

    async fn circuit_count_open(&self) -> StoreResult<u64> {
        self.tx(|t| count_open(t)).await
    }

    async fn circuit_list(&self, account: &AccountId) -> StoreResult<Vec<(EndpointId, Circuit)>> {
        let account = account.clone();
        self.tx(move |t| circuit_list(t, &account)).await
    }
}
