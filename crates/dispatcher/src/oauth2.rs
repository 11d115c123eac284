//! Access tokens of endpoints with OAuth2 client credentials
//! (`control_plane_core::oauth2`): fetched through the dispatcher's own
//! HTTP client, so the token URL meets the same destination rules as
//! endpoint URLs; kept per endpoint until shortly before they expire, one
//! fetch at a time per endpoint; forgotten when the endpoint answers `401`.
//! Neither the client secret nor a token is ever logged or recorded: an
//! attempt's error names the token endpoint's status and OAuth2 `error`
//! code only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::{ClientCredentials, EndpointId, Secret};

use crate::http::{Failure, HttpClient};

/// Bytes of a token answer read at most (a JWT with many claims fits).
const TOKEN_ANSWER_BYTES: usize = 16 * 1024;
/// How long a token that gives no `expires_in` is kept.
const UNSTATED_LIFE: Duration = Duration::from_secs(300);
/// A token is kept at most this long, whatever it says.
const LONGEST_LIFE: Duration = Duration::from_secs(24 * 3600);
/// A token is renewed this long before it expires, or a tenth of its life
/// when that is shorter.
const RENEW_BEFORE: Duration = Duration::from_secs(30);

/// How long a failed token request is answered from memory: the
/// deliveries waiting for the same endpoint's token fail with it instead of
/// each asking again.
const FAILURE_HOLD: Duration = Duration::from_secs(5);

/// A token, or why there is none, and what it was fetched with.
struct Held {
    /// The settings' text: changed settings (a new secret) fetch anew.
    settings: String,
    token: Result<String, Failure>,
    until: Instant,
}

type Slot = Arc<tokio::sync::Mutex<Option<Held>>>;

/// The tokens of one dispatcher, by endpoint.
#[derive(Default)]
pub(crate) struct Tokens {
    by_endpoint: Mutex<HashMap<EndpointId, Slot>>,
}

impl Tokens {
    /// The access token for `endpoint`'s requests: the kept one while it is
    /// fresh and the settings are the same, a new one otherwise. Waiting for
    /// another send's fetch and fetching take at most `within` in all, so
    /// that the send after it stays inside its lease.
    ///
    /// # Errors
    /// `Refused` when the token URL may not be sent to; `Failed` when the
    /// token request fails or its answer holds no bearer token (kept for
    /// [`FAILURE_HOLD`]), or `within` runs out.
    pub(crate) async fn bearer(
        &self,
        client: &HttpClient,
        endpoint: EndpointId,
        settings: &Secret,
        within: Duration,
    ) -> Result<String, Failure> {
        tokio::time::timeout(within, self.held_or_fetched(client, endpoint, settings))
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Failed(
                    "oauth2 token request: timed out".to_string(),
                ))
            })
    }

    async fn held_or_fetched(
        &self,
        client: &HttpClient,
        endpoint: EndpointId,
        settings: &Secret,
    ) -> Result<String, Failure> {
        let slot = self.slot(endpoint);
        let mut held = slot.lock().await;
        if let Some(h) = held.as_ref() {
            if h.settings == settings.expose() && Instant::now() < h.until {
                return h.token.clone();
            }
        }
        let creds = ClientCredentials::from_text(settings)
            .map_err(|e| Failure::Failed(format!("oauth2: {e}")))?;
        let fetched_at = Instant::now();
        let (token, until) = match fetch(client, &creds).await {
            Ok(token) => {
                let life = token
                    .expires_in
                    .map_or(UNSTATED_LIFE, Duration::from_secs)
                    .min(LONGEST_LIFE);
                let until = fetched_at + life.saturating_sub(RENEW_BEFORE.min(life / 10));
                (Ok(token.token), until)
            }
            Err(failure) => (Err(failure), Instant::now() + FAILURE_HOLD),
        };
        *held = Some(Held {
            settings: settings.expose().to_string(),
            token: token.clone(),
            until,
        });
        token
    }

    /// Drops `rejected`, the token of `endpoint` its receiver refused, if it
    /// is still the one kept (a newer one, fetched meanwhile, stays).
    pub(crate) async fn forget(&self, endpoint: EndpointId, rejected: &str) {
        let slot = self.slot(endpoint);
        let mut held = slot.lock().await;
        if held
            .as_ref()
            .is_some_and(|h| h.token.as_deref() == Ok(rejected))
        {
            *held = None;
        }
    }

    fn slot(&self, endpoint: EndpointId) -> Slot {
        self.by_endpoint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(endpoint)
            .or_default()
            .clone()
    }
}

/// The form body of the token request.
fn token_request_body(creds: &ClientCredentials) -> String {
    let mut body = String::from("grant_type=client_credentials");
    for (name, value) in [("scope", &creds.scope), ("audience", &creds.audience)] {
        if let Some(v) = value {
            body.push('&');
            body.push_str(name);
            body.push('=');
            body.push_str(&form_encode(v));
        }
    }
    body
}

/// The `Authorization` header of the token request: HTTP basic with the
/// form-encoded id and secret (RFC 6749, section 2.3.1).
fn token_request_authorization(creds: &ClientCredentials) -> String {
    use base64::Engine as _;
    let pair = format!(
        "{}:{}",
        form_encode(&creds.client_id),
        form_encode(&creds.client_secret)
    );
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// A value encoded for `application/x-www-form-urlencoded`.
fn form_encode(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// An access token as the token endpoint answered it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken {
    /// The token sent as `Authorization: Bearer`.
    pub token: String,
    /// Seconds it is valid for, as the server said (`expires_in`), if it did.
    pub expires_in: Option<u64>,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("token", &"<redacted>")
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

impl AccessToken {
    /// Reads a token endpoint's successful answer (RFC 6749, section 5.1).
    ///
    /// # Errors
    /// A message (never quoting the token) when the body is not JSON with
    /// an `access_token`, or its `token_type` is not `Bearer`.
    pub fn from_answer(body: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| "the token answer is not JSON".to_string())?;
        let token = v["access_token"]
            .as_str()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| (0x21..0x7f).contains(&b)))
            .ok_or_else(|| "the token answer has no usable access_token".to_string())?;
        if let Some(kind) = v["token_type"].as_str() {
            if !kind.eq_ignore_ascii_case("bearer") {
                return Err(format!(
                    "the token answer's token_type is {kind:?}, not Bearer"
                ));
            }
        }
        Ok(AccessToken {
            token: token.to_string(),
            expires_in: v["expires_in"].as_u64(),
        })
    }
}

/// The token request (RFC 6749, section 4.4.2) and its answer.
async fn fetch(client: &HttpClient, creds: &ClientCredentials) -> Result<AccessToken, Failure> {
    let headers = [
        (
            "content-type",
            "application/x-www-form-urlencoded".to_string(),
        ),
        ("accept", "application/json".to_string()),
        ("authorization", token_request_authorization(creds)),
    ];
    let body = token_request_body(creds);
    let answer = client
        .post_keeping(
            &creds.token_url,
            &headers,
            body.as_bytes(),
            TOKEN_ANSWER_BYTES,
        )
        .await
        .map_err(|f| match f {
            Failure::Refused(why) => Failure::Refused(format!("oauth2 token URL: {why}")),
            Failure::Failed(why) => Failure::Failed(format!("oauth2 token request: {why}")),
        })?;
    if !(200..300).contains(&answer.status) {
        // RFC 6749, section 5.2: `error` is a code such as invalid_client.
        let code = serde_json::from_slice::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_graphic()));
        return Err(Failure::Failed(match code {
            Some(code) => format!("oauth2 token request: answered {} ({code})", answer.status),
            None => format!("oauth2 token request: answered {}", answer.status),
        }));
    }
    AccessToken::from_answer(&answer.body).map_err(|e| Failure::Failed(format!("oauth2: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn creds() -> ClientCredentials {
        ClientCredentials {
            token_url: "https://auth.example.com/token".into(),
            client_id: "my client".into(),
            client_secret: "s3cr:t&".into(),
            scope: Some("hooks:write read".into()),
            audience: None,
        }
    }

    #[test]
    fn the_token_request_is_form_encoded_with_basic_credentials() {
        let c = creds();
        assert_eq!(
            token_request_body(&c),
            "grant_type=client_credentials&scope=hooks%3Awrite+read"
        );
        // base64("my+client:s3cr%3At%26")
        assert_eq!(
            token_request_authorization(&c),
            "Basic bXkrY2xpZW50OnMzY3IlM0F0JTI2"
        );
    }

    #[test]
    fn a_token_answer_needs_a_bearer_access_token() {
        let t = AccessToken::from_answer(
            br#"{"access_token":"abc","token_type":"bearer","expires_in":3600}"#,
        )
        .unwrap();
        assert_eq!((t.token.as_str(), t.expires_in), ("abc", Some(3600)));
        assert!(!format!("{t:?}").contains("abc"));
        let no_expiry = AccessToken::from_answer(br#"{"access_token":"abc"}"#).unwrap();
        assert_eq!(no_expiry.expires_in, None);
        for bad in [
            &br#"not json"#[..],
            br#"{"token_type":"Bearer"}"#,
            br#"{"access_token":"a b"}"#,
            br#"{"access_token":"abc","token_type":"mac"}"#,
        ] {
            let e = AccessToken::from_answer(bad).unwrap_err();
            assert!(!e.contains("abc"), "{e}");
        }
    }
}
