//! Dashboard sessions (ADR 0021).

use async_trait::async_trait;
use control_plane_core::{
    DashboardSession, SessionCreateRequest, SessionStore, StoreError, StoreResult, Timestamp,
    MAX_SESSIONS_LISTED,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};

fn create(t: &mut Tx<'_>, req: &SessionCreateRequest) -> StoreResult<DashboardSession> {
    let s = req.session_at(t.now);
    let taken: Option<i64> = t
        .query_row(
            "SELECT 1 FROM sessions WHERE id_hash = $1",
            params![s.id_hash],
            |r| r.get(0),
        )
        .optional()
        .db()?;
    if taken.is_some() {
        return Err(StoreError::Conflict(
            "this session id hash is already stored".into(),
        ));
    }
    t.execute(
        "INSERT INTO sessions (id_hash, token_hash, csrf, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
        params![
            s.id_hash,
            s.token_hash,
            s.csrf,
            s.created_at.as_millis(),
            s.expires_at.as_millis()
        ],
    )
    .db()?;
    Ok(s)
}

fn row_to_session(r: &duckdb::Row<'_>) -> duckdb::Result<DashboardSession> {
    Ok(DashboardSession {
        id_hash: r.get(0)?,
        token_hash: r.get(1)?,
        csrf: r.get(2)?,
        created_at: Timestamp::from_millis(r.get(3)?),
        expires_at: Timestamp::from_millis(r.get(4)?),
    })
}

fn get(t: &Tx<'_>, id_hash: &str) -> StoreResult<Option<DashboardSession>> {
    t.query_row(
        "SELECT id_hash, token_hash, csrf, created_at, expires_at FROM sessions \
         WHERE id_hash = $1 AND expires_at > $2",
        params![id_hash, t.now.as_millis()],
        row_to_session,
    )
    .optional()
    .db()
}

fn extend(t: &mut Tx<'_>, id_hash: &str, until: Timestamp) -> StoreResult<bool> {
    let n = t
        .execute(
            "UPDATE sessions SET expires_at = $1 WHERE id_hash = $2 AND expires_at > $3",
            params![until.as_millis(), id_hash, t.now.as_millis()],
        )
        .db()?;
    Ok(n > 0)
}

fn list(t: &Tx<'_>) -> StoreResult<Vec<DashboardSession>> {
    let mut st = t
        .prepare(
            "SELECT id_hash, token_hash, csrf, created_at, expires_at FROM sessions \
             WHERE expires_at > $1 ORDER BY created_at DESC, id_hash LIMIT $2",
        )
        .db()?;
    let rows = st
        .query_map(
            params![t.now.as_millis(), MAX_SESSIONS_LISTED],
            row_to_session,
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

fn end(t: &mut Tx<'_>, id_hash: &str) -> StoreResult<()> {
    t.execute("DELETE FROM sessions WHERE id_hash = $1", params![id_hash])
        .db()?;
    Ok(())
}

#[async_trait]
impl SessionStore for EmbeddedStore {
    async fn session_create(&self, req: SessionCreateRequest) -> StoreResult<DashboardSession> {
        self.tx(move |t| create(t, &req)).await
    }

    async fn session_get(&self, id_hash: &str) -> StoreResult<Option<DashboardSession>> {
        let id_hash = id_hash.to_string();
        self.tx(move |t| get(t, &id_hash)).await
    }

    async fn session_end(&self, id_hash: &str) -> StoreResult<()> {
        let id_hash = id_hash.to_string();
        self.tx(move |t| end(t, &id_hash)).await
    }

    async fn session_extend(&self, id_hash: &str, until: Timestamp) -> StoreResult<bool> {
        let id_hash = id_hash.to_string();
        self.tx(move |t| extend(t, &id_hash, until)).await
    }

    async fn session_list(&self) -> StoreResult<Vec<DashboardSession>> {
        self.tx(|t| list(t)).await
    }
}
