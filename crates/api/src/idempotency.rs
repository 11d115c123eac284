//! `Idempotency-Key` on every mutating route (`POST`, `PATCH`, `DELETE`), as
//! the IETF Idempotency-Key draft describes, over the port's
//! [`IdempotencyStore`](control_plane_core::IdempotencyStore): the first
//! request with a key runs and its answer is stored; the same request again
//! gets that answer back (with `Idempotent-Replayed: true`); another request
//! with the key is `422`; a repeat while the first still runs is `409`.
//!
//! Keys are scoped by the caller's credentials (a hash of its
//! `Authorization` header), so two callers never share one. Publishing
//! (`POST .../events`) keeps its own rule, which binds a key to the event
//! (README: HTTP API), and the dashboard's forms are not covered.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use control_plane_core::{
    DynControlPlaneStore, IdempotencyBegin, IdempotencyBeginRequest, IdempotencyToken,
    StoredResponse,
};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// How long a key is remembered after its first request.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 3600);
/// The header that marks a replayed answer.
pub const REPLAYED: &str = "idempotent-replayed";
/// The largest answer stored for a replay; a larger one is sent once and
/// its key freed.
const MAX_STORED_BODY: usize = 1024 * 1024;

/// The scope of the keys of a caller with this `Authorization` value.
pub fn scope_of(authorization: &str) -> String {
    format!("http:{}", hex(&Sha256::digest(authorization.as_bytes())))
}

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
    let Some(auth) = req.headers().get(header::AUTHORIZATION).cloned() else {
        return next.run(req).await;
    };
    if !covered(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let key = match header_key(req.headers()) {
        Ok(Some(k)) => k,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    let (parts, body) = req.into_parts();
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
    let scope = scope_of(auth.to_str().unwrap_or_default());
    let hash = request_hash(&parts.method, path, &bytes);
    let begun = match IdempotencyBeginRequest::new(scope, key, hash, KEY_TTL) {
        Ok(b) => store.idempotency_begin(&b).await,
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
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    keep_or_free(&store, &token, response).await
}

/// Stores `response` under the key `token` holds, or frees the key when
/// the answer is not one to replay; gives the answer back either way.
async fn keep_or_free(
    store: &DynControlPlaneStore,
    token: &IdempotencyToken,
    response: Response,
) -> Response {
    let status = response.status();
    let (parts, body) = response.into_parts();
    let body = match axum::body::to_bytes(body, MAX_STORED_BODY).await {
        Ok(b) if kept(status) => b,
        other => {
            // Not kept: the key is freed, so the request may be tried again.
            if let Err(e) = store.idempotency_abandon(token).await {
                tracing::warn!("idempotency: cannot free a key: {e}");
            }
            return match other {
                Ok(b) => Response::from_parts(parts, Body::from(b)),
                Err(_) => ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the answer could not be read",
                )
                .into_response(),
            };
        }
    };
    let stored = StoredResponse {
        status: status.as_u16(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    if let Err(e) = store.idempotency_complete(token, stored).await {
        // The answer stands; a repeat may run the request again once the
        // key expires, as if no key had been sent.
        tracing::warn!("idempotency: cannot store an answer: {e}");
    }
    Response::from_parts(parts, Body::from(body))
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
        assert_ne!(scope_of("Bearer a"), scope_of("Bearer b"));
    }
}
