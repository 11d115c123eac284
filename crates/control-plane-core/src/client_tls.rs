//! A client certificate and key an endpoint presents when the dispatcher
//! connects to it (mutual TLS).
//!
//! The pair is kept like OAuth2 credentials: as one JSON text, sealed at
//! rest with the signing secrets' key, write-only in the API (answers show
//! the certificate's subject, issuer, validity and SHA-256 fingerprint,
//! never the key). It is checked here, once, for every adapter: both parts
//! parse as PEM, the key is the certificate's own, and the endpoint is
//! `https` (ADR 0048).

use std::fmt;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use crate::{Secret, StoreError, Timestamp};

/// The longest certificate text (the end-entity certificate and any
/// intermediates, PEM).
pub const MAX_CLIENT_CERTIFICATE_BYTES: usize = 32 * 1024;
/// The longest private key text (PEM).
pub const MAX_CLIENT_KEY_BYTES: usize = 16 * 1024;
/// Certificates in a chain at most (the end-entity one first).
const MAX_CHAIN: usize = 8;

/// An endpoint's client certificate (PEM: its own first, then any
/// intermediates) and the certificate's private key (PEM: PKCS#8, PKCS#1
/// RSA or SEC1 EC, not encrypted). `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// The certificate chain, PEM.
    pub certificate: String,
    /// The private key, PEM; never shown, logged or sent.
    pub key: String,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("certificate", &self.certificate)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// What may be shown of a client certificate: never the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSummary {
    /// The certificate's subject, e.g. `CN=orders, O=Acme`.
    pub subject: String,
    /// Its issuer.
    pub issuer: String,
    /// From when it is valid.
    pub not_before: Timestamp,
    /// Until when it is valid.
    pub not_after: Timestamp,
    /// SHA-256 of the certificate (DER), lower-case hex.
    pub fingerprint_sha256: String,
}

fn invalid(why: impl fmt::Display) -> StoreError {
    StoreError::InvalidInput(format!("client_tls.{why}"))
}

impl ClientTls {
    /// The certificate chain, end-entity first, as DER.
    ///
    /// # Errors
    /// `InvalidInput` naming `client_tls.certificate`: too long, no
    /// `CERTIFICATE` block, a block that does not decode, more than eight
    /// certificates, or a private key in it.
    pub fn chain(&self) -> Result<Vec<CertificateDer<'static>>, StoreError> {
        let text = &self.certificate;
        if text.len() > MAX_CLIENT_CERTIFICATE_BYTES {
            return Err(invalid(format_args!(
                "certificate must be at most {MAX_CLIENT_CERTIFICATE_BYTES} bytes of PEM, got {}",
                text.len()
            )));
        }
        if text.contains("PRIVATE KEY-----") {
            return Err(invalid(
                "certificate holds a private key: give the key as client_tls.key, the certificate alone here",
            ));
        }
        let chain = CertificateDer::pem_slice_iter(text.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                invalid(format_args!(
                    "certificate is not PEM (\"-----BEGIN CERTIFICATE-----\" ...): {e}"
                ))
            })?;
        if chain.is_empty() {
            return Err(invalid(
                "certificate holds no \"-----BEGIN CERTIFICATE-----\" block",
            ));
        }
        if chain.len() > MAX_CHAIN {
            return Err(invalid(format_args!(
                "certificate may hold at most {MAX_CHAIN} certificates (its own, then intermediates), got {}",
                chain.len()
            )));
        }
        Ok(chain)
    }

    /// The private key as DER.
    ///
    /// # Errors
    /// `InvalidInput` naming `client_tls.key`: too long, encrypted, or not
    /// a PEM private key. The message never holds the key's text.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, StoreError> {
        let text = &self.key;
        if text.len() > MAX_CLIENT_KEY_BYTES {
            return Err(invalid(format_args!(
                "key must be at most {MAX_CLIENT_KEY_BYTES} bytes of PEM, got {}",
                text.len()
            )));
        }
        if text.contains("ENCRYPTED") {
            return Err(invalid(
                "key is encrypted: give it unencrypted (e.g. `openssl pkey -in key.pem`); it is sealed at rest",
            ));
        }
        PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|_| {
            invalid(
                "key is not a PEM private key (\"-----BEGIN PRIVATE KEY-----\", \
                 \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\")",
            )
        })
    }

    /// Checks the pair and says what may be shown of it.
    ///
    /// # Errors
    /// `InvalidInput` naming the field: as [`ClientTls::chain`] and
    /// [`ClientTls::private_key`]; a certificate that is not X.509; a key
    /// of a type TLS cannot sign with (RSA, ECDSA P-256/P-384, Ed25519); a
    /// key that is not the certificate's.
    pub fn validate(&self) -> Result<CertificateSummary, StoreError> {
        let chain = self.chain()?;
        let summary = summarize(&chain[0])?;
        let key = self.private_key()?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|_| {
            invalid(
                "key is of a type TLS cannot sign with here (RSA, ECDSA P-256 or P-384, Ed25519)",
            )
        })?;
        let certified = rustls::sign::CertifiedKey::new(chain, signer);
        match certified.keys_match() {
            Ok(()) => Ok(summary),
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                Err(invalid(format_args!(
                    "key is not the key of the certificate ({}): give the key the certificate was issued for",
                    summary.subject
                )))
            }
            Err(_) => Err(invalid(
                "key cannot be checked against the certificate: give a PKCS#8, PKCS#1 or SEC1 key",
            )),
        }
    }

    /// What may be shown of the certificate (its first, own one).
    ///
    /// # Errors
    /// As [`ClientTls::chain`]; a certificate that is not X.509.
    pub fn summary(&self) -> Result<CertificateSummary, StoreError> {
        summarize(&self.chain()?[0])
    }

    /// The pair as stored (before sealing): checked, as JSON text.
    ///
    /// # Errors
    /// As [`ClientTls::validate`].
    pub fn to_text(&self) -> Result<Secret, StoreError> {
        self.validate()?;
        serde_json::to_string(self)
            .map(Secret::new)
            .map_err(|e| invalid(format_args!("certificate: {e}")))
    }

    /// The pair as stored and opened.
    ///
    /// # Errors
    /// `Backend` when the text is not such a pair (a value still sealed, or
    /// a store changed by hand).
    pub fn from_text(text: &Secret) -> Result<Self, StoreError> {
        serde_json::from_str(text.expose())
            .map_err(|_| StoreError::Backend("a stored client certificate is not readable".into()))
    }
}

fn summarize(der: &CertificateDer<'_>) -> Result<CertificateSummary, StoreError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|_| invalid("certificate is not an X.509 certificate"))?;
    let at =
        |t: x509_parser::time::ASN1Time| Timestamp::from_millis(t.timestamp().saturating_mul(1000));
    let validity = cert.validity();
    Ok(CertificateSummary {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_before: at(validity.not_before),
        not_after: at(validity.not_after),
        fingerprint_sha256: ring::digest::digest(&ring::digest::SHA256, der.as_ref())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    })
}

/// A client certificate is presented in a TLS handshake: only an `https`
/// endpoint has one, so another is refused rather than ignored.
pub(crate) fn client_tls_needs_https(url: &str) -> Result<(), StoreError> {
    if url.starts_with("https://") {
        return Ok(());
    }
    let kind = match crate::Destination::parse(url)? {
        crate::Destination::Http { .. } => "http without TLS".to_string(),
        other => other.kind().to_string(),
    };
    Err(StoreError::InvalidInput(format!(
        "client_tls applies to https:// endpoints only; this endpoint's destination is {kind}"
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CERT: &str = include_str!("../../../testdata/mtls/client.pem");
    const KEY: &str = include_str!("../../../testdata/mtls/client.key");
    const OTHER_KEY: &str = include_str!("../../../testdata/mtls/other.key");

    fn pair(certificate: &str, key: &str) -> ClientTls {
        ClientTls {
            certificate: certificate.into(),
            key: key.into(),
        }
    }

    #[test]
    fn a_pair_is_checked_summarized_and_its_key_never_printed() {
        let good = pair(CERT, KEY);
        let s = good.validate().unwrap();
        assert!(
            s.subject.contains("CN=control-plane mTLS test client"),
            "{s:?}"
        );
        assert!(s.issuer.contains("mTLS test CA"), "{s:?}");
        assert!(s.not_after > s.not_before);
        assert_eq!(s.fingerprint_sha256.len(), 64);
        let text = good.to_text().unwrap();
        assert_eq!(ClientTls::from_text(&text).unwrap(), good);
        assert!(!format!("{good:?}").contains(KEY.lines().nth(1).unwrap()));
        for (bad, says) in [
            (pair("junk", KEY), "no \"-----BEGIN CERTIFICATE-----\""),
            (pair(CERT, "junk"), "client_tls.key is not a PEM private key"),
            (pair(CERT, OTHER_KEY), "not the key of the certificate"),
            (pair(&format!("{CERT}{KEY}"), KEY), "holds a private key"),
            (
                pair(CERT, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"),
                "encrypted",
            ),
            (pair(&CERT.repeat(9), KEY), "at most 8 certificates"),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert!(!e.contains(KEY.lines().nth(1).unwrap()), "{e}");
        }
    }

    #[test]
    fn only_https_endpoints_take_a_client_certificate() {
        assert!(client_tls_needs_https("https://a.example/h").is_ok());
        for url in ["http://a.example/h", "nats://127.0.0.1:4222?subject=s"] {
            let e = client_tls_needs_https(url).unwrap_err().to_string();
            assert!(e.contains("https:// endpoints only"), "{e}");
        }
    }
}
