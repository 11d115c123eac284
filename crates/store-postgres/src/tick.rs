//! Single-flight ticks.

use crate::util::RowExt;
use std::time::Duration;

use async_trait::async_trait;
use control_plane_core::duration_millis;
use control_plane_core::{fenced, LeaseToken, StoreResult, TickClaimRequest, TickLease, TickStore};
use uuid::Uuid;

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

pub(crate) async fn claim(
    t: &Tx<'_>,
    name: &str,
    lease_for: Duration,
    every: Duration,
) -> StoreResult<Option<TickLease>> {
    let token = Uuid::new_v4();
    let expires = t.now.plus(lease_for);
    let row = t
        .query_opt(
            "INSERT INTO ticks (name, token, lease_expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, lease_expires_at = EXCLUDED.lease_expires_at \
             WHERE (ticks.token IS NULL OR ticks.lease_expires_at <= $4) \
               AND (ticks.last_completed_at IS NULL OR ticks.last_completed_at + $5 <= $4) \
             RETURNING state",
            &[&name, &token, &expires.as_millis(), &t.now.as_millis(), &duration_millis(every)],
        )
        .await
        .db()?;
    row.map(|r| {
        Ok(TickLease {
            name: name.to_string(),
            token: LeaseToken(token),
            state: r.col(0)?,
            expires_at: expires,
        })
    })
    .transpose()
}

pub(crate) async fn complete(
    t: &Tx<'_>,
    lease: &TickLease,
    state: serde_json::Value,
) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE ticks SET token = NULL, lease_expires_at = NULL, state = $1, last_completed_at = $2 \
             WHERE name = $3 AND token = $4",
            &[&state, &t.now.as_millis(), &lease.name, &lease.token.0],
        )
        .await
        .db()?;
    fenced(n)
}

#[async_trait]
impl TickStore for PostgresStore {
    async fn tick_claim(&self, req: &TickClaimRequest) -> StoreResult<Option<TickLease>> {
        in_tx!(self, |t| claim(
            &t,
            req.name(),
            req.lease_for(),
            req.every()
        ))
    }

    async fn tick_complete(&self, lease: &TickLease, state: serde_json::Value) -> StoreResult<()> {
        in_tx!(self, |t| complete(&t, lease, state))
    }
}
