//! Admin routes: account keys and dashboard sessions.

use super::{
    caller_for_hash, generate_token, hash_token, id, ok, ok_showing_secret, query, views,
    AccountPath, AdminScope, Answer, ApiError, Caller, Deserialize, IntoParams, IntoResponse,
    ItemPath, KeyCreated, KeyId, Path, SessionList, SessionView, Shared, State, StatusCode,
    TaskView,
};
use control_plane_core::{KeyHash, ERASE_TASK};

use crate::views::ErasureStarted;

/// Creates an account key (admin only); the key is shown this once.
#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/keys",
    tag = "keys",
    params(AccountPath),
    responses((status = 201, description = "The new key", body = KeyCreated)),
)]
pub(crate) async fn key_create(State(s): Shared, AdminScope(account): AdminScope) -> Answer {
    let token = generate_token("cpk_");
    let key = s
        .store
        .account_key_create(&account, &KeyHash::new(hash_token(&token))?)
        .await?;
    ok_showing_secret(
        StatusCode::CREATED,
        KeyCreated {
            id: key.id,
            account: key.account.as_str().to_string(),
            key: token,
            created_at: views::time(key.created_at),
        },
        "key",
    )
}

/// Revokes an account key (admin only).
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/keys/{id}",
    tag = "keys",
    params(ItemPath),
    responses((status = 204, description = "Revoked")),
)]
pub(crate) async fn key_revoke(
    State(s): Shared,
    AdminScope(account): AdminScope,
    Path(p): Path<ItemPath>,
) -> Answer {
    let key: KeyId = id("account key", &p.id)?;
    s.store.account_key_revoke(&account, key).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The live dashboard sessions (admin only; ADR 0021).
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    responses((status = 200, description = "Newest first, at most 1000", body = SessionList)),
)]
pub(crate) async fn session_list(State(s): Shared, caller: Caller) -> Answer {
    caller.admin_only()?;
    let mut items = Vec::new();
    for session in s.store.session_list().await? {
        let signed_in_as = match caller_for_hash(&s, &session.token_hash).await? {
            Some(Caller::Admin) => Some("admin".to_string()),
            Some(Caller::Account(a)) => Some(a.as_str().to_string()),
            None => None,
        };
        items.push(SessionView {
            id: session.id_hash,
            signed_in_as,
            created_at: views::time(session.created_at),
            expires_at: views::time(session.expires_at),
        });
    }
    ok(StatusCode::OK, SessionList { items })
}

/// A session's id in the path.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SessionPath {
    /// The session's `id` as listed.
    #[param(pattern = "^[0-9a-f]{64}$")]
    id: String,
}

/// Ends a dashboard session (admin only): its cookie opens nothing any more.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(SessionPath),
    responses((status = 204, description = "Ended")),
)]
pub(crate) async fn session_revoke(
    State(s): Shared,
    caller: Caller,
    Path(p): Path<SessionPath>,
) -> Answer {
    caller.admin_only()?;
    if s.store.session_get(&p.id).await?.is_none() {
        return Err(ApiError::not_found("session"));
    }
    s.store.session_end(&p.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Erases an account (admin only): its keys are revoked, the dashboard
/// sessions signed in with them ended and its endpoints disabled before the
/// answer; then a workflow task (kind `control-plane.erase`) removes every
/// row of the account in batches of at most 1000 per table, resuming after
/// a crash. The task is the one row it keeps: `GET .../tasks/{id}` shows
/// its progress, and its result once nothing else is left.
#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}",
    tag = "keys",
    params(AccountPath),
    responses((status = 202, description = "Shut at once; the rest goes in the task", body = ErasureStarted)),
)]
pub(crate) async fn account_erase(State(s): Shared, AdminScope(account): AdminScope) -> Answer {
    let begun = s.store.account_erase_begin(&account).await?;
    let task = query::queue_task(&s.store, account, ERASE_TASK, serde_json::json!({})).await?;
    ok(
        StatusCode::ACCEPTED,
        ErasureStarted {
            keys_revoked: begun.keys_revoked,
            sessions_ended: begun.sessions_ended,
            endpoints_disabled: begun.endpoints_disabled,
            task: TaskView::from(&task),
        },
    )
}
