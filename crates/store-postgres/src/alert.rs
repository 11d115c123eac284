//! Operational alerts.

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{AccountId, Alert, AlertStore, NewAlert, Page, PageRequest, StoreResult};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

pub(crate) async fn insert(t: &Tx<'_>, alert: &NewAlert) -> StoreResult<()> {
    t.execute(
        "INSERT INTO alerts (account, kind, endpoint_id, delivery_id, message, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &alert.account.as_str(),
            &alert.kind.as_str(),
            &alert.endpoint_id.0,
            &alert.delivery_id.map(|d| d.0),
            &alert.message,
            &t.now.as_millis(),
        ],
    )
    .await
    .db()?;
    Ok(())
}

pub(crate) async fn list(
    t: &Tx<'_>,
    account: &AccountId,
    page: PageRequest,
) -> StoreResult<Page<Alert>> {
    let rows = t
        .query(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
            &[
                &account.as_str(),
                &page.after(),
                &(i64::from(page.limit()) + 1),
            ],
        )
        .await
        .db()?;
    let items = rows
        .iter()
        .map(|r| {
            Ok(Alert {
                id: r.col(0)?,
                account: r.col(1)?,
                kind: r.col(2)?,
                endpoint_id: r.col(3)?,
                delivery_id: r.col(4)?,
                message: r.col(5)?,
                created_at: r.col(6)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, page.limit(), |a| a.id))
}

#[async_trait]
impl AlertStore for PostgresStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        in_tx!(self, |t| list(&t, account, page))
    }
}
