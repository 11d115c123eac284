//! Standard Webhooks signatures of `id.timestamp.body`: `v1,<base64
//! HMAC-SHA256>` under a secret written `whsec_<base64 key>`, or
//! `v1a,<base64 Ed25519 signature>` under a key written `whsk_<base64 seed>`
//! (formats in [`control_plane_core::SignatureScheme`] and
//! [`control_plane_core::validate_signing_secret`]).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use control_plane_core::{ed25519_verify, Ed25519Key};
use control_plane_core::{Secret, SignatureScheme};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A secret that is not `whsec_` followed by base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSecret;

impl std::fmt::Display for BadSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the signing secret must be whsec_ followed by base64")
    }
}

fn key(secret: &Secret) -> Result<Vec<u8>, BadSecret> {
    let b64 = secret
        .expose()
        .strip_prefix("whsec_")
        .unwrap_or(secret.expose());
    STANDARD.decode(b64).map_err(|_| BadSecret).and_then(|k| {
        if k.is_empty() {
            Err(BadSecret)
        } else {
            Ok(k)
        }
    })
}

/// One `v1,<signature>` (a `whsec_` secret) or `v1a,<signature>` (a
/// `whsk_` key) for `id.timestamp.body`.
///
/// # Errors
/// [`BadSecret`] when the secret does not decode.
pub fn sign(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> Result<String, BadSecret> {
    if SignatureScheme::of(secret.expose()) == SignatureScheme::Ed25519 {
        let key = Ed25519Key::from_secret(secret.expose()).ok_or(BadSecret)?;
        let signature = key.sign(&signed_content(id, timestamp, body));
        return Ok(format!("v1a,{}", STANDARD.encode(signature)));
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(&key(secret)?).map_err(|_| BadSecret)?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// The `webhook-signature` header: one signature per secret, space-separated
/// (several during a rotation).
///
/// # Errors
/// [`BadSecret`] when a secret does not decode.
pub fn signature_header(
    secrets: &[&Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, BadSecret> {
    let sigs = secrets
        .iter()
        .map(|s| sign(s, id, timestamp, body))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(sigs.join(" "))
}

/// Whether `header` holds a valid signature of `id.timestamp.body` under
/// `secret` (what a receiver checks; used by the tests).
pub fn verify(secret: &Secret, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
    let Ok(expected) = sign(secret, id, timestamp, body) else {
        return false;
    };
    header
        .split(' ')
        .any(|s| bool::from(s.as_bytes().ct_eq(expected.as_bytes())))
}

/// What is signed: `id.timestamp.body`.
fn signed_content(id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut content = format!("{id}.{timestamp}.").into_bytes();
    content.extend_from_slice(body);
    content
}

/// Whether `header` holds a valid `v1a` signature of `id.timestamp.body`
/// under the Ed25519 `public_key` (`whpk_`; what a receiver checks).
pub fn verify_v1a(public_key: &str, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
    let content = signed_content(id, timestamp, body);
    header.split(' ').any(|s| {
        s.strip_prefix("v1a,")
            .and_then(|b| STANDARD.decode(b).ok())
            .is_some_and(|sig| ed25519_verify(public_key, &content, &sig))
    })
}

/// A new random secret, `whsec_` + base64 of 24 random bytes.
pub fn generate_secret() -> Secret {
    let bytes: Vec<u8> = (0..3).flat_map(|_| uuid_bytes()).take(24).collect();
    Secret::new(format!("whsec_{}", STANDARD.encode(bytes)))
}

fn uuid_bytes() -> [u8; 16] {
    *control_plane_core::EventId::new().0.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_standard_webhooks_test_vector() {
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let sig = sign(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_signs_with_every_secret_and_either_verifies() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        let h = signature_header(&[&a, &b], "id", 5, b"{}").unwrap();
        assert_eq!(h.split(' ').count(), 2);
        assert!(verify(&a, &h, "id", 5, b"{}"));
        assert!(verify(&b, &h, "id", 5, b"{}"));
        assert!(!verify(&a, &h, "id", 6, b"{}"), "the timestamp is signed");
        assert!(!verify(&generate_secret(), &h, "id", 5, b"{}"));
    }

    /// A `whsk_` key signs `v1a` over the same content as `v1`; the public
    /// key verifies it, beside a `v1` signature of a rotated-out secret.
    #[test]
    fn an_ed25519_key_signs_v1a_that_its_public_key_verifies() {
        let key = Secret::new(control_plane_core::generate_ed25519_secret().unwrap());
        let public = Ed25519Key::from_secret(key.expose()).unwrap().public_key();
        let old = generate_secret();
        let h = signature_header(&[&key, &old], "id", 5, b"{}").unwrap();
        assert!(h.starts_with("v1a,"), "{h}");
        assert!(verify_v1a(&public, &h, "id", 5, b"{}"));
        assert!(verify(&old, &h, "id", 5, b"{}"));
        assert!(
            !verify_v1a(&public, &h, "id", 6, b"{}"),
            "the timestamp is signed"
        );
        assert!(!verify_v1a(&public, &h, "other", 5, b"{}"));
        assert_eq!(
            sign(&Secret::new("whsk_dGVzdA=="), "i", 1, b""),
            Err(BadSecret)
        );
    }

    #[test]
    fn a_secret_that_is_not_base64_is_refused() {
        assert_eq!(sign(&Secret::new("whsec_!!!"), "i", 1, b""), Err(BadSecret));
        assert_eq!(sign(&Secret::new("whsec_"), "i", 1, b""), Err(BadSecret));
    }
}
