//! Portal links (ADR 0049), by the hash of their token.

use async_trait::async_trait;
use control_plane_core::{
    portal_endpoints_parse, portal_endpoints_text, AccountId, PortalLink, PortalLinkCreateRequest,
    PortalLinkId, PortalStore, StoreError, StoreResult, Timestamp, MAX_PORTAL_LINKS_LISTED,
};
use duckdb::{params, OptionalExt};

use crate::error::DuckResultExt;
use crate::store::{EmbeddedStore, Tx};

/// The columns [`row_to_link`] reads, in its order.
const COLUMNS: &str =
    "id, account, role, endpoints, created_at, expires_at, redeemed_at, revoked_at";

/// A link's columns as DuckDB reads them.
type LinkRow = (
    String,
    String,
    String,
    String,
    i64,
    i64,
    Option<i64>,
    Option<i64>,
);

fn row_to_link(r: &duckdb::Row<'_>) -> duckdb::Result<LinkRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn link_of(row: LinkRow) -> StoreResult<PortalLink> {
    let (id, account, role, endpoints, created_at, expires_at, redeemed_at, revoked_at) = row;
    Ok(PortalLink {
        id: id.parse()?,
        account: AccountId::new(account)?,
        role: role.parse()?,
        endpoints: portal_endpoints_parse(&endpoints)?,
        created_at: Timestamp::from_millis(created_at),
        expires_at: Timestamp::from_millis(expires_at),
        redeemed_at: redeemed_at.map(Timestamp::from_millis),
        revoked_at: revoked_at.map(Timestamp::from_millis),
    })
}

fn create(t: &mut Tx<'_>, req: &PortalLinkCreateRequest) -> StoreResult<PortalLink> {
    let link = req.link_at(t.now);
    let taken: Option<i64> = t
        .query_row(
            "SELECT 1 FROM portal_links WHERE token_hash = $1",
            params![req.token_hash()],
            |r| r.get(0),
        )
        .optional()
        .db()?;
    if taken.is_some() {
        return Err(StoreError::Conflict(
            "this portal link's token hash is already stored".into(),
        ));
    }
    t.execute(
        "INSERT INTO portal_links (id, account, token_hash, role, endpoints, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        params![
            link.id.to_string(),
            link.account.as_str(),
            req.token_hash(),
            link.role.as_str(),
            portal_endpoints_text(&link.endpoints),
            link.created_at.as_millis(),
            link.expires_at.as_millis()
        ],
    )
    .db()?;
    Ok(link)
}

fn list(t: &Tx<'_>, account: &AccountId) -> StoreResult<Vec<PortalLink>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {COLUMNS} FROM portal_links WHERE account = $1 AND expires_at > $2 \
             ORDER BY created_at DESC, id DESC LIMIT $3"
        ))
        .db()?;
    let rows = st
        .query_map(
            params![account.as_str(), t.now.as_millis(), MAX_PORTAL_LINKS_LISTED],
            row_to_link,
        )
        .db()?;
    rows.collect::<Result<Vec<_>, _>>()
        .db()?
        .into_iter()
        .map(link_of)
        .collect()
}

fn revoke(t: &mut Tx<'_>, account: &AccountId, id: PortalLinkId) -> StoreResult<()> {
    let n = t
        .execute(
            "UPDATE portal_links SET revoked_at = coalesce(revoked_at, $3) \
             WHERE id = $1 AND account = $2",
            params![id.to_string(), account.as_str(), t.now.as_millis()],
        )
        .db()?;
    if n == 0 {
        return Err(StoreError::not_found("portal link", id));
    }
    Ok(())
}

/// The writer runs one transaction at a time, so the update that marks
/// the link redeemed and the read that follows are one step.
fn redeem(t: &mut Tx<'_>, token_hash: &str) -> StoreResult<Option<PortalLink>> {
    let n = t
        .execute(
            "UPDATE portal_links SET redeemed_at = $2 WHERE token_hash = $1 \
             AND redeemed_at IS NULL AND revoked_at IS NULL AND expires_at > $2",
            params![token_hash, t.now.as_millis()],
        )
        .db()?;
    if n == 0 {
        return Ok(None);
    }
    find(t, token_hash)
}

fn find(t: &Tx<'_>, token_hash: &str) -> StoreResult<Option<PortalLink>> {
    t.query_row(
        &format!(
            "SELECT {COLUMNS} FROM portal_links WHERE token_hash = $1 \
             AND revoked_at IS NULL AND expires_at > $2"
        ),
        params![token_hash, t.now.as_millis()],
        row_to_link,
    )
    .optional()
    .db()?
    .map(link_of)
    .transpose()
}

#[async_trait]
impl PortalStore for EmbeddedStore {
    async fn portal_link_create(&self, req: PortalLinkCreateRequest) -> StoreResult<PortalLink> {
        self.tx(move |t| create(t, &req)).await
    }

    async fn portal_link_list(&self, account: &AccountId) -> StoreResult<Vec<PortalLink>> {
        let account = account.clone();
        self.tx(move |t| list(t, &account)).await
    }

    async fn portal_link_revoke(&self, account: &AccountId, id: PortalLinkId) -> StoreResult<()> {
        let account = account.clone();
        self.tx(move |t| revoke(t, &account, id)).await
    }

    async fn portal_link_redeem(&self, token_hash: &str) -> StoreResult<Option<PortalLink>> {
        let token_hash = token_hash.to_string();
        self.tx(move |t| redeem(t, &token_hash)).await
    }

    async fn portal_link_find(&self, token_hash: &str) -> StoreResult<Option<PortalLink>> {
        let token_hash = token_hash.to_string();
        self.tx(move |t| find(t, &token_hash)).await
    }
}
