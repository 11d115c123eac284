//! The formats of signing secrets (Standard Webhooks), read once here for
//! the API, the dispatcher and the dashboard: `whsec_` and the base64 of a
//! key signs `v1` (HMAC-SHA256); `whsk_` and the base64 of a 32-byte
//! Ed25519 seed signs `v1a`, whose public key is written `whpk_` and the
//! base64 of its 32 bytes. The Ed25519 operations (ring's) are here too, so
//! that the API shows the public key the dispatcher signs for.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// The prefix of a symmetric (HMAC-SHA256, `v1`) signing secret.
pub const HMAC_PREFIX: &str = "whsec_";
/// The prefix of an Ed25519 (`v1a`) signing key.
pub const ED25519_PREFIX: &str = "whsk_";
/// The prefix of an Ed25519 public key, as receivers are given it.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

named_enum! {
    /// How an endpoint's requests are signed, chosen when it is created.
    pub enum SignatureScheme ("signature scheme") {
        /// `v1`: HMAC-SHA256 under a shared `whsec_` secret.
        Hmac = "hmac",
        /// `v1a`: Ed25519 under a `whsk_` key; receivers hold the `whpk_` public key.
        Ed25519 = "ed25519",
    }
}

impl SignatureScheme {
    /// The prefix of its secrets: `whsec_` or `whsk_`.
    pub fn prefix(self) -> &'static str {
        match self {
            SignatureScheme::Hmac => HMAC_PREFIX,
            SignatureScheme::Ed25519 => ED25519_PREFIX,
        }
    }

    /// The scheme a stored or given secret signs with, by its prefix.
    pub fn of(secret: &str) -> SignatureScheme {
        if secret.starts_with(ED25519_PREFIX) {
            SignatureScheme::Ed25519
        } else {
            SignatureScheme::Hmac
        }
    }
}

/// Checks a signing secret as the port stores it, and says its scheme:
/// `whsec_` and the base64 of 24 to 64 bytes (`hmac`), or `whsk_` and the
/// base64 of a 32-byte Ed25519 seed (`ed25519`). The one rule of secrets:
/// the API answers with its message, and every adapter meets it through
/// [`crate::EndpointCreateRequest`]'s check and [`check_rotation`].
///
/// # Errors
/// `InvalidInput` saying what a secret of its scheme must be.
pub fn validate_signing_secret(secret: &str) -> Result<SignatureScheme, crate::StoreError> {
    let scheme = SignatureScheme::of(secret);
    let valid = match scheme {
        SignatureScheme::Hmac => secret
            .strip_prefix(HMAC_PREFIX)
            .and_then(|b| STANDARD.decode(b).ok())
            .is_some_and(|k| (24..=64).contains(&k.len())),
        SignatureScheme::Ed25519 => ed25519_seed(secret).is_some(),
    };
    if valid {
        return Ok(scheme);
    }
    Err(crate::StoreError::InvalidInput(match scheme {
        SignatureScheme::Hmac => {
            "secret must be \"whsec_\" followed by the base64 of 24 to 64 random bytes \
             (or \"whsk_\" and a 32-byte Ed25519 seed)"
                .into()
        }
        SignatureScheme::Ed25519 => {
            "secret must be \"whsk_\" followed by the base64 of a 32-byte Ed25519 seed".into()
        }
    }))
}

/// Checks the secret an endpoint rotates to: valid, and of the scheme of
/// the secret it replaces (an endpoint keeps its scheme for life).
///
/// # Errors
/// `InvalidInput` for a bad secret or another scheme.
pub fn check_rotation(
    current: &crate::Secret,
    next: &crate::Secret,
) -> Result<(), crate::StoreError> {
    let (was, is) = (
        SignatureScheme::of(current.expose()),
        validate_signing_secret(next.expose())?,
    );
    if was != is {
        return Err(crate::StoreError::InvalidInput(format!(
            "the endpoint signs with {}: rotate to a {} secret",
            was.as_str(),
            was.prefix()
        )));
    }
    Ok(())
}

/// The Ed25519 seed of a `whsk_` key: `None` unless it is `whsk_` and the
/// base64 of exactly 32 bytes.
pub fn ed25519_seed(secret: &str) -> Option<[u8; 32]> {
    let bytes = STANDARD.decode(secret.strip_prefix(ED25519_PREFIX)?).ok()?;
    bytes.try_into().ok()
}

/// An Ed25519 signing key read from its `whsk_` text.
pub struct Ed25519Key(ring::signature::Ed25519KeyPair);

impl Ed25519Key {
    /// The key of a `whsk_` secret; `None` when it is not one.
    pub fn from_secret(secret: &str) -> Option<Ed25519Key> {
        let seed = ed25519_seed(secret)?;
        ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
            .ok()
            .map(Ed25519Key)
    }

    /// Its public key, `whpk_` and base64.
    pub fn public_key(&self) -> String {
        use ring::signature::KeyPair;
        public_key_text(self.0.public_key().as_ref())
    }

    /// The signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.0.sign(message).as_ref().to_vec()
    }
}

/// A new `whsk_` key from the system's random source.
///
/// # Errors
/// `Unavailable` when the system gives no random bytes.
pub fn generate_ed25519_secret() -> Result<String, crate::StoreError> {
    use ring::rand::SecureRandom;
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| crate::StoreError::Unavailable("no random bytes for a signing key".into()))?;
    Ok(ed25519_secret(&seed))
}

/// Whether `signature` is `public_key`'s (`whpk_` text) of `message`.
pub fn ed25519_verify(public_key: &str, message: &[u8], signature: &[u8]) -> bool {
    let Some(key) = public_key
        .strip_prefix(PUBLIC_KEY_PREFIX)
        .and_then(|b| STANDARD.decode(b).ok())
    else {
        return false;
    };
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(message, signature)
        .is_ok()
}

/// `whsk_` and the base64 of `seed`.
pub fn ed25519_secret(seed: &[u8; 32]) -> String {
    format!("{ED25519_PREFIX}{}", STANDARD.encode(seed))
}

/// `whpk_` and the base64 of a 32-byte public key.
pub fn public_key_text(key: &[u8]) -> String {
    format!("{PUBLIC_KEY_PREFIX}{}", STANDARD.encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_names_its_scheme_and_a_seed_is_32_bytes() {
        let seed = [7u8; 32];
        let text = ed25519_secret(&seed);
        assert!(text.starts_with("whsk_"));
        assert_eq!(SignatureScheme::of(&text), SignatureScheme::Ed25519);
        assert_eq!(ed25519_seed(&text), Some(seed));
        assert_eq!(SignatureScheme::of("whsec_dGVzdA=="), SignatureScheme::Hmac);
        assert_eq!(ed25519_seed("whsk_dGVzdA=="), None, "too short");
        assert_eq!(ed25519_seed("whsec_AAAA"), None);
        assert_eq!(ed25519_seed("whsk_!!"), None);
        assert_eq!(public_key_text(&[0u8; 32]).len(), 5 + 44);
        assert_eq!(
            "ed25519".parse::<SignatureScheme>(),
            Ok(SignatureScheme::Ed25519)
        );
    }

    #[test]
    fn secrets_are_checked_once_for_every_caller() {
        let hmac = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        assert_eq!(
            validate_signing_secret(hmac).unwrap(),
            SignatureScheme::Hmac
        );
        let key = ed25519_secret(&[1; 32]);
        assert_eq!(
            validate_signing_secret(&key).unwrap(),
            SignatureScheme::Ed25519
        );
        for bad in [
            "",
            "whsec_",
            "whsec_dGVzdA==",
            "whsec_!!",
            "whsk_dGVzdA==",
            "secret",
        ] {
            assert!(validate_signing_secret(bad).is_err(), "{bad:?}");
        }
        let (h, k) = (crate::Secret::new(hmac), crate::Secret::new(key));
        assert!(check_rotation(&h, &h).is_ok());
        assert!(check_rotation(&k, &k).is_ok());
        assert!(check_rotation(&h, &k).is_err(), "the scheme stays");
        assert!(check_rotation(&k, &h).is_err());
        assert!(check_rotation(&h, &crate::Secret::new("whsec_eA==")).is_err());
    }

    /// RFC 8032's first test vector: the seed gives its public key and its
    /// signature of the empty message, which verifies, and nothing else does.
    #[test]
    fn ed25519_keys_follow_rfc_8032() {
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let seed: [u8; 32] =
            hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
                .try_into()
                .unwrap();
        let key = Ed25519Key::from_secret(&ed25519_secret(&seed)).unwrap();
        let public = hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
        assert_eq!(key.public_key(), public_key_text(&public));
        let sig = key.sign(b"");
        assert_eq!(
            sig,
            hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")
        );
        assert!(ed25519_verify(&key.public_key(), b"", &sig));
        assert!(!ed25519_verify(&key.public_key(), b"x", &sig));
        assert!(!ed25519_verify("whpk_AAAA", b"", &sig));
        let fresh = generate_ed25519_secret().unwrap();
        assert!(Ed25519Key::from_secret(&fresh).is_some());
        assert_ne!(fresh, generate_ed25519_secret().unwrap());
    }
}
