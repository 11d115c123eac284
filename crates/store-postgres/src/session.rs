//! Dashboard sessions (ADR 0021).

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{
    DashboardSession, SessionCreateRequest, SessionStore, StoreError, StoreResult, Timestamp,
    MAX_SESSIONS_LISTED,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

fn row_to_session(r: &tokio_postgres::Row) -> StoreResult<DashboardSession> {
    Ok(DashboardSession {
        id_hash: r.col(0)?,
        token_hash: r.col(1)?,
        csrf: r.col(2)?,
        created_at: r.col(3)?,
        expires_at: r.col(4)?,
    })
}

async fn create(t: &Tx<'_>, req: &SessionCreateRequest) -> StoreResult<DashboardSession> {
    let s = req.session_at(t.now);
    let n = t
        .execute(
            "INSERT INTO sessions (id_hash, token_hash, csrf, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id_hash) DO NOTHING",
            &[
                &s.id_hash,
                &s.token_hash,
                &s.csrf,
                &s.created_at.as_millis(),
                &s.expires_at.as_millis(),
            ],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::Conflict(
            "this session id hash is already stored".into(),
        ));
    }
    Ok(s)
}

async fn get(t: &Tx<'_>, id_hash: &str) -> StoreResult<Option<DashboardSession>> {
    let row = t
        .query_opt(
            "SELECT id_hash, token_hash, csrf, created_at, expires_at FROM sessions \
             WHERE id_hash = $1 AND expires_at > $2",
            &[&id_hash, &t.now.as_millis()],
        )
        .await
        .db()?;
    row.as_ref().map(row_to_session).transpose()
}

async fn extend(t: &Tx<'_>, id_hash: &str, until: Timestamp) -> StoreResult<bool> {
    let n = t
        .execute(
            "UPDATE sessions SET expires_at = $1 WHERE id_hash = $2 AND expires_at > $3",
            &[&until.as_millis(), &id_hash, &t.now.as_millis()],
        )
        .await
        .db()?;
    Ok(n > 0)
}

async fn list(t: &Tx<'_>) -> StoreResult<Vec<DashboardSession>> {
    let rows = t
        .query(
            "SELECT id_hash, token_hash, csrf, created_at, expires_at FROM sessions \
             WHERE expires_at > $1 ORDER BY created_at DESC, id_hash LIMIT $2",
            &[&t.now.as_millis(), &MAX_SESSIONS_LISTED],
        )
        .await
        .db()?;
    rows.iter().map(row_to_session).collect()
}

async fn end(t: &Tx<'_>, id_hash: &str) -> StoreResult<()> {
    t.execute("DELETE FROM sessions WHERE id_hash = $1", &[&id_hash])
        .await
        .db()?;
    Ok(())
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn session_create(&self, req: SessionCreateRequest) -> StoreResult<DashboardSession> {
        in_tx!(self, |t| create(&t, &req))
    }

    async fn session_get(&self, id_hash: &str) -> StoreResult<Option<DashboardSession>> {
        in_tx!(self, |t| get(&t, id_hash))
    }

    async fn session_end(&self, id_hash: &str) -> StoreResult<()> {
        in_tx!(self, |t| end(&t, id_hash))
    }

    async fn session_extend(&self, id_hash: &str, until: Timestamp) -> StoreResult<bool> {
        in_tx!(self, |t| extend(&t, id_hash, until))
    }

    async fn session_list(&self) -> StoreResult<Vec<DashboardSession>> {
        in_tx!(self, |t| list(&t))
    }
}
