//! What the dispatcher's test files share: an embedded store in a
//! temporary directory.

use std::sync::Arc;

use control_plane_core::{DynControlPlaneStore, SystemClock};
use store_embedded::{EmbeddedConfig, EmbeddedStore};

/// An embedded store in `dir`, opened with the defaults after `configure`
/// has changed what the test needs.
pub async fn embedded_store(
    dir: &tempfile::TempDir,
    configure: impl FnOnce(&mut EmbeddedConfig),
) -> DynControlPlaneStore {
    let mut cfg = EmbeddedConfig::new(dir.path().join("s.duckdb"));
    configure(&mut cfg);
    Arc::new(
        EmbeddedStore::open(cfg, Arc::new(SystemClock))
            .await
            .unwrap(),
    )
}

/// The mTLS fixtures (testdata/mtls, made once by its `make.sh`; they guard
/// nothing): a test authority, a receiver certificate for 127.0.0.1 and a
/// client certificate it signed, and a self-signed client certificate
/// ("other") that it did not.
#[allow(dead_code)] // each test file uses some
pub mod mtls {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use control_plane_core::ClientTls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The test authority's certificate: a dispatcher trusts it through
    /// `DispatcherConfig::extra_roots_pem`.
    pub const CA: &str = include_str!("../../../../testdata/mtls/ca.pem");
    const SERVER_CERT: &str = include_str!("../../../../testdata/mtls/server.pem");
    const SERVER_KEY: &str = include_str!("../../../../testdata/mtls/server.key");

    /// The client certificate the authority signed, with its key.
    pub fn client() -> ClientTls {
        ClientTls {
            certificate: include_str!("../../../../testdata/mtls/client.pem").into(),
            key: include_str!("../../../../testdata/mtls/client.key").into(),
        }
    }

    /// A client certificate the authority did not sign, with its key.
    pub fn other() -> ClientTls {
        ClientTls {
            certificate: include_str!("../../../../testdata/mtls/other.pem").into(),
            key: include_str!("../../../../testdata/mtls/other.key").into(),
        }
    }

    /// An HTTPS receiver on 127.0.0.1 that requires a client certificate
    /// signed by [`CA`]: what it saw.
    pub struct Receiver {
        /// `https://127.0.0.1:<port>/hook`.
        pub url: String,
        /// TLS handshakes it accepted (each a new connection).
        pub accepted: Arc<AtomicUsize>,
        /// Handshakes it refused (no client certificate, or one [`CA`] did
        /// not sign).
        pub refused: Arc<AtomicUsize>,
        /// Requests it answered `200`, each on an accepted connection.
        pub answered: Arc<AtomicUsize>,
    }

    impl Receiver {
        /// The counters now: accepted, refused, answered.
        pub fn counts(&self) -> (usize, usize, usize) {
            (
                self.accepted.load(Ordering::SeqCst),
                self.refused.load(Ordering::SeqCst),
                self.answered.load(Ordering::SeqCst),
            )
        }
    }

    /// Starts a [`Receiver`]; it answers every request with `200`, keeping
    /// the connection for the next one.
    pub async fn receiver() -> Receiver {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(CA.as_bytes()).unwrap())
            .unwrap();
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(clients)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(SERVER_CERT.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(SERVER_KEY.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Receiver {
            url: format!("https://{}/hook", listener.local_addr().unwrap()),
            accepted: Arc::default(),
            refused: Arc::default(),
            answered: Arc::default(),
        };
        let counts = (r.accepted.clone(), r.refused.clone(), r.answered.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (acceptor, (accepted, refused, answered)) = (acceptor.clone(), counts.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(sock).await else {
                        refused.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    while read_head_and_body(&mut tls).await {
                        answered.fetch_add(1, Ordering::SeqCst);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if tls.write_all(ok).await.is_err() || tls.flush().await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        r
    }

    /// Reads one request (its head, then `content-length` bytes); false
    /// when the connection ends first.
    async fn read_head_and_body(s: &mut (impl AsyncReadExt + Unpin)) -> bool {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            let Some(end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return true;
            }
        }
    }
}
