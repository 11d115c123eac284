//! Request idempotency records.

use async_trait::async_trait;
use control_plane_core::{
    fenced, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyRecord, IdempotencyStore,
    IdempotencyToken, LeaseToken, StoreResult, StoredResponse,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;

pub(crate) fn begin(
    t: &mut Tx<'_>,
    req: &IdempotencyBeginRequest,
) -> StoreResult<IdempotencyBegin> {
    let (scope, key) = (req.scope(), req.key());
    let (request_hash, lease) = (req.request_hash(), req.lease());
    let now = t.now.as_millis();
    let existing = t
        .query_row(
            "SELECT request_hash, state, status, body FROM idempotency WHERE scope = $1 AND key = $2 AND expires_at > $3",
            params![scope, key, now],
            |r| {
                Ok(IdempotencyRecord {
                    request_hash: r.get(0)?,
                    state: r.get(1)?,
                    status: r.get(2)?,
                    body: r.get(3)?,
                })
            },
        )
        .optional()
        .db()?;
    if let Some(record) = existing {
        return Ok(record.verdict(request_hash));
    }
    let token = LeaseToken::new();
    t.execute(
        "DELETE FROM idempotency WHERE scope = $1 AND key = $2",
        params![scope, key],
    )
    .db()?;
    t.execute(
        "INSERT INTO idempotency (scope, key, request_hash, state, token, expires_at) VALUES ($1, $2, $3, 'in_progress', $4, $5)",
        params![scope, key, request_hash, token.to_string(), t.now.plus(lease).as_millis()],
    )
    .db()?;
    Ok(IdempotencyBegin::Started(IdempotencyToken {
        scope: scope.to_string(),
        key: key.to_string(),
        token,
        keep_for: req.ttl(),
    }))
}

pub(crate) fn complete(
    t: &mut Tx<'_>,
    tok: &IdempotencyToken,
    r: StoredResponse,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE idempotency SET state = 'completed', status = $1, body = $2, expires_at = $6 \
             WHERE scope = $3 AND key = $4 AND token = $5 AND state = 'in_progress'",
            params![
                i64::from(r.status),
                r.body,
                tok.scope,
                tok.key,
                tok.token.to_string(),
                t.now.plus(tok.keep_for).as_millis()
            ],
        )
        .db()?;
    fenced(n as u64)
}

pub(crate) fn abandon(t: &mut Tx<'_>, tok: &IdempotencyToken) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'",
            params![tok.scope, tok.key, tok.token.to_string()],
        )
        .db()?;
    fenced(n as u64)
}

#[async_trait]
impl IdempotencyStore for EmbeddedStore {
    async fn idempotency_begin(
        &self,
        req: &IdempotencyBeginRequest,
    ) -> StoreResult<IdempotencyBegin> {
        let req = req.clone();
        self.tx(move |t| begin(t, &req)).await
    }

    async fn idempotency_complete(
        &self,
        token: &IdempotencyToken,
        response: StoredResponse,
    ) -> StoreResult<()> {
        let token = token.clone();
        self.tx(move |t| complete(t, &token, response)).await
    }

    async fn idempotency_abandon(&self, token: &IdempotencyToken) -> StoreResult<()> {
        let token = token.clone();
        self.tx(move |t| abandon(t, &token)).await
    }
}
