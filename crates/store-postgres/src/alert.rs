//! Operational alerts.

use async_trait::async_trait;
use control_plane_core::*;
use uuid::Uuid;

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
    page.validate()?;
    let rows = t
        .query(
            "SELECT id, account, kind, endpoint_id, delivery_id, message, created_at FROM alerts \
             WHERE account = $1 AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
            &[&account.as_str(), &page.after, &(i64::from(page.limit) + 1)],
        )
        .await
        .db()?;
    let items = rows
        .iter()
        .map(|r| {
            Ok(Alert {
                id: r.get(0),
                account: AccountId::new(r.get::<_, String>(1))?,
                kind: r.get::<_, String>(2).parse()?,
                endpoint_id: EndpointId(r.get(3)),
                delivery_id: r.get::<_, Option<Uuid>>(4).map(DeliveryId),
                message: r.get(5),
                created_at: Timestamp::from_millis(r.get(6)),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Page::from_overfetch(items, page.limit, |a| a.id))
}

#[async_trait]
impl AlertStore for PostgresStore {
    async fn alert_list(&self, account: &AccountId, page: PageRequest) -> StoreResult<Page<Alert>> {
        in_tx!(self, |t| list(&t, account, page))
    }
}
