//! Account API keys.

use async_trait::async_trait;
use control_plane_core::{
    AccountId, AccountKey, AccountKeyStore, IdempotencyOwner, KeyHash, KeyId, StoreError,
    StoreResult,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::EmbeddedStore;
use crate::store::Tx;

fn row_to_key(r: &duckdb::Row<'_>) -> duckdb::Result<(String, String, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

fn key_from_row((id, account, created_at): (String, String, i64)) -> StoreResult<AccountKey> {
    Ok(AccountKey {
        id: id.parse()?,
        account: AccountId::new(account)?,
        created_at: control_plane_core::Timestamp::from_millis(created_at),
    })
}

pub(crate) fn create(
    t: &mut Tx<'_>,
    account: &AccountId,
    key_hash: &KeyHash,
) -> StoreResult<AccountKey> {
    let key_hash = key_hash.as_str();
    let taken: Option<i64> = t
        .query_row(
            "SELECT 1 FROM account_keys WHERE key_hash = $1",
            params![key_hash],
            |r| r.get(0),
        )
        .optional()
        .db()?;
    if taken.is_some() {
        return Err(StoreError::Conflict(
            "this key hash is already stored".into(),
        ));
    }
    let key = AccountKey {
        id: KeyId::new(),
        account: account.clone(),
        created_at: t.now,
    };
    t.execute(
        "INSERT INTO account_keys (id, account, key_hash, created_at) VALUES ($1, $2, $3, $4)",
        params![
            key.id.to_string(),
            account.as_str(),
            key_hash,
            t.now.as_millis()
        ],
    )
    .db()?;
    Ok(key)
}

pub(crate) fn find(t: &Tx<'_>, key_hash: &str) -> StoreResult<Option<AccountKey>> {
    t.query_row(
        "SELECT id, account, created_at FROM account_keys WHERE key_hash = $1",
        params![key_hash],
        row_to_key,
    )
    .optional()
    .db()?
    .map(key_from_row)
    .transpose()
}

pub(crate) fn revoke(t: &mut Tx<'_>, account: &AccountId, id: KeyId) -> StoreResult<()> {
    let n = t
        .execute(
            "DELETE FROM account_keys WHERE id = $1 AND account = $2",
            params![id.to_string(), account.as_str()],
        )
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("account key", id));
    }
    // Its stored answers go with it (ADR 0043).
    t.execute(
        "DELETE FROM idempotency WHERE scope = $1",
        params![IdempotencyOwner::Key(account, id).scope()],
    )
    .db()?;
    Ok(())
}

#[async_trait]
impl AccountKeyStore for EmbeddedStore {
    async fn account_key_create(
        &self,
        account: &AccountId,
        key_hash: &KeyHash,
    ) -> StoreResult<AccountKey> {
        let account = account.clone();
        let key_hash = key_hash.clone();
        self.tx(move |t| create(t, &account, &key_hash)).await
    }

    async fn account_key_find(&self, key_hash: &str) -> StoreResult<Option<AccountKey>> {
        let key_hash = key_hash.to_string();
        self.tx(move |t| find(t, &key_hash)).await
    }

    async fn account_key_revoke(&self, account: &AccountId, id: KeyId) -> StoreResult<()> {
        let account = account.clone();
        self.tx(move |t| revoke(t, &account, id)).await
    }
}
