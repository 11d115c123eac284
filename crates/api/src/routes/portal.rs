//! Portal links (ADR 0049): one-time sign-ins to a consumer view of an
//! account, given by the admin or the account's key to its own customers.

use super::{
    generate_token, hash_token, id, ok, ok_showing_secret, AccountPath, Answer, ApiError,
    Deserialize, IntoResponse, ItemPath, Path, Scope, Shared, State, StatusCode,
};
use axum::Json;
use control_plane_core::{
    EndpointId, PortalLink, PortalLinkCreateRequest, PortalLinkId, PortalRole, StoreError,
    MAX_PORTAL_LINK_LIFETIME,
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::views;

/// Portal links an account may hold at once that are neither revoked nor
/// expired.
pub const MAX_LIVE_PORTAL_LINKS: usize = 100;

/// How long a portal link lasts when its request does not say.
const DEFAULT_LIFETIME_S: u64 = 24 * 3600;

/// A portal link to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PortalLinkBody {
    /// `viewer` (sees endpoints, deliveries, attempts, event types) or
    /// `manager` (also adds, edits, disables and deletes endpoints, rotates
    /// secrets, replays and recovers).
    #[schema(pattern = "^(viewer|manager)$")]
    role: String,
    /// The endpoints the link shows, at most 50; absent or empty: every
    /// endpoint of the account (and a manager may add endpoints).
    #[serde(default)]
    #[schema(value_type = Vec<uuid::Uuid>, max_items = 50)]
    endpoints: Vec<String>,
    /// Seconds until the link, and every session it opened, ends: 1 to
    /// 604800 (7 days), default 86400.
    #[schema(minimum = 1, maximum = 604800)]
    expires_in_s: Option<u64>,
}

/// A portal link, never its token.
#[derive(Serialize, ToSchema)]
pub(crate) struct PortalLinkView {
    #[schema(value_type = uuid::Uuid)]
    id: PortalLinkId,
    account: String,
    /// `viewer` or `manager`.
    role: String,
    /// The endpoints it shows; empty: every endpoint of the account.
    #[schema(value_type = Vec<uuid::Uuid>)]
    endpoints: Vec<EndpointId>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    expires_at: String,
    /// When it was redeemed (it opens nothing more), if it was.
    #[schema(format = DateTime)]
    redeemed_at: Option<String>,
    /// When it was revoked (its sessions ended), if it was.
    #[schema(format = DateTime)]
    revoked_at: Option<String>,
}

impl From<&PortalLink> for PortalLinkView {
    fn from(l: &PortalLink) -> Self {
        PortalLinkView {
            id: l.id,
            account: l.account.as_str().to_string(),
            role: l.role.as_str().to_string(),
            endpoints: l.endpoints.clone(),
            created_at: views::time(l.created_at),
            expires_at: views::time(l.expires_at),
            redeemed_at: l.redeemed_at.map(views::time),
            revoked_at: l.revoked_at.map(views::time),
        }
    }
}

/// A new portal link: the only answer that shows its token.
#[derive(Serialize, ToSchema)]
pub(crate) struct PortalLinkCreated {
    #[serde(flatten)]
    link: PortalLinkView,
    /// The one-time token: the link is `/portal/{token}` on this service's
    /// address. Stored only as its hash, never shown again.
    token: String,
}

/// The account's portal links.
#[derive(Serialize, ToSchema)]
pub(crate) struct PortalLinkList {
    /// Those not yet expired, revoked ones too, newest first.
    items: Vec<PortalLinkView>,
}

/// Creates a portal link: a one-time sign-in to the consumer view of the
/// account (or of some of its endpoints) at `/portal/{token}`, for a
/// viewer or a manager, lasting at most 7 days. The answer shows the token
/// this once.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/portal-links",
    tag = "portal",
    params(AccountPath),
    request_body = PortalLinkBody,
    responses(
        (status = 201, description = "Created", body = PortalLinkCreated),
        (status = 403, description = "The account holds 100 live portal links", body = crate::error::ErrorBody),
    ),
)]
pub(crate) async fn portal_link_create(
    State(s): Shared,
    Scope(account): Scope,
    Json(body): Json<PortalLinkBody>,
) -> Answer {
    let role: PortalRole = body.role.parse()?;
    let life = body.expires_in_s.unwrap_or(DEFAULT_LIFETIME_S);
    if !(1..=MAX_PORTAL_LINK_LIFETIME.as_secs()).contains(&life) {
        return Err(ApiError::invalid(format!(
            "expires_in_s must be 1 to {} (7 days), got {life}",
            MAX_PORTAL_LINK_LIFETIME.as_secs()
        )));
    }
    let mut endpoints = Vec::with_capacity(body.endpoints.len());
    for e in &body.endpoints {
        let id: EndpointId = e
            .parse()
            .map_err(|_| ApiError::invalid(format!("endpoint {e:?} is not an endpoint id")))?;
        match s.store.endpoint_get(&account, id).await {
            Ok(_) => endpoints.push(id),
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::invalid(format!(
                    "endpoint {id} is not one of account {account}'s"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    let token = generate_token("cpp_");
    let req = PortalLinkCreateRequest::new(
        account.clone(),
        hash_token(&token),
        role,
        endpoints,
        std::time::Duration::from_secs(life),
    )?;
    // Counted and written under the account's quota lock.
    let _quota = s.quota_lock(&account).await;
    let now = s.now();
    let live = s
        .store
        .portal_link_list(&account)
        .await?
        .iter()
        .filter(|l| l.live_at(now))
        .count();
    if live >= MAX_LIVE_PORTAL_LINKS {
        return Err(ApiError::forbidden(format!(
            "account {account} holds {live} live portal links, the most it may: \
             revoke some (DELETE .../portal-links/{{id}}) or let them expire"
        )));
    }
    let link = s.store.portal_link_create(req).await?;
    ok_showing_secret(
        StatusCode::CREATED,
        PortalLinkCreated {
            link: PortalLinkView::from(&link),
            token,
        },
        "token",
    )
}

/// The account's portal links that have not expired, revoked ones too,
/// newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/portal-links",
    tag = "portal",
    params(AccountPath),
    responses((status = 200, description = "At most 1000", body = PortalLinkList)),
)]
pub(crate) async fn portal_link_list(State(s): Shared, Scope(account): Scope) -> Answer {
    let items = s
        .store
        .portal_link_list(&account)
        .await?
        .iter()
        .map(PortalLinkView::from)
        .collect();
    ok(StatusCode::OK, PortalLinkList { items })
}

/// Revokes a portal link: it opens nothing more, and every session it
/// opened ends at its next request.
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/portal-links/{id}",
    tag = "portal",
    params(ItemPath),
    responses((status = 204, description = "Revoked")),
)]
pub(crate) async fn portal_link_revoke(
    State(s): Shared,
    Scope(account): Scope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let link: PortalLinkId = id("portal link", &p.id)?;
    s.store.portal_link_revoke(&account, link).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
