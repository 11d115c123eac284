//! Endpoint credentials encrypted at rest (ADR 0022).
//!
//! A stored credential is either sealed, `sealed1:<key id>:<base64 of nonce
//! and ciphertext>` (XChaCha20-Poly1305 under a 32-byte key, the owner's id
//! as associated data, so a sealed value copied onto another row does not
//! open), or plain text written before keys existed. Adapters seal on every
//! write and open on every read through [`SecretKeys`]; they never see a key.

use std::fmt;

use base64::Engine;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

use control_plane_core::{
    ClaimedDelivery, Endpoint, Secret, SigningSecrets, StoreError, StoreResult,
};

/// The prefix of every sealed value; the format's version is part of it.
pub const SEALED_PREFIX: &str = "sealed1:";

const NONCE_BYTES: usize = 24;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Which of an endpoint's credentials a value is: part of its associated
/// data, so the two cannot be swapped unnoticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The secret that signs.
    Current,
    /// The previous secret, during a rotation's grace.
    Previous,
    /// The custom headers (their JSON object, sealed as one value).
    Headers,
    /// The OAuth2 client credentials (their JSON object, sealed as one value).
    OAuth2,
    /// The client certificate and its private key (their JSON object,
    /// sealed as one value).
    ClientTls,
}

fn aad(owner: &[u8], slot: Slot) -> Vec<u8> {
    let name: &[u8] = match slot {
        Slot::Current => b"secret",
        Slot::Previous => b"previous_secret",
        Slot::Headers => b"headers",
        Slot::OAuth2 => b"oauth2",
        Slot::ClientTls => b"client_tls",
    };
    [owner, b":", name].concat()
}

/// One 32-byte key and its id (the first four bytes of its SHA-256, in hex):
/// the id is stored beside every value the key sealed, so a store knows
/// which key it needs without holding it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey {
    id: String,
    bytes: [u8; 32],
}

impl SecretKey {
    /// A new random key.
    pub fn generate() -> Self {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(&key);
        Self::from_bytes(bytes)
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        let digest = Sha256::digest(bytes);
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        SecretKey { id, bytes }
    }

    /// Reads a key written as the base64 of 32 bytes (surrounding white
    /// space ignored, so a key file may end with a newline).
    ///
    /// # Errors
    /// What was wrong, never the text itself.
    pub fn parse(text: &str) -> Result<Self, String> {
        let decoded = B64
            .decode(text.trim())
            .map_err(|_| "expected the base64 of 32 random bytes, e.g. from `head -c 32 /dev/urandom | base64`".to_string())?;
        let bytes: [u8; 32] = decoded.try_into().map_err(|v: Vec<u8>| {
            format!("expected the base64 of 32 bytes, got {} bytes", v.len())
        })?;
        Ok(Self::from_bytes(bytes))
    }

    /// The key as [`SecretKey::parse`] reads it; write it only to a file only
    /// its owner can read.
    pub fn to_text(&self) -> String {
        B64.encode(self.bytes)
    }

    /// The key's id, safe to show.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.bytes).into())
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.id)
    }
}

/// The keys a store seals and opens credentials with: the current one seals
/// every write; it and the previous ones open reads. Without a current key
/// credentials are written as plain text (the library default; the service
/// always configures one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretKeys {
    current: Option<SecretKey>,
    previous: Vec<SecretKey>,
}

impl SecretKeys {
    /// `current` seals and opens; `previous` only open (during a rotation).
    pub fn new(current: SecretKey, previous: Vec<SecretKey>) -> Self {
        SecretKeys {
            current: Some(current),
            previous,
        }
    }

    /// The key that seals, if any.
    pub fn current(&self) -> Option<&SecretKey> {
        self.current.as_ref()
    }

    fn find(&self, id: &str) -> Option<&SecretKey> {
        self.current
            .iter()
            .chain(self.previous.iter())
            .find(|k| k.id == id)
    }

    /// The stored form of `secret`, owned by the record `owner`: sealed under
    /// the current key, or the plain text when there is none.
    ///
    /// # Errors
    /// `Backend` if encryption fails (it does not for valid keys).
    pub fn seal(&self, owner: &[u8], slot: Slot, secret: &Secret) -> StoreResult<String> {
        let Some(key) = &self.current else {
            return Ok(secret.expose().to_string());
        };
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = key
            .cipher()
            .encrypt(
                &nonce,
                Payload {
                    msg: secret.expose().as_bytes(),
                    aad: &aad(owner, slot),
                },
            )
            .map_err(|_| StoreError::Backend("cannot seal a credential".into()))?;
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(format!("{SEALED_PREFIX}{}:{}", key.id, B64.encode(out)))
    }

    /// The credential stored as `stored` on the record `owner`.
    ///
    /// # Errors
    /// `Backend` naming the key id when no configured key has that id, or
    /// when the value does not open (altered, or copied from another record).
    pub fn open(&self, owner: &[u8], slot: Slot, stored: &str) -> StoreResult<Secret> {
        let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(Secret::new(stored));
        };
        let (id, body) = rest
            .split_once(':')
            .ok_or_else(|| StoreError::Backend("a sealed credential is malformed".into()))?;
        let key = self.find(id).ok_or_else(|| unknown_key(id))?;
        let bytes = B64
            .decode(body)
            .ok()
            .filter(|b| b.len() > NONCE_BYTES)
            .ok_or_else(|| StoreError::Backend("a sealed credential is malformed".into()))?;
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        let plain = key
            .cipher()
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad(owner, slot),
                },
            )
            .map_err(|_| {
                StoreError::Backend(format!(
                    "a credential sealed under key {id} does not open: it was altered, or copied from another record or slot"
                ))
            })?;
        String::from_utf8(plain)
            .map(Secret::new)
            .map_err(|_| StoreError::Backend("a sealed credential is not text".into()))
    }

    /// Both secrets of an endpoint, opened.
    ///
    /// # Errors
    /// As [`SecretKeys::open`].
    pub fn open_secrets(&self, owner: &[u8], s: &SigningSecrets) -> StoreResult<SigningSecrets> {
        Ok(SigningSecrets {
            current: self.open(owner, Slot::Current, s.current.expose())?,
            previous: s
                .previous
                .as_ref()
                .map(|p| self.open(owner, Slot::Previous, p.expose()))
                .transpose()?,
            previous_expires_at: s.previous_expires_at,
        })
    }

    /// An endpoint as read, its secrets, custom headers, OAuth2
    /// credentials and client certificate opened.
    ///
    /// # Errors
    /// As [`SecretKeys::open`].
    pub fn open_endpoint(&self, mut e: Endpoint) -> StoreResult<Endpoint> {
        let owner = e.id.0;
        e.secrets = self.open_secrets(owner.as_bytes(), &e.secrets)?;
        e.headers = self.open_optional(owner.as_bytes(), Slot::Headers, e.headers.as_ref())?;
        e.oauth2 = self.open_optional(owner.as_bytes(), Slot::OAuth2, e.oauth2.as_ref())?;
        e.client_tls =
            self.open_optional(owner.as_bytes(), Slot::ClientTls, e.client_tls.as_ref())?;
        Ok(e)
    }

    /// An endpoint's optional credential (custom headers, OAuth2, client
    /// certificate), opened
    /// (`None`: it has none).
    ///
    /// # Errors
    /// As [`SecretKeys::open`].
    pub fn open_optional(
        &self,
        owner: &[u8],
        slot: Slot,
        v: Option<&Secret>,
    ) -> StoreResult<Option<Secret>> {
        v.map(|v| self.open(owner, slot, v.expose())).transpose()
    }

    /// An endpoint's optional credential, sealed (`None`: it has none).
    ///
    /// # Errors
    /// As [`SecretKeys::seal`].
    pub fn seal_optional(
        &self,
        owner: &[u8],
        slot: Slot,
        v: Option<&Secret>,
    ) -> StoreResult<Option<String>> {
        v.map(|v| self.seal(owner, slot, v)).transpose()
    }

    /// `stored` opened and sealed again under the current key (a rotation).
    ///
    /// # Errors
    /// As [`SecretKeys::open`] and [`SecretKeys::seal`].
    pub fn reseal(&self, owner: &[u8], slot: Slot, stored: &str) -> StoreResult<String> {
        self.seal(owner, slot, &self.open(owner, slot, stored)?)
    }

    /// A SQL `LIKE` pattern matching the values sealed under the current
    /// key: a rotation rewrites the values it does not match.
    ///
    /// # Errors
    /// `InvalidInput` when no key is configured (nothing to rotate to).
    pub fn current_pattern(&self) -> StoreResult<String> {
        match &self.current {
            Some(k) => Ok(format!("{SEALED_PREFIX}{}:%", k.id)),
            None => Err(StoreError::InvalidInput(
                "no secret key is configured to seal with; set CONTROLPLANE_SECRET_KEY_FILE".into(),
            )),
        }
    }

    /// Whether `stored` is sealed under the current key (a value a rotation
    /// leaves alone).
    pub fn is_current(&self, stored: &str) -> bool {
        match (&self.current, key_id_of(stored)) {
            (Some(k), Some(id)) => k.id == id,
            _ => false,
        }
    }

    /// Checks the key ids found in a store at open: every one must be a
    /// configured key, or the store refuses to start.
    ///
    /// # Errors
    /// `Unavailable` naming the missing key ids and what to configure.
    pub fn check_known<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> StoreResult<()> {
        let mut missing: Vec<&str> = ids
            .into_iter()
            .filter(|id| self.find(id).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        Err(StoreError::Unavailable(format!(
            "stored credentials are sealed under key(s) {} that are not configured; set \
             CONTROLPLANE_SECRET_KEY_FILE (or CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES during a rotation) \
             to the file holding them",
            missing.join(", ")
        )))
    }
}

impl SecretKeys {
    /// Opens the secrets, custom headers, OAuth2 credentials and client
    /// certificates of freshly claimed deliveries, which the adapters
    /// read as stored. A delivery whose secrets do not open (sealed under a
    /// key this process lacks, or altered) is left out and logged: it stays
    /// leased until its lease expires and is claimed again, by a replica
    /// that holds its key or until its attempts run out, so one bad value
    /// cannot stop every other delivery.
    pub fn open_claimed(&self, claimed: Vec<ClaimedDelivery>) -> Vec<ClaimedDelivery> {
        claimed
            .into_iter()
            .filter_map(|mut c| {
                let owner = c.delivery.endpoint_id.0;
                let owner_bytes = owner.as_bytes();
                let opened = self.open_secrets(owner_bytes, &c.secrets).and_then(|s| {
                    let h = self.open_optional(owner_bytes, Slot::Headers, c.headers.as_ref())?;
                    let o = self.open_optional(owner_bytes, Slot::OAuth2, c.oauth2.as_ref())?;
                    let t =
                        self.open_optional(owner_bytes, Slot::ClientTls, c.client_tls.as_ref())?;
                    Ok((s, h, o, t))
                });
                match opened {
                    Ok((s, h, o, t)) => {
                        c.secrets = s;
                        c.headers = h;
                        c.oauth2 = o;
                        c.client_tls = t;
                        Some(c)
                    }
                    Err(e) => {
                        tracing::error!(
                            delivery_id = %c.delivery.id,
                            endpoint_id = %owner,
                            "{e}; the delivery stays leased until its lease expires"
                        );
                        None
                    }
                }
            })
            .collect()
    }
}

/// The key id a stored value is sealed under; `None` for plain text.
pub fn key_id_of(stored: &str) -> Option<&str> {
    stored
        .strip_prefix(SEALED_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .map(|(id, _)| id)
}

fn unknown_key(id: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "a credential is sealed under key {id}, which is not configured (CONTROLPLANE_SECRET_KEY_FILE, \
         CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES)"
    ))
}

/// The ids of the keys stored credentials are sealed under, one row each
/// (both adapters' SQL): a store refuses to open when one is missing
/// ([`SecretKeys::check_known`]).
pub const SEALED_KEY_IDS: &str = "SELECT DISTINCT split_part(s, ':', 2) FROM \
     (SELECT secret AS s FROM endpoints UNION ALL SELECT previous_secret FROM endpoints \
     UNION ALL SELECT headers FROM endpoints UNION ALL SELECT oauth2 FROM endpoints \
     UNION ALL SELECT client_tls FROM endpoints) AS c \
     WHERE s LIKE 'sealed1:%'";

/// Up to `$2` endpoints (deleted ones included) holding a credential not
/// sealed under the current key (`$1`, [`SecretKeys::current_pattern`]),
/// with the credentials in [`StoredCredentials`] order after the id. A
/// macro so postgres can append its row lock with `concat!`.
#[macro_export]
macro_rules! reseal_candidates {
    () => {
        "SELECT id, secret, previous_secret, headers, oauth2, client_tls FROM endpoints \
         WHERE secret NOT LIKE $1 OR previous_secret NOT LIKE $1 OR headers NOT LIKE $1 \
         OR oauth2 NOT LIKE $1 OR client_tls NOT LIKE $1 ORDER BY id LIMIT $2"
    };
}

/// Writes one endpoint's resealed credentials: `$1` secret, `$2` previous,
/// `$3` the id, `$4` headers, `$5` OAuth2, `$6` the client certificate.
pub const RESEAL_UPDATE: &str = "UPDATE endpoints SET secret = $1, previous_secret = $2, \
     headers = $4, oauth2 = $5, client_tls = $6 WHERE id = $3";

/// An endpoint's credentials as its row stores them (sealed or plain).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCredentials {
    /// The signing secret.
    pub secret: String,
    /// The previous secret, during a rotation.
    pub previous: Option<String>,
    /// The custom headers' JSON object.
    pub headers: Option<String>,
    /// The OAuth2 client credentials' JSON object.
    pub oauth2: Option<String>,
    /// The client certificate and key's JSON object.
    pub client_tls: Option<String>,
}

impl SecretKeys {
    /// Seals each of an endpoint's credentials under the current key, each in
    /// its own slot (the reseal step of a key rotation).
    ///
    /// # Errors
    /// As [`SecretKeys::reseal`]: a value sealed under a key this process
    /// lacks, or altered.
    pub fn reseal_credentials(
        &self,
        owner: &[u8],
        c: &StoredCredentials,
    ) -> StoreResult<StoredCredentials> {
        let reseal = |slot, v: &Option<String>| {
            v.as_deref()
                .map(|v| self.reseal(owner, slot, v))
                .transpose()
        };
        Ok(StoredCredentials {
            secret: self.reseal(owner, Slot::Current, &c.secret)?,
            previous: reseal(Slot::Previous, &c.previous)?,
            headers: reseal(Slot::Headers, &c.headers)?,
            oauth2: reseal(Slot::OAuth2, &c.oauth2)?,
            client_tls: reseal(Slot::ClientTls, &c.client_tls)?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const OWNER: &[u8] = b"endpoint-1";

    #[test]
    fn a_sealed_secret_opens_and_shows_nothing_of_itself() {
        let keys = SecretKeys::new(SecretKey::generate(), vec![]);
        let secret = Secret::new("whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0");
        let stored = keys.seal(OWNER, Slot::Current, &secret).unwrap();
        assert!(stored.starts_with(SEALED_PREFIX), "{stored}");
        assert!(!stored.contains("c2VjcmV0"), "{stored}");
        assert_eq!(key_id_of(&stored), Some(keys.current().unwrap().id()));
        assert_eq!(keys.open(OWNER, Slot::Current, &stored).unwrap(), secret);
        // Two seals of one secret differ (random nonce).
        assert_ne!(keys.seal(OWNER, Slot::Current, &secret).unwrap(), stored);
    }

    #[test]
    fn a_sealed_value_does_not_open_on_another_record_or_altered() {
        let keys = SecretKeys::new(SecretKey::generate(), vec![]);
        let stored = keys
            .seal(OWNER, Slot::Current, &Secret::new("whsec_x"))
            .unwrap();
        assert!(matches!(
            keys.open(b"endpoint-2", Slot::Current, &stored),
            Err(StoreError::Backend(_))
        ));
        let mut altered = stored.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(keys.open(OWNER, Slot::Current, &altered).is_err());
    }

    #[test]
    fn previous_keys_open_but_do_not_seal_and_unknown_keys_are_named() {
        let old = SecretKey::generate();
        let new = SecretKey::generate();
        let stored = SecretKeys::new(old.clone(), vec![])
            .seal(OWNER, Slot::Current, &Secret::new("whsec_y"))
            .unwrap();
        let rotating = SecretKeys::new(new.clone(), vec![old.clone()]);
        assert_eq!(
            rotating
                .open(OWNER, Slot::Current, &stored)
                .unwrap()
                .expose(),
            "whsec_y"
        );
        assert!(!rotating.is_current(&stored));
        assert!(rotating.is_current(
            &rotating
                .seal(OWNER, Slot::Current, &Secret::new("z"))
                .unwrap()
        ));
        let without = SecretKeys::new(new, vec![]);
        let e = without
            .open(OWNER, Slot::Current, &stored)
            .unwrap_err()
            .to_string();
        assert!(e.contains(old.id()), "{e}");
        let e = without.check_known([old.id()]).unwrap_err().to_string();
        assert!(e.contains(old.id()), "{e}");
        assert!(rotating.check_known([old.id()]).is_ok());
        assert!(SecretKeys::default().check_known([old.id()]).is_err());
    }

    #[test]
    fn without_keys_secrets_are_plain_and_plain_text_still_opens() {
        let none = SecretKeys::default();
        assert_eq!(
            none.seal(OWNER, Slot::Current, &Secret::new("whsec_p"))
                .unwrap(),
            "whsec_p"
        );
        let keys = SecretKeys::new(SecretKey::generate(), vec![]);
        assert_eq!(
            keys.open(OWNER, Slot::Current, "whsec_p").unwrap().expose(),
            "whsec_p"
        );
        assert!(!keys.is_current("whsec_p"));
    }

    #[test]
    fn the_key_id_query_looks_for_the_sealed_prefix() {
        assert!(SEALED_KEY_IDS.contains(&format!("LIKE '{SEALED_PREFIX}%'")));
    }

    #[test]
    fn keys_parse_from_their_text_and_refuse_other_lengths() {
        let k = SecretKey::generate();
        let back = SecretKey::parse(&format!("{}\n", k.to_text())).unwrap();
        assert_eq!(back, k);
        assert!(SecretKey::parse("c2hvcnQ=")
            .unwrap_err()
            .contains("5 bytes"));
        assert!(SecretKey::parse("not base64!").is_err());
        assert!(!format!("{k:?}").contains(&k.to_text()));
    }
}
