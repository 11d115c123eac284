//! The event-type catalogue (ADR 0025).

use async_trait::async_trait;
use control_plane_core::{
    AccountId, CatalogueStore, Checked, EndpointId, EndpointKey, EventType, EventTypePut,
    Published, StoreError, StoreResult, Timestamp,
};
use duckdb::{params, OptionalExt};

use crate::delivery::publish_example_to;
use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};
use crate::util::RowExt;
use control_plane_store_kit::columns::TYPE_COLS;

type TypeRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Timestamp,
    Timestamp,
);

fn row_to_type(r: &duckdb::Row<'_>) -> duckdb::Result<TypeRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.col(5)?,
        r.col(6)?,
    ))
}

fn json(what: &str, text: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Backend(format!("a stored {what} is not JSON: {e}")))
    })
    .transpose()
}

fn type_from_row(
    (account, name, description, schema, example, created_at, updated_at): TypeRow,
) -> StoreResult<EventType> {
    Ok(EventType {
        account: AccountId::new(account)?,
        name,
        description,
        schema: json("schema", schema)?,
        example: json("example", example)?,
        created_at,
        updated_at,
    })
}

pub(crate) fn put(t: &mut Tx<'_>, req: &Checked<EventTypePut>) -> StoreResult<EventType> {
    t.schemas.forget(&req.account, &req.name);
    let schema = req.schema_text()?;
    let example = req.example_text();
    let account = req.account.as_str();
    let now = t.now.as_millis();
    let changed = t
        .execute(
            "UPDATE event_types SET description = $3, schema = $4, example = $5, updated_at = $6 \
             WHERE account = $1 AND name = $2",
            params![account, req.name, req.description, schema, example, now],
        )
        .db()?;
    if changed == 0 {
        t.execute(
            &format!("INSERT INTO event_types ({TYPE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
            params![
                account,
                req.name,
                req.description,
                schema,
                example,
                now,
                now
            ],
        )
        .db()?;
    }
    get(t, &req.account, &req.name)
}

pub(crate) fn get(t: &Tx<'_>, account: &AccountId, name: &str) -> StoreResult<EventType> {
    t.query_row(
        &format!("SELECT {TYPE_COLS} FROM event_types WHERE account = $1 AND name = $2"),
        params![account.as_str(), name],
        row_to_type,
    )
    .optional()
    .db()?
    .ok_or_else(|| StoreError::not_found("event type", name))
    .and_then(type_from_row)
}

pub(crate) fn list_types(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<EventType>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {TYPE_COLS} FROM event_types WHERE account = $1 ORDER BY name"
        ))
        .db()?;
    let rows = st.query_map(params![account.as_str()], row_to_type).db()?;
    let mut out = Vec::new();
    for row in rows {
        out.push(type_from_row(row.db()?)?);
    }
    Ok(out)
}

pub(crate) fn delete(t: &mut Tx<'_>, account: &AccountId, name: &str) -> StoreResult<()> {
    t.schemas.forget(account, name);
    let n = t
        .execute(
            "DELETE FROM event_types WHERE account = $1 AND name = $2",
            params![account.as_str(), name],
        )
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("event type", name));
    }
    Ok(())
}

fn send_example(
    t: &mut Tx<'_>,
    account: &AccountId,
    name: &str,
    endpoint: EndpointId,
) -> StoreResult<Published> {
    let example = get(t, account, name)?.example_request()?;
    publish_example_to(t, example, endpoint)
}

#[async_trait]
impl CatalogueStore for EmbeddedStore {
    async fn event_type_put(&self, req: Checked<EventTypePut>) -> StoreResult<EventType> {
        self.tx(move |t| put(t, &req)).await
    }

    async fn event_type_get(&self, account: &AccountId, name: &str) -> StoreResult<EventType> {
        let (account, name) = (account.clone(), name.to_string());
        self.tx(move |t| get(t, &account, &name)).await
    }

    async fn event_type_list(&self, account: &AccountId) -> StoreResult<Vec<EventType>> {
        let account = account.clone();
        self.tx(move |t| list_types(t, &account)).await
    }

    async fn event_type_delete(&self, account: &AccountId, name: &str) -> StoreResult<()> {
        let (account, name) = (account.clone(), name.to_string());
        self.tx(move |t| delete(t, &account, &name)).await
    }

    async fn event_type_send_example(
        &self,
        endpoint: EndpointKey<'_>,
        name: &str,
    ) -> StoreResult<Published> {
        let (account, endpoint) = (endpoint.account, endpoint.id);
        let (account, name) = (account.clone(), name.to_string());
        let published = self
            .tx(move |t| send_example(t, &account, &name, endpoint))
            .await?;
        self.wakeup.notify();
        Ok(published)
    }
}
