//! Endpoints and their circuits.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::{
    custom_headers_text, AccountId, Checked, Circuit, CircuitMode, CircuitStore, ClientCredentials,
    ClientTls, Enablement, Endpoint, EndpointCreateRequest, EndpointId, EndpointKey, EndpointRetry,
    EndpointStore, EndpointUpdateRequest, EventFilter, Secret, SecretRotation, SigningSecrets,
    StoreError, StoreResult, Timestamp, Transform,
};
use control_plane_store_kit::columns::ENDPOINT_COLS;
use control_plane_store_kit::reseal_candidates;
use control_plane_store_kit::sealing::{Slot, StoredCredentials, RESEAL_UPDATE};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};
use crate::util::RowExt;

/// Seals the credentials of up to `limit` endpoints (deleted ones included)
/// that are not sealed under the current key; how many it rewrote.
pub(crate) async fn reseal(t: &Tx<'_>, limit: u32) -> StoreResult<u64> {
    let pattern = t.keys.current_pattern()?;
    let sql = concat!(reseal_candidates!(), " FOR NO KEY UPDATE");
    let rows = t.query(sql, &[&pattern, &i64::from(limit)]).await.db()?;
    for r in &rows {
        let id: Uuid = r.col(0)?;
        let stored = StoredCredentials {
            secret: r.col(1)?,
            previous: r.col(2)?,
            headers: r.col(3)?,
            oauth2: r.col(4)?,
            client_tls: r.col(5)?,
        };
        let c = t.keys.reseal_credentials(id.as_bytes(), &stored)?;
        t.execute(
            RESEAL_UPDATE,
            &[
                &c.secret,
                &c.previous,
                &id,
                &c.headers,
                &c.oauth2,
                &c.client_tls,
            ],
        )
        .await
        .db()?;
    }
    Ok(rows.len() as u64)
}

/// The endpoint as read, its credentials opened with the transaction's keys.
fn opened(t: &Tx<'_>, e: Endpoint) -> StoreResult<Endpoint> {
    t.keys.open_endpoint(e)
}

pub(crate) fn row_to_endpoint(r: &Row) -> StoreResult<Endpoint> {
    let types: serde_json::Value = r.col(6)?;
    let event_types: Vec<String> = serde_json::from_value(types)
        .map_err(|e| StoreError::Backend(format!("stored event types: {e}")))?;
    Ok(Endpoint {
        id: r.col(0)?,
        account: r.col(1)?,
        url: r.col(2)?,
        secrets: SigningSecrets {
            current: r.col(3)?,
            previous: r.col(4)?,
            previous_expires_at: r.col(5)?,
        },
        event_types,
        enabled: r.col(7)?,
        disabled_reason: r.col(8)?,
        rate_limit_per_s: r.col(9)?,
        ordered: r.col(10)?,
        description: r.col(11)?,
        created_at: r.col(12)?,
        updated_at: r.col(13)?,
        max_in_flight: r.col(14)?,
        filter: r.col(15)?,
        headers: r.col(16)?,
        oauth2: r.col(17)?,
        retry: EndpointRetry::from_stored(r.col::<Option<String>>(18)?.as_deref(), r.col(19)?)?,
        client_tls: r.col(20)?,
        transform: r.col::<Option<String>>(21)?.map(Transform::stored),
    })
}

pub(crate) async fn create(
    t: &Tx<'_>,
    req: Checked<EndpointCreateRequest>,
) -> StoreResult<Endpoint> {
    if let Some(quota) = req.quota {
        within_quota(t, &req.account, quota).await?;
    }
    let id = EndpointId::new();
    let types = serde_json::to_value(&req.event_types)
        .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    t.execute(
        "INSERT INTO endpoints (id, account, url, secret, event_types, enabled, rate_limit_per_s, ordered, \
         description, created_at, updated_at, max_in_flight, filter, headers, oauth2, retry_schedule, max_attempts, \
         client_tls, transform) VALUES ($1, $2, $3, $4, $5, true, $6, $7, $8, $9, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
        &[
            &id.0,
            &req.account.as_str(),
            &req.url,
            &t.keys.seal(id.0.as_bytes(), Slot::Current, &req.secret)?,
            &types,
            &req.rate_limit_per_s.map(i64::from),
            &req.ordered,
            &req.description,
            &t.now.as_millis(),
            &req.max_in_flight.map(i64::from),
            &req.filter.as_ref().map(EventFilter::to_text),
            &t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::Headers,
                custom_headers_text(&req.headers)?.as_ref(),
            )?,
            &t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::OAuth2,
                req.oauth2
                    .as_ref()
                    .map(ClientCredentials::to_text)
                    .transpose()?
                    .as_ref(),
            )?,
            &req.retry.as_ref().map(EndpointRetry::schedule_text),
            &req.retry.as_ref().map(|r| i64::from(r.max_attempts())),
            &t.keys.seal_optional(
                id.0.as_bytes(),
                Slot::ClientTls,
                req.client_tls
                    .as_ref()
                    .map(ClientTls::to_text)
                    .transpose()?
                    .as_ref(),
            )?,
            &req.transform.as_ref().map(Transform::as_str),
        ],
    )
    .await
    .db()?;
    t.execute(
        "INSERT INTO circuits (endpoint_id, mode, failures, reopen_count) VALUES ($1, 'closed', 0, 0)",
        &[&id.0],
    )
    .await
    .db()?;
    t.execute(
        "INSERT INTO endpoint_flow (endpoint_id) VALUES ($1)",
        &[&id.0],
    )
    .await
    .db()?;
    get(t, &req.account, id).await
}

/// `OverQuota` unless `account` holds fewer than `quota` live endpoints.
/// The count is taken under a lock per account held to the end of the
/// transaction (an advisory lock: no row is locked), so that creates racing
/// in any number of replicas count one after the other; read committed,
/// the count after the lock sees every create that held it before.
async fn within_quota(t: &Tx<'_>, account: &AccountId, quota: u32) -> StoreResult<()> {
    t.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('endpoint quota of ' || $1, 0))",
        &[&account.as_str()],
    )
    .await
    .db()?;
    let row = t
        .query_one(
            "SELECT count(*) FROM endpoints WHERE account = $1 AND deleted_at IS NULL",
            &[&account.as_str()],
        )
        .await
        .db()?;
    StoreError::within_quota("endpoints", row.col(0)?, quota)
}

pub(crate) async fn get(t: &Tx<'_>, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
    let row = t
        .query_opt(
            &format!("SELECT {ENDPOINT_COLS} FROM endpoints WHERE id = $1 AND account = $2 AND deleted_at IS NULL"),
            &[&id.0, &account.as_str()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("endpoint", id))?;
    opened(t, row_to_endpoint(&row)?)
}

/// The live endpoints of `account`, oldest first, their secrets opened.
pub(crate) async fn list(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
    list_sealed(t, account)
        .await?
        .into_iter()
        .map(|e| opened(t, e))
        .collect()
}

/// [`list`] with the secrets left as stored: for fan-out, which reads no
/// secret and should not pay to open them.
pub(crate) async fn list_sealed(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
    let list = t
        .prepare_cached(&format!(
            "SELECT {ENDPOINT_COLS} FROM endpoints WHERE account = $1 AND deleted_at IS NULL ORDER BY created_at, id"
        ))
        .await
        .db()?;
    let rows = t.query(&list, &[&account.as_str()]).await.db()?;
    rows.iter().map(row_to_endpoint).collect()
}

pub(crate) async fn update(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    req: EndpointUpdateRequest,
) -> StoreResult<Endpoint> {
    let mut e = get(t, account, id).await?;
    req.apply_to(&mut e)?;
    let types = serde_json::to_value(&e.event_types)
        .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    t.execute(
        "UPDATE endpoints SET url = $1, event_types = $2, ordered = $3, rate_limit_per_s = $4, \
         description = $5, updated_at = $6, max_in_flight = $8, filter = $9, headers = $10, oauth2 = $11, \
         retry_schedule = $12, max_attempts = $13, client_tls = $14, transform = $15 WHERE id = $7",
        &[
            &e.url,
            &types,
            &e.ordered,
            &e.rate_limit_per_s.map(i64::from),
            &e.description,
            &t.now.as_millis(),
            &id.0,
            &e.max_in_flight.map(i64::from),
            &e.filter.as_ref().map(EventFilter::to_text),
            &t.keys
                .seal_optional(id.0.as_bytes(), Slot::Headers, e.headers.as_ref())?,
            &t.keys
                .seal_optional(id.0.as_bytes(), Slot::OAuth2, e.oauth2.as_ref())?,
            &e.retry.as_ref().map(EndpointRetry::schedule_text),
            &e.retry.as_ref().map(|r| i64::from(r.max_attempts())),
            &t.keys
                .seal_optional(id.0.as_bytes(), Slot::ClientTls, e.client_tls.as_ref())?,
            &e.transform.as_ref().map(Transform::as_str),
        ],
    )
    .await
    .db()?;
    get(t, account, id).await
}

pub(crate) async fn rotate_secret(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    secret: Secret,
    grace: Duration,
) -> StoreResult<Endpoint> {
    let e = get(t, account, id).await?;
    control_plane_core::check_rotation(&e.secrets.current, &secret)?;
    t.execute(
        "UPDATE endpoints SET secret = $1, previous_secret = $2, previous_expires_at = $3, updated_at = $4 WHERE id = $5",
        &[
            &t.keys.seal(id.0.as_bytes(), Slot::Current, &secret)?,
            &t.keys.seal(id.0.as_bytes(), Slot::Previous, &e.secrets.current)?,
            &t.now.plus(grace).as_millis(),
            &t.now.as_millis(),
            &id.0,
        ],
    )
    .await
    .db()?;
    get(t, account, id).await
}

pub(crate) async fn set_enabled(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
    enablement: Enablement,
) -> StoreResult<Endpoint> {
    get(t, account, id).await?;
    let (enabled, reason) = enablement.into_row()?;
    t.execute(
        "UPDATE endpoints SET enabled = $1, disabled_reason = $2, updated_at = $3 WHERE id = $4",
        &[&enabled, &reason, &t.now.as_millis(), &id.0],
    )
    .await
    .db()?;
    get(t, account, id).await
}

/// Disables an endpoint for a reason the store found (410, failing window).
pub(crate) async fn disable(t: &Tx<'_>, id: EndpointId, reason: &str) -> StoreResult<bool> {
    let n = t
        .execute(
            "UPDATE endpoints SET enabled = false, disabled_reason = $1, updated_at = $2 WHERE id = $3 AND enabled",
            &[&reason, &t.now.as_millis(), &id.0],
        )
        .await
        .db()?;
    Ok(n == 1)
}

pub(crate) async fn delete(t: &Tx<'_>, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
    get(t, account, id).await?;
    t.execute(
        "UPDATE endpoints SET deleted_at = $1, updated_at = $1 WHERE id = $2",
        &[&t.now.as_millis(), &id.0],
    )
    .await
    .db()?;
    // Its live deliveries die; a lease still held on one is lost.
    t.execute(
        "WITH g AS (DELETE FROM delivery_queue WHERE endpoint_id = $2 \
         RETURNING delivery_id, account, seq, attempts, max_attempts, due_at), \
         tally AS (INSERT INTO delivery_tallies (account, state, n) \
         SELECT account, 'dead', count(*) FROM g GROUP BY account) \
         INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, \
         lease_token, last_outcome, finished_at, account, seq) \
         SELECT delivery_id, 'dead', attempts, max_attempts, due_at, 'endpoint removed', NULL, NULL, $1, \
         account, seq FROM g",
        &[&t.now.as_millis(), &id.0],
    )
    .await
    .db()
}

/// A stored circuit mode that does not parse reads as closed: the circuit
/// is read inside every claim, and one bad row must not stop the claims of
/// every endpoint.
fn row_to_circuit(r: &Row) -> StoreResult<Circuit> {
    Ok(Circuit {
        mode: r.col(0).unwrap_or(CircuitMode::Closed),
        consecutive_failures: r.col(1)?,
        open_until: r.col(2)?,
        reopen_count: r.col(3)?,
        failing_since: r.col(4)?,
        probe: r.col(5)?,
    })
}

const CIRCUIT_COLS: &str = "mode, failures, open_until, reopen_count, failing_since, probe";

/// The circuit of an endpoint; `lock` takes its row lock for a read-modify-write.
pub(crate) async fn load_circuit(t: &Tx<'_>, id: EndpointId, lock: bool) -> StoreResult<Circuit> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {CIRCUIT_COLS} FROM circuits WHERE endpoint_id = $1{lock}");
    let row = t
        .query_opt(&sql, &[&id.0])
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("endpoint", id))?;
    row_to_circuit(&row)
}

pub(crate) async fn save_circuit(t: &Tx<'_>, id: EndpointId, c: &Circuit) -> StoreResult<()> {
    t.execute(
        "UPDATE circuits SET mode = $1, failures = $2, open_until = $3, reopen_count = $4, failing_since = $5, \
         probe = $6 WHERE endpoint_id = $7",
        &[
            &c.mode.as_str(),
            &i64::from(c.consecutive_failures),
            &c.open_until.map(Timestamp::as_millis),
            &i64::from(c.reopen_count),
            &c.failing_since.map(Timestamp::as_millis),
            &c.probe.map(|p| p.0),
            &id.0,
        ],
    )
    .await
    .db()?;
    Ok(())
}

/// Circuits that are not closed, on live endpoints.
async fn count_open(t: &Tx<'_>) -> StoreResult<u64> {
    let row = t
        .query_one(
            "SELECT count(*) FROM circuits c JOIN endpoints e ON e.id = c.endpoint_id \
             WHERE c.mode <> 'closed' AND e.deleted_at IS NULL",
            &[],
        )
        .await
        .db()?;
    row.col(0)
}

async fn count_disabled(t: &Tx<'_>) -> StoreResult<u64> {
    let row = t
        .query_one(
            "SELECT count(*) FROM endpoints WHERE NOT enabled AND deleted_at IS NULL",
            &[],
        )
        .await
        .db()?;
    row.col(0)
}

/// The circuits of the live endpoints of `account`, in listing order.
async fn circuit_list(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<(EndpointId, Circuit)>> {
    let rows = t
        .query(
            "SELECT c.mode, c.failures, c.open_until, c.reopen_count, c.failing_since, c.probe, e.id \
             FROM endpoints e JOIN circuits c ON c.endpoint_id = e.id \
             WHERE e.account = $1 AND e.deleted_at IS NULL ORDER BY e.created_at, e.id",
            &[&account.as_str()],
        )
        .await
        .db()?;
    rows.iter()
        .map(|r| Ok((r.col(6)?, row_to_circuit(r)?)))
        .collect()
}

pub(crate) async fn circuit_of(
    t: &Tx<'_>,
    account: &AccountId,
    id: EndpointId,
) -> StoreResult<Circuit> {
    get(t, account, id).await?;
    load_circuit(t, id, false).await
}

#[async_trait]
impl EndpointStore for PostgresStore {
    async fn endpoint_create(&self, req: Checked<EndpointCreateRequest>) -> StoreResult<Endpoint> {
        in_tx!(self, |t| create(&t, req))
    }

    async fn endpoint_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Endpoint> {
        in_tx!(self, |t| get(&t, account, id))
    }

    async fn endpoint_list(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        in_tx!(self, |t| list(&t, account))
    }

    async fn endpoint_update(
        &self,
        endpoint: EndpointKey<'_>,
        req: EndpointUpdateRequest,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        in_tx!(self, |t| update(&t, account, id, req))
    }

    async fn endpoint_rotate_secret(
        &self,
        endpoint: EndpointKey<'_>,
        rotation: SecretRotation,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        let SecretRotation { secret, grace } = rotation;
        in_tx!(self, |t| rotate_secret(&t, account, id, secret, grace))
    }

    async fn endpoint_reseal_secrets(&self, limit: u32) -> StoreResult<u64> {
        in_tx!(self, |t| reseal(&t, limit))
    }

    async fn endpoint_set_enabled(
        &self,
        endpoint: EndpointKey<'_>,
        enablement: Enablement,
    ) -> StoreResult<Endpoint> {
        let (account, id) = (endpoint.account, endpoint.id);
        let out = in_tx!(self, |t| set_enabled(&t, account, id, enablement))?;
        self.wake().await;
        Ok(out)
    }

    async fn endpoint_delete(&self, account: &AccountId, id: EndpointId) -> StoreResult<u64> {
        in_tx!(self, |t| delete(&t, account, id))
    }

    async fn endpoint_count_disabled(&self) -> StoreResult<u64> {
        in_tx!(self, |t| count_disabled(&t))
    }
}

#[async_trait]
impl CircuitStore for PostgresStore {
    async fn circuit_get(&self, account: &AccountId, id: EndpointId) -> StoreResult<Circuit> {
        in_tx!(self, |t| circuit_of(&t, account, id))
    }

    async fn circuit_count_open(&self) -> StoreResult<u64> {
        in_tx!(self, |t| count_open(&t))
    }

    async fn circuit_list(&self, account: &AccountId) -> StoreResult<Vec<(EndpointId, Circuit)>> {
        in_tx!(self, |t| circuit_list(&t, account))
    }
}
