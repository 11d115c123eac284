//! The event-type catalogue (ADR 0025).

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{
    AccountId, CatalogueStore, Checked, EndpointId, EndpointKey, EventType, EventTypePut,
    Published, StoreError, StoreResult,
};
use control_plane_store_kit::columns::TYPE_COLS;

use crate::delivery::publish_example_to;
use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

fn json(what: &str, text: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Backend(format!("a stored {what} is not JSON: {e}")))
    })
    .transpose()
}

fn row_to_type(r: &tokio_postgres::Row) -> StoreResult<EventType> {
    Ok(EventType {
        account: r.col(0)?,
        name: r.col(1)?,
        description: r.col(2)?,
        schema: json("schema", r.col(3)?)?,
        example: json("example", r.col(4)?)?,
        created_at: r.col(5)?,
        updated_at: r.col(6)?,
    })
}

pub(crate) async fn put(t: &Tx<'_>, req: &Checked<EventTypePut>) -> StoreResult<EventType> {
    let schema = req.schema_text()?;
    let example = req.example_text();
    let row = t
        .query_one(
            &format!(
                "INSERT INTO event_types ({TYPE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $6) \
                 ON CONFLICT (account, name) DO UPDATE SET description = EXCLUDED.description, \
                 schema = EXCLUDED.schema, example = EXCLUDED.example, updated_at = EXCLUDED.updated_at \
                 RETURNING {TYPE_COLS}"
            ),
            &[
                &req.account.as_str(),
                &req.name,
                &req.description,
                &schema,
                &example,
                &t.now.as_millis(),
            ],
        )
        .await
        .db()?;
    row_to_type(&row)
}

pub(crate) async fn get(t: &Tx<'_>, account: &AccountId, name: &str) -> StoreResult<EventType> {
    let row = t
        .query_opt(
            &format!("SELECT {TYPE_COLS} FROM event_types WHERE account = $1 AND name = $2"),
            &[&account.as_str(), &name],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::not_found("event type", name))?;
    row_to_type(&row)
}

pub(crate) async fn list_types(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<EventType>> {
    t.query(
        &format!("SELECT {TYPE_COLS} FROM event_types WHERE account = $1 ORDER BY name"),
        &[&account.as_str()],
    )
    .await
    .db()?
    .iter()
    .map(row_to_type)
    .collect()
}

pub(crate) async fn delete(t: &Tx<'_>, account: &AccountId, name: &str) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM event_types WHERE account = $1 AND name = $2",
            &[&account.as_str(), &name],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("event type", name));
    }
    Ok(())
}

async fn send_example(
    t: &Tx<'_>,
    account: &AccountId,
    name: &str,
    endpoint: EndpointId,
) -> StoreResult<Published> {
    let example = get(t, account, name).await?.example_request()?;
    publish_example_to(t, example, endpoint).await
}

#[async_trait]
impl CatalogueStore for PostgresStore {
    async fn event_type_put(&self, req: Checked<EventTypePut>) -> StoreResult<EventType> {
        in_tx!(self, |t| put(&t, &req))
    }

    async fn event_type_get(&self, account: &AccountId, name: &str) -> StoreResult<EventType> {
        in_tx!(self, |t| get(&t, account, name))
    }

    async fn event_type_list(&self, account: &AccountId) -> StoreResult<Vec<EventType>> {
        in_tx!(self, |t| list_types(&t, account))
    }

    async fn event_type_delete(&self, account: &AccountId, name: &str) -> StoreResult<()> {
        in_tx!(self, |t| delete(&t, account, name))
    }

    async fn event_type_send_example(
        &self,
        endpoint: EndpointKey<'_>,
        name: &str,
    ) -> StoreResult<Published> {
        let (account, endpoint) = (endpoint.account, endpoint.id);
        let out = in_tx!(self, |t| send_example(&t, account, name, endpoint))?;
        self.wake().await;
        Ok(out)
    }
}
