//! Client certificates (mTLS, ADR 0048): a TLS connector per certificate
//! and key, built once on the client's own verifier and kept while used,
//! and the key the idle pool files its connections under.
//!
//! A connection that presented an endpoint's certificate speaks for that
//! endpoint's owner: it is pooled under the endpoint and the digest of its
//! certificate and key ([`PoolKey`]), so it is never reused for another
//! endpoint, another certificate, or a request that presents none; and a
//! connection made without one is never reused for a request that must
//! present one.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use control_plane_core::ClientTls;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use sha2::{Digest, Sha256};

/// Connectors kept at most; past it the one used longest ago goes (the
/// next send with its certificate builds it again).
const MAX_CONNECTORS: usize = 1024;

/// Who a connection speaks for: the endpoint, and the SHA-256 of the
/// certificate and key it presented. `Debug` shows the endpoint only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    endpoint: String,
    digest: [u8; 32],
}

impl fmt::Debug for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolKey({})", self.endpoint)
    }
}

/// An endpoint's client certificate, ready to connect with.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(super) pool: PoolKey,
    pub(super) tls: tokio_rustls::TlsConnector,
}

/// The TLS settings every connector shares: the crypto provider, the
/// verifier of receivers' certificates and the protocols offered.
pub(super) struct Trust {
    pub(super) provider: Arc<CryptoProvider>,
    pub(super) verifier: Arc<dyn ServerCertVerifier>,
}

impl Trust {
    /// A client configuration that verifies receivers with the shared
    /// verifier and presents `client` when one is given.
    pub(super) fn config(
        &self,
        client: Option<&ClientTls>,
    ) -> Result<rustls::ClientConfig, String> {
        let builder = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot configure TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(self.verifier.clone());
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let chain = pair.chain().map_err(|e| e.to_string())?;
                let key = pair.private_key().map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("client_tls cannot be used: {e}"))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The connectors of the client certificates in use, by digest.
#[derive(Default)]
pub(super) struct Connectors {
    by_digest: Mutex<HashMap<[u8; 32], (tokio_rustls::TlsConnector, Instant)>>,
}

impl Connectors {
    /// The identity of endpoint `endpoint` presenting `pair`: its connector
    /// from the cache, or built (and kept) on `trust`.
    ///
    /// # Errors
    /// When the pair cannot be used (checked when it was saved, so only a
    /// store changed by hand gets here); the reason names the field, never
    /// the key.
    pub(super) fn identity(
        &self,
        trust: &Trust,
        endpoint: &str,
        pair: &ClientTls,
    ) -> Result<Identity, String> {
        let digest: [u8; 32] = Sha256::new()
            .chain_update(pair.certificate.as_bytes())
            .chain_update([0u8])
            .chain_update(pair.key.as_bytes())
            .finalize()
            .into();
        let pool = PoolKey {
            endpoint: endpoint.to_string(),
            digest,
        };
        let mut map = self
            .by_digest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((tls, used)) = map.get_mut(&digest) {
            *used = Instant::now();
            return Ok(Identity {
                pool,
                tls: tls.clone(),
            });
        }
        // Built under the lock: a few hundred microseconds, once per pair.
        let config = trust.config(Some(pair))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        if map.len() >= MAX_CONNECTORS {
            let oldest = map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(d, _)| *d);
            if let Some(d) = oldest {
                map.remove(&d);
            }
        }
        map.insert(digest, (tls.clone(), Instant::now()));
        Ok(Identity { pool, tls })
    }
}
