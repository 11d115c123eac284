//! Portal links (ADR 0049), by the hash of their token.

use crate::util::RowExt;
use async_trait::async_trait;
use control_plane_core::{
    portal_endpoints_parse, portal_endpoints_text, AccountId, PortalLink, PortalLinkCreateRequest,
    PortalLinkId, PortalStore, StoreError, StoreResult, MAX_PORTAL_LINKS_LISTED,
};

use crate::error::PgResultExt;
use crate::store::{in_tx, PostgresStore, Tx};

/// The columns [`row_to_link`] reads, in its order.
const COLUMNS: &str =
    "id, account, role, endpoints, created_at, expires_at, redeemed_at, revoked_at";

fn row_to_link(r: &tokio_postgres::Row) -> StoreResult<PortalLink> {
    Ok(PortalLink {
        id: PortalLinkId(r.col(0)?),
        account: r.col(1)?,
        role: r.col::<String>(2)?.parse()?,
        endpoints: portal_endpoints_parse(&r.col::<String>(3)?)?,
        created_at: r.col(4)?,
        expires_at: r.col(5)?,
        redeemed_at: r.col(6)?,
        revoked_at: r.col(7)?,
    })
}

async fn create(t: &Tx<'_>, req: &PortalLinkCreateRequest) -> StoreResult<PortalLink> {
    let link = req.link_at(t.now);
    let n = t
        .execute(
            "INSERT INTO portal_links (id, account, token_hash, role, endpoints, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (token_hash) DO NOTHING",
            &[
                &link.id.0,
                &link.account.as_str(),
                &req.token_hash(),
                &link.role.as_str(),
                &portal_endpoints_text(&link.endpoints),
                &link.created_at.as_millis(),
                &link.expires_at.as_millis(),
            ],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::Conflict(
            "this portal link's token hash is already stored".into(),
        ));
    }
    Ok(link)
}

async fn list(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<PortalLink>> {
    let rows = t
        .query(
            &*format!(
                "SELECT {COLUMNS} FROM portal_links WHERE account = $1 AND expires_at > $2 \
                 ORDER BY created_at DESC, id DESC LIMIT $3"
            ),
            &[
                &account.as_str(),
                &t.now.as_millis(),
                &MAX_PORTAL_LINKS_LISTED,
            ],
        )
        .await
        .db()?;
    rows.iter().map(row_to_link).collect()
}

async fn revoke(t: &Tx<'_>, account: &AccountId, id: PortalLinkId) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE portal_links SET revoked_at = coalesce(revoked_at, $3) \
             WHERE id = $1 AND account = $2",
            &[&id.0, &account.as_str(), &t.now.as_millis()],
        )
        .await
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("portal link", id));
    }
    Ok(())
}

async fn redeem(t: &Tx<'_>, token_hash: &str) -> StoreResult<Option<PortalLink>> {
    t.query_opt(
        &*format!(
            "UPDATE portal_links SET redeemed_at = $2 WHERE token_hash = $1 \
             AND redeemed_at IS NULL AND revoked_at IS NULL AND expires_at > $2 RETURNING {COLUMNS}"
        ),
        &[&token_hash, &t.now.as_millis()],
    )
    .await
    .db()?
    .as_ref()
    .map(row_to_link)
    .transpose()
}

async fn find(t: &Tx<'_>, token_hash: &str) -> StoreResult<Option<PortalLink>> {
    t.query_opt(
        &*format!(
            "SELECT {COLUMNS} FROM portal_links WHERE token_hash = $1 \
             AND revoked_at IS NULL AND expires_at > $2"
        ),
        &[&token_hash, &t.now.as_millis()],
    )
    .await
    .db()?
    .as_ref()
    .map(row_to_link)
    .transpose()
}

#[async_trait]
impl PortalStore for PostgresStore {
    async fn portal_link_create(&self, req: PortalLinkCreateRequest) -> StoreResult<PortalLink> {
        in_tx!(self, |t| create(&t, &req))
    }

    async fn portal_link_list(&self, account: &AccountId) -> StoreResult<Vec<PortalLink>> {
        in_tx!(self, |t| list(&t, account))
    }

    async fn portal_link_revoke(&self, account: &AccountId, id: PortalLinkId) -> StoreResult<()> {
        in_tx!(self, |t| revoke(&t, account, id))
    }

    async fn portal_link_redeem(&self, token_hash: &str) -> StoreResult<Option<PortalLink>> {
        in_tx!(self, |t| redeem(&t, token_hash))
    }

    async fn portal_link_find(&self, token_hash: &str) -> StoreResult<Option<PortalLink>> {
        in_tx!(self, |t| find(&t, token_hash))
    }
}
