//! Single-flight ticks.

use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::duration_millis;
use control_plane_core::{
    fenced, LeaseToken, StoreError, StoreResult, TickClaimRequest, TickLease, TickStore,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;

pub(crate) fn claim(
    t: &mut Tx<'_>,
    name: &str,
    lease_for: Duration,
    every: Duration,
) -> StoreResult<Option<TickLease>> {
    let now = t.now.as_millis();
    let row = t
        .query_row(
            "SELECT token, lease_expires_at, state, last_completed_at FROM ticks WHERE name = $1",
            params![name],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            },
        )
        .optional()
        .db()?;
    let token = LeaseToken::new();
    let expires = t.now.plus(lease_for);
    let state = match row {
        None => {
            t.execute(
                "INSERT INTO ticks (name, token, lease_expires_at) VALUES ($1, $2, $3)",
                params![name, token.to_string(), expires.as_millis()],
            )
            .db()?;
            None
        }
        Some((holder, held_until, state, last)) => {
            let held = holder.is_some() && held_until.is_some_and(|e| e > now);
            let early = last.is_some_and(|l| l.saturating_add(duration_millis(every)) > now);
            if held || early {
                return Ok(None);
            }
            t.execute(
                "UPDATE ticks SET token = $1, lease_expires_at = $2 WHERE name = $3",
                params![token.to_string(), expires.as_millis(), name],
            )
            .db()?;
            state
        }
    };
    let state = state
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| StoreError::Backend(format!("stored tick state: {e}")))?;
    Ok(Some(TickLease {
        name: name.to_string(),
        token,
        state,
        expires_at: expires,
    }))
}

pub(crate) fn complete(
    t: &mut Tx<'_>,
    lease: &TickLease,
    state: serde_json::Value,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE ticks SET token = NULL, lease_expires_at = NULL, state = $1, last_completed_at = $2 \
             WHERE name = $3 AND token = $4",
            params![state.to_string(), t.now.as_millis(), lease.name, lease.token.to_string()],
        )
        .db()?;
    fenced(n as u64)
}

#[async_trait]
impl TickStore for EmbeddedStore {
    async fn tick_claim(&self, req: &TickClaimRequest) -> StoreResult<Option<TickLease>> {
        let req = req.clone();
        self.work_tx(move |t| claim(t, req.name(), req.lease_for(), req.every()))
            .await
    }

    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()> {
        let lease = lease.clone();
        self.work_tx(move |t| complete(t, &lease, state)).await
    }
}
