//! What a change of an endpoint must respect beyond each field's own
//! check: its write-only credentials (custom headers, OAuth2 credentials, a
//! client certificate) never follow it to another origin unasked, and those
//! it keeps suit its destination.

use crate::{validate_endpoint_url, Endpoint, EndpointUpdateRequest, Secret, StoreError};

impl EndpointUpdateRequest {
    /// On a poll endpoint (ADR 0051), refuses a URL and every setting
    /// that shapes sending; removing one is allowed.
    pub(crate) fn check_poll(&self, e: &Endpoint) -> Result<(), StoreError> {
        if !e.is_poll() {
            return Ok(());
        }
        crate::refuse_on_poll(&[
            ("url (its kind is fixed at creation)", self.url.is_some()),
            (
                "custom headers",
                self.headers.as_ref().is_some_and(|h| !h.is_empty()),
            ),
            ("oauth2", matches!(self.oauth2, Some(Some(_)))),
            ("client_tls", matches!(self.client_tls, Some(Some(_)))),
            ("transform", matches!(self.transform, Some(Some(_)))),
            (
                "ordered mode (reads are in order already)",
                self.ordered == Some(true),
            ),
            (
                "rate_limit_per_s",
                matches!(self.rate_limit_per_s, Some(Some(_))),
            ),
            ("max_in_flight", matches!(self.max_in_flight, Some(Some(_)))),
            ("retry", matches!(self.retry, Some(Some(_)))),
        ])
    }

    /// Checks a new URL and where the credentials go: the write-only
    /// credentials do not follow the endpoint to another origin unasked,
    /// and those it keeps suit its destination (OAuth2 over HTTP, a client
    /// certificate over `https`).
    pub(crate) fn check_destination(&self, e: &Endpoint) -> Result<(), StoreError> {
        if let Some(url) = &self.url {
            validate_endpoint_url(url)?;
            // Write-only credentials never follow the endpoint to another
            // origin unless the change says so: otherwise a caller who may
            // change the URL but was never told them could have them sent
            // to a host of its choosing.
            if origin_of(url) != origin_of(&e.url) {
                let kept = [
                    ("headers", e.headers.is_some() && self.headers.is_none()),
                    ("oauth2", e.oauth2.is_some() && self.oauth2.is_none()),
                    (
                        "client_tls",
                        e.client_tls.is_some() && self.client_tls.is_none(),
                    ),
                ];
                if let Some((field, _)) = kept.iter().find(|(_, kept)| *kept) {
                    return Err(StoreError::InvalidInput(format!(
                        "the url moves the endpoint to another origin: give \"{field}\" again with it \
                         (or remove it: {{}} for headers, null for oauth2 and client_tls); credentials never follow \
                         an endpoint to another host unasked"
                    )));
                }
            }
        }
        let url = self.url.as_deref().unwrap_or(&e.url);
        if self
            .client_tls
            .as_ref()
            .map_or(e.client_tls.is_some(), Option::is_some)
        {
            crate::client_tls::client_tls_needs_https(url)?;
        }
        if self
            .oauth2
            .as_ref()
            .map_or(e.oauth2.is_some(), Option::is_some)
        {
            oauth2_needs_http(url)?;
        }
        Ok(())
    }
}

/// The stored text of an optional credential's change (`Some(None)`
/// removes it), checked by `text`.
pub(crate) fn change_text<T>(
    change: Option<&Option<T>>,
    text: impl Fn(&T) -> Result<Secret, StoreError>,
) -> Result<Option<Option<Secret>>, StoreError> {
    change
        .map(|c| c.as_ref().map(&text).transpose())
        .transpose()
}

/// Where a URL's requests go: scheme, host and port (a broker URL's
/// `url::Url::origin` is opaque, so it is not used). `None` when it does
/// not parse.
pub(crate) fn origin_of(url: &str) -> Option<(String, String, Option<u16>)> {
    let u = url::Url::parse(url).ok()?;
    Some((
        u.scheme().to_string(),
        u.host_str().unwrap_or_default().to_string(),
        u.port_or_known_default(),
    ))
}

/// OAuth2 client credentials get a bearer token for HTTP requests; a broker
/// destination has no use for one, so it is refused rather than ignored.
pub(crate) fn oauth2_needs_http(url: &str) -> Result<(), StoreError> {
    match crate::Destination::parse(url)? {
        crate::Destination::Http { .. } => Ok(()),
        other => Err(StoreError::InvalidInput(format!(
            "oauth2 applies to http(s) endpoints only; this endpoint's destination is {}",
            other.kind()
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{AccountId, EndpointCreateRequest};

    #[test]
    fn a_broker_destination_takes_no_oauth2_and_has_an_origin_of_its_own() {
        use crate::Check;
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let account = AccountId::new("a").unwrap();
        let nats = "nats://127.0.0.1:4222?subject=orders";
        assert!(
            EndpointCreateRequest::new(account.clone(), nats, secret.clone())
                .check()
                .is_ok()
        );
        let mut req = EndpointCreateRequest::new(account, nats, secret);
        req.oauth2 = Some(crate::ClientCredentials {
            token_url: "https://auth.example.com/token".into(),
            client_id: "id".into(),
            client_secret: "s".into(),
            scope: None,
            audience: None,
        });
        let e = req.check().unwrap_err().to_string();
        assert!(e.contains("http(s) endpoints only"), "{e}");
        // Another broker host is another origin, though `url` calls both opaque.
        assert_ne!(
            origin_of("amqp://a/%2f?exchange=&routing_key=k"),
            origin_of("amqp://b/%2f?exchange=&routing_key=k")
        );
        assert_eq!(origin_of("https://a/x"), origin_of("https://a:443/y?z=1"));
    }
}
