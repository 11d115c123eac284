//! Request idempotency records.

use crate::util::RowExt;

use async_trait::async_trait;
use control_plane_core::{
    fenced, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyRecord, IdempotencyStore,
    IdempotencyToken, LeaseToken, StoreResult, StoredResponse,
};
use uuid::Uuid;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

pub(crate) async fn begin(
    t: &Tx<'_>,
    req: &IdempotencyBeginRequest,
) -> StoreResult<IdempotencyBegin> {
    let (scope, key) = (req.scope(), req.key());
    let (request_hash, lease) = (req.request_hash(), req.lease());
    let token = Uuid::new_v4();
    let started = t
        .query_opt(
            "INSERT INTO idempotency (scope, key, request_hash, state, token, expires_at) \
             VALUES ($1, $2, $3, 'in_progress', $4, $5) \
             ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'in_progress', \
               token = EXCLUDED.token, status = NULL, body = NULL, expires_at = EXCLUDED.expires_at \
             WHERE idempotency.expires_at <= $6 RETURNING token",
            &[&scope, &key, &request_hash, &token, &t.now.plus(lease).as_millis(), &t.now.as_millis()],
        )
        .await
        .db()?;
    if started.is_some() {
        return Ok(IdempotencyBegin::Started(IdempotencyToken {
            scope: scope.to_string(),
            key: key.to_string(),
            token: LeaseToken(token),
            keep_for: req.ttl(),
        }));
    }
    let row = t
        .query_one("SELECT request_hash, state, status, body FROM idempotency WHERE scope = $1 AND key = $2", &[&scope, &key])
        .await
        .db()?;
    let record = IdempotencyRecord {
        request_hash: row.col(0)?,
        state: row.col(1)?,
        status: row.col(2)?,
        body: row.col(3)?,
    };
    Ok(record.verdict(request_hash))
}

pub(crate) async fn complete(
    t: &Tx<'_>,
    token: &IdempotencyToken,
    r: StoredResponse,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE idempotency SET state = 'completed', status = $1, body = $2, expires_at = $6 \
             WHERE scope = $3 AND key = $4 AND token = $5 AND state = 'in_progress'",
            &[
                &i64::from(r.status),
                &r.body,
                &token.scope,
                &token.key,
                &token.token.0,
                &t.now.plus(token.keep_for).as_millis(),
            ],
        )
        .await
        .db()?;
    fenced(n)
}

pub(crate) async fn abandon(t: &Tx<'_>, token: &IdempotencyToken) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'",
            &[&token.scope, &token.key, &token.token.0],
        )
        .await
        .db()?;
    fenced(n)
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn idempotency_begin(
        &self,
        req: &IdempotencyBeginRequest,
    ) -> StoreResult<IdempotencyBegin> {
        in_tx!(self, |t| begin(&t, req))
    }

    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()> {
        in_tx!(self, |t| complete(&t, token, response))
    }

    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()> {
        in_tx!(self, |t| abandon(&t, token))
    }
}
