//! Operational alerts.

use async_trait::async_trait;
use control_plane_core::*;
use duckdb::params;

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;
use crate::util::{col_uuid, ts};

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
    page.validate()?;
    let mut st = t
        .prepare(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::BIGINT IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), page.after, i64::from(page.limit) + 1],
            |r| {
                let delivery: Option<String> = r.get(4)?;
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    col_uuid(r, 3)?,
                    delivery,
                    r.get::<_, String>(5)?,
                    ts(r, 6)?,
                ))
            },
        )
        .db()?;
    let mut items = Vec::new();
    for row in rows {
        let (id, account, kind, endpoint, delivery, message, created_at) = row.db()?;
        items.push(Alert {
            id,
            account: AccountId::new(account)?,
            kind: kind.parse()?,
            endpoint_id: EndpointId(endpoint),
            delivery_id: delivery
                .and_then(|d| uuid::Uuid::parse_str(&d).ok())
                .map(DeliveryId),
            message,
            created_at,
        });
    }
    Ok(Page::from_overfetch(items, page.limit, |a| a.id))
}

#[async_trait]
impl AlertStore for EmbeddedStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        let account = account.clone();
        self.tx(move |t| list(t, &account, page)).await
    }
}
