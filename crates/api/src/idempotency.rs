//! `Idempotency-Key` on every mutating route (`POST`, `PATCH`, `DELETE`), as
//! the IETF Idempotency-Key draft describes, over the port's
//! [`IdempotencyStore`](control_plane_core::IdempotencyStore): the first
//! request with a key runs and its answer is stored; the same request again
//! gets that answer back (with `Idempotent-Replayed: true`); another request
//! with the key is `422`; a repeat while the first still runs is `409`.
//!
//! The layer runs after authentication (ADR 0043): a request without a
//! valid caller, or on a route its caller may not reach, writes no record.
//! Records are scoped by the caller ([`control_plane_core::IdempotencyOwner`]):
//! an account key's go when it is revoked and an account's when it is
//! erased, so a revoked key replays nothing. A record holds no secret (an
//! answer that shows one keeps `null` in its place), an unfinished one
//! holds its key for [`IN_PROGRESS_LEASE`] at most, and an answer too large
//! to keep is still a promise: its replay says so instead of running the
//! request again. Publishing (`POST .../events`) keeps its own rule, which
//! binds a key to the event (README: HTTP API), and the dashboard's forms
//! are not covered.
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use control_plane_core::{
    DynControlPlaneStore, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyToken, StoreError,
    StoreResult, StoredResponse,
};
use sha2::{Digest, Sha256};

use crate::auth::Authenticated;
use crate::error::ApiError;

/// How long a key is remembered after its request completed.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a key is held while its request runs: a request that never
/// finishes (the process crashed) frees its key after this long. A request
/// whose client gave up frees it at once.
pub const IN_PROGRESS_LEASE: Duration = Duration::from_secs(60);
/// The header that marks a replayed answer.
pub const REPLAYED: &str = "idempotent-replayed";
/// The largest answer stored for a replay; a larger one is stored as a
/// marker (its status and a note), so that a repeat never runs again.
const MAX_STORED_BODY: usize = 1024 * 1024;

/// Marks an answer that shows a secret in this top-level field once: its
/// stored copy has `null` there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShowsSecret(pub(crate) &'static str);

/// The fingerprint of a request: its method, path and query, and body.
pub fn request_hash(method: &Method, path_and_query: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(method.as_str().as_bytes());
    h.update(b" ");
    h.update(path_and_query.as_bytes());
    h.update(b"\n");
    h.update(body);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `Idempotency-Key` header, when sent: 1 to 255 visible ASCII
/// characters (`400` otherwise), for this layer and for publishing alike.
pub(crate) fn header_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    headers
        .get("idempotency-key")
        .map(|v| {
            let key = v.to_str().map_err(|_| {
                ApiError::bad_request("Idempotency-Key must be 1 to 255 visible ASCII characters")
            })?;
            // Core's one rule of keys; a bad header is the request's fault (400).
            control_plane_core::validate_idempotency_key(key)
                .map_err(|e| ApiError::bad_request(format!("Idempotency-Key: {e}")))?;
            Ok(key.to_string())
        })
        .transpose()
}

/// Whether a request with a key goes through this layer.
pub(crate) fn covered(method: &Method, path: &str) -> bool {
    let mutating = matches!(*method, Method::POST | Method::PATCH | Method::DELETE);
    let publish = *method == Method::POST && path.starts_with("/v1/") && path.ends_with("/events");
    mutating && !publish && path.starts_with("/v1/")
}

/// The `{account}` of a path under `/v1/accounts/`, if any.
fn path_account(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/accounts/")
        .and_then(|rest| rest.split('/').next())
        .filter(|a| !a.is_empty())
}

/// Whether an answer is kept for replays: not a server error (the request
/// may succeed when tried again), not an authentication failure or a rate
/// limit (they say nothing about the request).
fn kept(status: StatusCode) -> bool {
    !status.is_server_error()
        && !matches!(
            status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
        )
}

/// The middleware; `state` is the store and the largest request body read.
pub(crate) async fn idempotent_writes(
    State((store, body_limit)): State<(DynControlPlaneStore, usize)>,
    req: Request,
    next: Next,
) -> Response {
    if !covered(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let key = match header_key(req.headers()) {
        Ok(Some(k)) => k,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    // Only a caller that `auth::authenticate` found, on a route it may
    // reach, gets a record; anything else is answered by its route
    // (`401`, `404`) without one.
    let Some(scope) = req
        .extensions()
        .get::<Authenticated>()
        .and_then(|who| who.idempotency_scope(path_account(req.uri().path())))
    else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    // The body was read (and bounded) by `server::read_body_within`.
    let Ok(bytes) = axum::body::to_bytes(body, body_limit).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {body_limit} bytes"),
        )
        .into_response();
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let hash = request_hash(&parts.method, path, &bytes);
    let begun = match IdempotencyBeginRequest::new(scope, key, hash, KEY_TTL) {
        Ok(b) => begin(&store, b.with_lease(IN_PROGRESS_LEASE)).await,
        Err(e) => Err(e),
    };
    let token = match begun {
        Ok(IdempotencyBegin::Started(token)) => token,
        Ok(IdempotencyBegin::Replay(stored)) => return replay(stored),
        Ok(IdempotencyBegin::InProgress) => {
            return ApiError::new(
                StatusCode::CONFLICT,
                "a request with this Idempotency-Key is still being processed; try again later",
            )
            .into_response()
        }
        Ok(IdempotencyBegin::Mismatch) => {
            return ApiError::invalid(
                "this Idempotency-Key was used for another request (method, path or body); \
                 use a new key",
            )
            .into_response()
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let held = Held::new(store.clone(), token);
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    held.keep_or_free(response).await
}

/// Takes the key in a task of its own: a request dropped while the store
/// takes it (its client went away) does not leave it taken, as the task
/// frees a key nobody is left to use.
async fn begin(
    store: &DynControlPlaneStore,
    req: IdempotencyBeginRequest,
) -> StoreResult<IdempotencyBegin> {
    let (answer, asked) = tokio::sync::oneshot::channel();
    let store = store.clone();
    tokio::spawn(async move {
        let begun = store.idempotency_begin(&req).await;
        if let Err(Ok(IdempotencyBegin::Started(token))) = answer.send(begun) {
            free(&store, &token).await;
        }
    });
    asked.await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(
            "the idempotency record could not be taken".into(),
        ))
    })
}

/// A key this layer holds while its request runs. Dropped before it is
/// kept or freed (the client went away and the server dropped the
/// request), it frees the key in the background, so a retry runs at once
/// instead of answering `409` until the lease passes.
struct Held {
    store: DynControlPlaneStore,
    token: Option<IdempotencyToken>,
}

impl Held {
    fn new(store: DynControlPlaneStore, token: IdempotencyToken) -> Self {
        Held {
            store,
            token: Some(token),
        }
    }

    /// Stores what a replay of `response` answers, or frees the key when
    /// the answer is not one to replay; gives the answer back either way.
    async fn keep_or_free(mut self, response: Response) -> Response {
        // Held until the record is kept or freed: dropped before, the
        // guard frees it.
        let Some(token) = self.token.clone() else {
            return response;
        };
        let answer = self.settle(&token, response).await;
        self.token = None;
        answer
    }

    /// [`Held::keep_or_free`]'s work.
    async fn settle(&self, token: &IdempotencyToken, response: Response) -> Response {
        let status = response.status();
        let shows_secret = response.extensions().get::<ShowsSecret>().copied();
        let (parts, body) = response.into_parts();
        // The handler's own answer, already in memory: read it whole.
        let body = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => b,
            Err(_) => {
                free(&self.store, token).await;
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the answer could not be read",
                )
                .into_response();
            }
        };
        if !kept(status) {
            // Not kept: the key is freed, so the request may be tried again.
            free(&self.store, token).await;
            return Response::from_parts(parts, Body::from(body));
        }
        let stored = StoredResponse {
            status: status.as_u16(),
            body: stored_body(&body, shows_secret),
        };
        if let Err(e) = self.store.idempotency_complete(token, stored).await {
            // The answer stands; a repeat may run the request again once the
            // key is free, as if no key had been sent.
            tracing::warn!("idempotency: cannot store an answer: {e}");
        }
        Response::from_parts(parts, Body::from(body))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let store = self.store.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { free(&store, &token).await });
        }
    }
}

/// Frees the key `token` holds.
async fn free(store: &DynControlPlaneStore, token: &IdempotencyToken) {
    if let Err(e) = store.idempotency_abandon(token).await {
        tracing::warn!("idempotency: cannot free a key: {e}");
    }
}

/// What a replay of the answer `body` sends: the answer itself, with
/// `null` for a secret it shows, or a note in its place when it is over
/// [`MAX_STORED_BODY`] (the request is not run again either way).
fn stored_body(body: &[u8], shows_secret: Option<ShowsSecret>) -> String {
    if let Some(ShowsSecret(field)) = shows_secret {
        if let Ok(serde_json::Value::Object(mut answer)) =
            serde_json::from_slice::<serde_json::Value>(body)
        {
            answer.insert(field.to_string(), serde_json::Value::Null);
            return serde_json::Value::Object(answer).to_string();
        }
        // Not the object the route writes: keep nothing of it.
        return serde_json::json!({ field: null }).to_string();
    }
    if body.len() > MAX_STORED_BODY {
        return serde_json::json!({
            "replayed": false,
            "message": format!(
                "the request was done; its answer ({} bytes) was over the {MAX_STORED_BODY} \
                 bytes kept for replays, so read what it made from the API",
                body.len()
            ),
        })
        .to_string();
    }
    String::from_utf8_lossy(body).into_owned()
}

/// The stored answer, marked as a replay.
fn replay(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut r = (status, stored.body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(REPLAYED, HeaderValue::from_static("true"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_and_reads_are_left_to_their_routes() {
        assert!(covered(&Method::POST, "/v1/accounts/a/endpoints"));
        assert!(covered(&Method::DELETE, "/v1/accounts/a/endpoints/x"));
        assert!(covered(&Method::PATCH, "/v1/accounts/a/endpoints/x"));
        assert!(covered(&Method::POST, "/v1/accounts/a/events/batch"));
        assert!(!covered(&Method::POST, "/v1/accounts/a/events"));
        assert!(!covered(&Method::GET, "/v1/accounts/a/endpoints"));
        assert!(!covered(&Method::POST, "/ui/login"));
    }

    #[test]
    fn the_fingerprint_covers_method_path_and_body() {
        let h = |m: Method, p: &str, b: &[u8]| request_hash(&m, p, b);
        let base = h(Method::POST, "/v1/x", b"{}");
        assert_eq!(base, h(Method::POST, "/v1/x", b"{}"));
        assert_ne!(base, h(Method::PATCH, "/v1/x", b"{}"));
        assert_ne!(base, h(Method::POST, "/v1/y", b"{}"));
        assert_ne!(base, h(Method::POST, "/v1/x", b"{ }"));
    }

    #[test]
    fn a_stored_answer_keeps_no_secret_and_a_large_one_is_a_marker() {
        let answer = br#"{"id":"e1","secret":"whsec_abc","url":"https://x"}"#;
        let kept = stored_body(answer, Some(ShowsSecret("secret")));
        assert!(!kept.contains("whsec_"), "{kept}");
        let v: serde_json::Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(v["id"], "e1");
        assert!(v["secret"].is_null());
        assert_eq!(stored_body(b"{\"a\":1}", None), "{\"a\":1}");
        let large = vec![b' '; MAX_STORED_BODY + 1];
        let marker = stored_body(&large, None);
        assert!(
            marker.len() < 1000 && marker.contains("was over"),
            "{marker}"
        );
    }

    /// An answer over the 1 MiB kept for replays is still a promise: the
    /// repeat replays a note with the same status and runs nothing again.
    #[tokio::test]
    async fn an_answer_too_large_to_keep_is_not_run_twice() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use tower::ServiceExt;

        let dir = tempfile::tempdir().unwrap();
        let store: DynControlPlaneStore = Arc::new(
            store_embedded::EmbeddedStore::open(
                store_embedded::EmbeddedConfig::new(dir.path().join("i.duckdb")),
                Arc::new(control_plane_core::SystemClock),
            )
            .await
            .unwrap(),
        );
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let runs = runs.clone();
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "x".repeat(2 * MAX_STORED_BODY))
            }
        };
        let app = axum::Router::new()
            .route("/v1/accounts/a/things", axum::routing::post(handler))
            .layer(axum::middleware::from_fn_with_state(
                (store, 1024),
                idempotent_writes,
            ))
            .layer(axum::middleware::from_fn(
                |mut req: Request, next: Next| async move {
                    req.extensions_mut().insert(Authenticated {
                        caller: crate::Caller::Admin,
                        key: None,
                    });
                    next.run(req).await
                },
            ));
        let send = || {
            let req = Request::builder()
                .method("POST")
                .uri("/v1/accounts/a/things")
                .header("idempotency-key", "large")
                .body(Body::empty())
                .unwrap();
            app.clone().oneshot(req)
        };
        let first = send().await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let body = axum::body::to_bytes(first.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body.len(), 2 * MAX_STORED_BODY, "the whole answer, once");
        let again = send().await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert_eq!(again.headers().get(REPLAYED).unwrap(), "true");
        let note = axum::body::to_bytes(again.into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&note).contains("was over"));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the request ran once");
    }

    #[test]
    fn only_a_caller_on_a_route_it_reaches_gets_a_scope() {
        let a = control_plane_core::AccountId::new("a").unwrap();
        let key = control_plane_core::KeyId::new();
        let tenant = Authenticated {
            caller: crate::Caller::Account(a.clone()),
            key: Some(key),
        };
        assert_eq!(
            tenant.idempotency_scope(path_account("/v1/accounts/a/endpoints")),
            Some(format!("account:a:key:{key}"))
        );
        assert_eq!(
            tenant.idempotency_scope(path_account("/v1/accounts/b/endpoints")),
            None
        );
        assert_eq!(tenant.idempotency_scope(path_account("/v1/accounts")), None);
        let admin = Authenticated {
            caller: crate::Caller::Admin,
            key: None,
        };
        assert_eq!(
            admin.idempotency_scope(path_account("/v1/accounts/b/keys")),
            Some("account:b:admin".to_string())
        );
        assert_eq!(
            admin.idempotency_scope(path_account("/v1/accounts")),
            Some("admin".to_string())
        );
        assert_eq!(admin.idempotency_scope(Some("bad name")), None);
    }
}
