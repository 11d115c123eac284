//! Reading the cookies a request carries, and whether it came over HTTPS
//! (which decides whether a cookie set in the answer is `Secure`).

use axum::http::{header, HeaderMap};

/// The values of the cookies named `name` the request carries, in order.
pub(crate) fn values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |kv| kv.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Whether the browser reached the service over HTTPS: its `Origin`, or a
/// proxy's `X-Forwarded-Proto`, says so.
pub(crate) fn over_https(headers: &HeaderMap) -> bool {
    let https = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https") || v.starts_with("https://"))
    };
    https(header::ORIGIN) || https(header::HeaderName::from_static("x-forwarded-proto"))
}
