//! OAuth2 client credentials (RFC 6749, section 4.4) for an endpoint: the
//! dispatcher fetches an access token from the endpoint's token URL, keeps
//! it until shortly before it expires, and sends it as `Authorization:
//! Bearer` on every request to the endpoint.
//!
//! The settings are kept like custom headers: as one JSON text, sealed at
//! rest with the signing secrets' key, write-only in the API (only the
//! token URL, client id and scope are shown). The token protocol itself
//! (the request and its answer) is the dispatcher's.

use serde::{Deserialize, Serialize};

use crate::{validate_http_url, Secret, StoreError};

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
        validate_http_url(&self.token_url)
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
}
