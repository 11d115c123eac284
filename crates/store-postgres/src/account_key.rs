//! Account API keys.

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{
    AccountId, AccountKey, AccountKeyStore, IdempotencyOwner, KeyHash, KeyId, StoreError,
    StoreResult,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

fn row_to_key(r: &tokio_postgres::Row) -> StoreResult<AccountKey> {
    Ok(AccountKey {
        id: r.col(0)?,
        account: r.col(1)?,
        created_at: r.col(2)?,
    })
}

pub(crate) async fn create(
    t: &Tx<'_>,
    account: &AccountId,
    key_hash: &KeyHash,
) -> StoreResult<AccountKey> {
    let key_hash = key_hash.as_str();
    let id = KeyId::new();
    let row = t
        .query_opt(
            "INSERT INTO account_keys (id, account, key_hash, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key_hash) DO NOTHING RETURNING id, account, created_at",
            &[&id.0, &account.as_str(), &key_hash, &t.now.as_millis()],
        )
        .await
        .db()?
        .ok_or_else(|| StoreError::Conflict("this key hash is already stored".into()))?;
    row_to_key(&row)
}

pub(crate) async fn find(t: &Tx<'_>, key_hash: &str) -> StoreResult<Option<AccountKey>> {
    t.query_opt(
        "SELECT id, account, created_at FROM account_keys WHERE key_hash = $1",
        &[&key_hash],
    )
    .await
    .db()?
    .as_ref()
    .map(row_to_key)
    .transpose()
}

pub(crate) async fn revoke(t: &Tx<'_>, account: &AccountId, id: KeyId) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM account_keys WHERE id = $1 AND account = $2",
            &[&id.0, &account.as_str()],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("account key", id));
    }
    // Its stored answers go with it (ADR 0043).
    t.execute(
        "DELETE FROM idempotency WHERE scope = $1",
        &[&IdempotencyOwner::Key(account, id).scope()],
    )
    .await
    .db()?;
    Ok(())
}

#[async_trait]
impl AccountKeyStore for PostgresStore {
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &KeyHash,
    ) -> StoreResult<AccountKey> {
        in_tx!(self, |t| create(&t, account, key_hash))
    }

    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>> {
        in_tx!(self, |t| find(&t, key_hash))
    }

    async fn account_key_revoke(&self, account: &AccountId, id: KeyId) -> StoreResult<()> {
        in_tx!(self, |t| revoke(&t, account, id))
    }
}
