//! OAuth2 client credentials (RFC 6749, section 4.4) for an endpoint: the
//! dispatcher fetches an access token from the endpoint's token URL, keeps
//! it until shortly before it expires, and sends it as `Authorization:
//! Bearer` on every request to the endpoint.
//!
//! The settings are kept like custom headers: as one JSON text, sealed at
//! rest with the signing secrets' key, write-only in the API (only the
//! token URL, client id and scope are shown).

use serde::{Deserialize, Serialize};

use crate::{validate_endpoint_url, Secret, StoreError};

/// The longest client id, scope or audience.
const MAX_FIELD_BYTES: usize = 1024;

/// How an endpoint's requests get their access token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCredentials {
    /// The authorization server's token endpoint (`http` or `https`); the
    /// same destination rules as the endpoint's URL apply to it.
    pub token_url: String,
    /// The client id, sent with the secret as HTTP basic authentication.
    pub client_id: String,
    /// The client secret; never shown, logged or sent anywhere but the token URL.
    pub client_secret: String,
    /// The `scope` asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The `audience` asked for, if any (an extension some servers need).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .field("scope", &self.scope)
            .field("audience", &self.audience)
            .finish()
    }
}

impl ClientCredentials {
    /// Checks every field.
    ///
    /// # Errors
    /// `InvalidInput` naming the field: a token URL that is not absolute
    /// `http(s)`; a client id, secret, scope or audience that is empty,
    /// longer than 1024 bytes, or not visible ASCII and spaces.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_endpoint_url(&self.token_url)
            .map_err(|e| StoreError::InvalidInput(format!("oauth2.token_url: {e}")))?;
        let with_credentials = url::Url::parse(&self.token_url)
            .map(|u| !u.username().is_empty() || u.password().is_some())
            .unwrap_or(false);
        if with_credentials {
            return Err(StoreError::InvalidInput(
                "oauth2.token_url must not hold a user or password: the client id and secret \
                 authenticate the token request"
                    .into(),
            ));
        }
        let fields = [
            ("client_id", Some(&self.client_id)),
            ("client_secret", Some(&self.client_secret)),
            ("scope", self.scope.as_ref()),
            ("audience", self.audience.as_ref()),
        ];
        for (name, value) in fields {
            let Some(v) = value else { continue };
            let visible = v.bytes().all(|b| (0x20..0x7f).contains(&b));
            if v.is_empty() || v.len() > MAX_FIELD_BYTES || !visible {
                return Err(StoreError::InvalidInput(format!(
                    "oauth2.{name} must be 1 to {MAX_FIELD_BYTES} bytes of visible ASCII and spaces"
                )));
            }
        }
        Ok(())
    }

    /// The settings as stored (before sealing): checked, as JSON text.
    ///
    /// # Errors
    /// As [`ClientCredentials::validate`].
    pub fn to_text(&self) -> Result<Secret, StoreError> {
        self.validate()?;
        serde_json::to_string(self)
            .map(Secret::new)
            .map_err(|e| StoreError::InvalidInput(format!("oauth2: {e}")))
    }

    /// The settings as stored and opened.
    ///
    /// # Errors
    /// `Backend` when the text is not such settings (a value still sealed,
    /// or a store changed by hand).
    pub fn from_text(text: &Secret) -> Result<Self, StoreError> {
        serde_json::from_str(text.expose())
            .map_err(|_| StoreError::Backend("stored oauth2 settings are not readable".into()))
    }

    /// The form body of the token request.
    pub fn token_request_body(&self) -> String {
        let mut body = String::from("grant_type=client_credentials");
        for (name, value) in [("scope", &self.scope), ("audience", &self.audience)] {
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
    pub fn token_request_authorization(&self) -> String {
        use base64::Engine as _;
        let pair = format!(
            "{}:{}",
            form_encode(&self.client_id),
            form_encode(&self.client_secret)
        );
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// A value encoded for `application/x-www-form-urlencoded`.
fn form_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
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
    fn settings_are_checked_and_never_printed() {
        creds().validate().unwrap();
        let text = creds().to_text().unwrap();
        assert_eq!(ClientCredentials::from_text(&text).unwrap(), creds());
        assert!(!format!("{:?}", creds()).contains("s3cr"));
        for (bad, field) in [
            (
                ClientCredentials {
                    token_url: "ftp://x/t".into(),
                    ..creds()
                },
                "token_url",
            ),
            (
                ClientCredentials {
                    token_url: "https://u:p@auth.example.com/t".into(),
                    ..creds()
                },
                "token_url",
            ),
            (
                ClientCredentials {
                    client_id: String::new(),
                    ..creds()
                },
                "client_id",
            ),
            (
                ClientCredentials {
                    client_secret: "a\nb".into(),
                    ..creds()
                },
                "client_secret",
            ),
            (
                ClientCredentials {
                    scope: Some("x".repeat(2000)),
                    ..creds()
                },
                "scope",
            ),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("oauth2.{field}")), "{e}");
        }
        assert!(ClientCredentials::from_text(&Secret::new("{\"x\":1}")).is_err());
    }

    #[test]
    fn the_token_request_is_form_encoded_with_basic_credentials() {
        let c = creds();
        assert_eq!(
            c.token_request_body(),
            "grant_type=client_credentials&scope=hooks%3Awrite+read"
        );
        // base64("my+client:s3cr%3At%26")
        assert_eq!(
            c.token_request_authorization(),
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
