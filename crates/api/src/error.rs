//! The one error shape of the API: `{"error": {"code", "message"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use control_plane_core::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// When to try again (`Retry-After`, whole seconds rounded up).
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    /// An error with the code that fits `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code_for(status),
            message: message.into(),
            retry_after: None,
        }
    }

    /// `429 too_many_requests` with `Retry-After: wait`.
    pub fn too_many(message: impl Into<String>, wait: std::time::Duration) -> Self {
        ApiError {
            retry_after: Some(wait),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// `404 not_found`: also what an account gets for anything outside its reach.
    pub fn not_found(what: &str) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, format!("{what} not found"))
    }

    /// `422 invalid_input`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    /// `403 forbidden`: the caller is known but may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }

    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

/// The code of each status the API answers with.
pub fn code_for(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        409 => "conflict",
        413 => "payload_too_large",
        415 => "unsupported_media_type",
        422 => "invalid_input",
        429 => "too_many_requests",
        503 => "unavailable",
        s if s >= 500 => "internal",
        _ => "error",
    }
}

/// The body of every error answer.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The code and message of an error answer.
#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, one per status (`not_found`, `invalid_input`, ...).
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// The error body.
pub fn body(code: &str, message: &str) -> String {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_string(),
            message: message.to_string(),
        },
    };
    serde_json::to_string(&body).unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, body(self.code, &self.message)).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(wait) = self.retry_after {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidInput(m) => ApiError::invalid(m),
            StoreError::NotFound { what, .. } => ApiError::not_found(what),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
            StoreError::OverQuota { .. } => ApiError::forbidden(e.to_string()),
            StoreError::LeaseLost => {
                ApiError::new(StatusCode::CONFLICT, "the lease was lost to another worker")
            }
            // The store's own text (a connection error naming a variable, a
            // constraint name) goes to the log only; the caller gets a fixed
            // message and the id of the log line.
            StoreError::Unavailable(_) | StoreError::Busy(_) => {
                let id = uuid::Uuid::now_v7();
                tracing::warn!(error_id = %id, "store unavailable: {e}");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the store is unavailable; try again shortly (error id {id} in the service log)"),
                )
            }
            other => {
                let id = uuid::Uuid::now_v7();
                tracing::error!(error_id = %id, "store error: {other}");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the store failed (error id {id} in the service log)"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn store_failures_answer_a_fixed_message_with_an_id_never_the_stores_text() {
        let secret = "password authentication failed for user \"cp\" at db.internal:5432";
        for e in [
            StoreError::Unavailable(secret.into()),
            StoreError::Busy(secret.into()),
            StoreError::Backend(secret.into()),
        ] {
            let a = ApiError::from(e);
            assert!(a.status.is_server_error(), "{a:?}");
            assert!(!a.message.contains("db.internal"), "{a:?}");
            assert!(!a.message.contains("password"), "{a:?}");
            assert!(a.message.contains("error id "), "{a:?}");
        }
    }
}
