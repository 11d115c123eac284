//! Operational alerts.

use async_trait::async_trait;
use control_plane_core::{AccountId, Alert, AlertStore, NewAlert, Page, PageRequest, StoreResult};
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::RowExt;

pub(crate) fn insert(t: &mut Tx<'_>, alert: &NewAlert) -> StoreResult<()> {
    let id = t.next("alert_id");
    t.execute(
        "INSERT INTO alerts VALUES ($1, $2, $3, $4, $5, $6, $7)",
        params![
            id,
            alert.account.as_str(),
            alert.kind.as_str(),
            alert.endpoint_id.to_string(),
            alert.delivery_id.map(|d| d.to_string()),
            alert.message,
            t.now.as_millis()
        ],
    )
    .db()?;
    Ok(())
}

pub(crate) fn list(t: &Tx<'_>, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
    let mut st = t
        .prepare(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::BIGINT IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), page.after(), i64::from(page.limit()) + 1],
            |r| {
                Ok(Alert {
                    id: r.get(0)?,
                    account: r.col(1)?,
                    kind: r.col(2)?,
                    endpoint_id: r.col(3)?,
                    delivery_id: r.col(4)?,
                    message: r.get(5)?,
                    created_at: r.col(6)?,
                })
            },
        )
        .db()?;
    let items = rows.collect::<Result<Vec<_>, _>>().db()?;
    Ok(Page::from_overfetch(items, page.limit(), |a| a.id))
}

#[async_trait]
impl AlertStore for EmbeddedStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        let account = account.clone();
        self.tx(move |t| list(t, &account, page)).await
    }
}
