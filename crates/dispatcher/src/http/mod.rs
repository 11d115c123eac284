//! The HTTP/1.1 client that sends webhooks.
//!
//! Every request in flight holds one connection; with thousands in flight
//! (a slow receiver, `CONTROLPLANE_CONCURRENCY` in the thousands) what each
//! connection holds is most of the process's memory. A webhook needs only
//! the answer's status and `retry-after`, so this client writes the request
//! in one buffer, reads the answer's head through a small one, and holds no
//! task, channel or buffer per connection beyond that (ADR 0017).
//! Connections are kept alive per origin (and per client certificate,
//! [`identity`]) and reused when the answer's length is known; redirects are
//! never followed; every address connected to passed the private-address
//! check ([`crate::ssrf`]) at connect time.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ssrf::Cidr;
use crate::turns::in_turns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::either::Either;

mod answer;
mod identity;
mod proxy;
mod resolve;

use crate::http::answer::{drain, parse_head, quiet, Framing};
pub(crate) use answer::parse_for_fuzzing;
pub(crate) use identity::Identity;
pub use proxy::Proxy;
pub(crate) use resolve::resolve;

/// What the answer's head is first read into; it grows only while a head
/// does not fit, up to [`HEAD_LIMIT`].
const READ_BUFFER: usize = 512;
/// The longest answer head accepted.
const HEAD_LIMIT: usize = 64 * 1024;
/// Headers parsed in an answer head at most.
const MAX_HEADERS: usize = 100;
/// How long the body of an answer is read after its head, so that its
/// connection can carry the next request. The answer counts from its head;
/// a receiver slower than this with its body loses the connection, not the
/// delivery, and holds no send slot longer.
const DRAIN_FOR: Duration = Duration::from_millis(250);
/// An answer's body is read and dropped (so that its connection can carry
/// the next request) up to this size; of a longer one only the start that
/// is kept is read, and the connection is closed.
const BODY_LIMIT: u64 = 64 * 1024;
/// Idle connections kept per origin.
const IDLE_PER_ORIGIN: usize = 256;
/// Idle connections kept in all; past it the longest idle one is closed.
const IDLE_TOTAL: usize = 1024;
/// How often every origin's idle list is swept of connections idle too long.
pub(crate) const REAP_EVERY: Duration = Duration::from_secs(5);
/// How long an idle connection is kept.
const IDLE_FOR: Duration = Duration::from_secs(90);
/// Sent as `user-agent`.
const USER_AGENT: &str = "control-plane-dispatcher";

type Stream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// Where connections go: scheme, host and port, and who they speak for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Origin {
    tls: bool,
    /// As resolved and named to TLS: without the brackets of an IPv6 literal.
    host: String,
    port: u16,
    /// The endpoint and client certificate its connections present, if any:
    /// connections are pooled per origin and per this.
    client: Option<identity::PoolKey>,
}

/// A parsed destination.
struct Target {
    origin: Origin,
    /// The `host` header: the URL's host, and its port when not the default.
    authority: String,
    /// Path and query, as sent in the request line.
    path: String,
    /// `authorization: Basic …` from the URL's user and password, if any.
    authorization: Option<String>,
}

impl Target {
    fn parse(url: &str) -> Result<Target, String> {
        let parsed = url::Url::parse(url).map_err(|_| "the endpoint URL does not parse")?;
        let tls = match parsed.scheme() {
            "https" => true,
            "http" => false,
            _ => return Err("the endpoint URL is neither http:// nor https://".into()),
        };
        let host = parsed.host_str().ok_or("the endpoint URL has no host")?;
        let port = parsed
            .port_or_known_default()
            .ok_or("the endpoint URL has no port")?;
        let authority = match parsed.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let mut path = parsed.path().to_string();
        if let Some(q) = parsed.query() {
            path.push('?');
            path.push_str(q);
        }
        let authorization = basic_authorization(&parsed);
        Ok(Target {
            origin: Origin {
                tls,
                host: host.trim_start_matches('[').trim_end_matches(']').into(),
                port,
                client: None,
            },
            authority,
            path,
            authorization,
        })
    }
}

/// `Basic …` of a URL's user and password (percent-decoded), if it has
/// either: for the receiver's `authorization` or the proxy's
/// `proxy-authorization`.
fn basic_authorization(url: &url::Url) -> Option<String> {
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    use base64::Engine;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let pair = format!(
        "{}:{}",
        decode(url.username()),
        decode(url.password().unwrap_or(""))
    );
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    ))
}

/// What a receiver answered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `retry-after` header, if it is text.
    pub retry_after: Option<String>,
    /// The start of the body, up to the client's `keep` bytes (de-chunked),
    /// as far as it came while the connection was drained.
    pub body: Vec<u8>,
}

/// How an exchange on one connection ended without an answer.
#[derive(Debug, PartialEq, Eq)]
enum Unanswered {
    /// Nothing came back: the connection was closed or reset before the
    /// first byte of an answer (an idle connection the receiver closed).
    Silent,
    /// The answer was cut short or is not HTTP/1.x.
    Broken,
    /// The receiver ended TLS with an alert before answering (after the
    /// handshake in TLS 1.3, e.g. refusing the client certificate), as
    /// rustls words it.
    Alert(String),
}

/// Why a request got no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The destination may not be sent to (its URL, or every address it is
    /// or resolves to is refused): retrying cannot help.
    Refused(String),
    /// The request failed on its way ("timed out", "connection failed",
    /// "request failed", a TLS error, a name that does not resolve now).
    Failed(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Failed(e)
    }
}

/// After an answer's head: the connection and what of the body is still
/// to read, when the connection can carry another request.
struct Rest {
    stream: Stream,
    body: Pending,
}

/// Answer bodies kept at most, whatever the setting asks.
pub(crate) const MAX_KEPT_BODY: usize = 64 * 1024;

/// The body still to read after an answer's head.
enum Pending {
    /// This many bytes (`content-length`), after those already read.
    Length(u64, Vec<u8>),
    /// A chunked body, with the bytes of it already read.
    Chunked(Vec<u8>),
    /// A body read only for its start, with the bytes of it already read:
    /// the connection is not reused, as the answer closes it or its length
    /// is over [`BODY_LIMIT`]. It ends when the connection closes, or after
    /// its length when it gave one (the `Option`), or after its last chunk
    /// when it is chunked (the `bool`).
    UntilClose(Vec<u8>, Option<u64>, bool),
}

/// One client per dispatcher, shared by its sends.
pub(crate) struct HttpClient {
    /// The connector of requests that present no client certificate.
    tls: tokio_rustls::TlsConnector,
    /// What every connector verifies receivers with.
    trust: identity::Trust,
    /// The connectors of client certificates in use.
    identities: identity::Connectors,
    allowed: Arc<Vec<Cidr>>,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Mutex<Idle>,
    /// Idle connections kept in all ([`IDLE_TOTAL`]).
    idle_total: usize,
    /// Bytes of each answer's body kept for the attempt log.
    keep: usize,
    /// The egress proxy, if any ([`proxy`]).
    proxy: Option<Arc<Proxy>>,
}

/// Kept-alive connections by origin, each list oldest first.
struct Idle {
    by_origin: HashMap<Origin, Vec<(Stream, Instant)>>,
    total: usize,
    reaped: Instant,
}

impl Default for Idle {
    fn default() -> Self {
        Idle {
            by_origin: HashMap::new(),
            total: 0,
            reaped: Instant::now(),
        }
    }
}

impl Idle {
    /// Closes every connection idle longer than [`IDLE_FOR`], at most once
    /// per [`REAP_EVERY`], whichever origin it belongs to: an origin never
    /// used again does not keep its sockets.
    fn reap(&mut self) {
        if self.reaped.elapsed() < REAP_EVERY {
            return;
        }
        self.reaped = Instant::now();
        self.by_origin.retain(|_, list| {
            list.retain(|(_, since)| since.elapsed() < IDLE_FOR);
            !list.is_empty()
        });
        self.total = self.by_origin.values().map(Vec::len).sum();
    }

    /// Closes the connection idle longest, of any origin.
    fn evict_oldest(&mut self) {
        let oldest = self
            .by_origin
            .iter()
            .filter_map(|(o, list)| list.first().map(|(_, since)| (*since, o.clone())))
            .min_by_key(|(since, _)| *since)
            .map(|(_, o)| o);
        if let Some(origin) = oldest {
            if let Some(list) = self.by_origin.get_mut(&origin) {
                list.remove(0);
                self.total = self.total.saturating_sub(1);
                if list.is_empty() {
                    self.by_origin.remove(&origin);
                }
            }
        }
    }
}

impl HttpClient {
    /// A client that trusts the platform's roots only (the tests').
    #[cfg(test)]
    pub(crate) fn new(
        timeout: Duration,
        connect_timeout: Duration,
        allowed: Vec<Cidr>,
    ) -> Result<HttpClient, String> {
        Self::trusting(timeout, connect_timeout, allowed, Vec::new())
    }

    /// A client whose requests take at most `timeout` each (connecting at
    /// most `connect_timeout` of it), verifying TLS certificates with the
    /// platform's roots and the authorities `extra_roots` (such as a test's
    /// own authority), and connecting to private addresses only inside
    /// `allowed`.
    pub(crate) fn trusting(
        timeout: Duration,
        connect_timeout: Duration,
        allowed: Vec<Cidr>,
        extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    ) -> Result<HttpClient, String> {
        // One process-wide TLS provider; a second install is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
                .map_err(|e| format!("cannot load the TLS roots: {e}"))?;
        let trust = identity::Trust {
            provider,
            verifier: Arc::new(verifier),
        };
        let config = trust.config(None)?;
        Ok(HttpClient {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            trust,
            identities: identity::Connectors::default(),
            allowed: Arc::new(allowed),
            timeout,
            connect_timeout,
            idle: Mutex::default(),
            idle_total: IDLE_TOTAL,
            keep: 0,
            proxy: None,
        })
    }

    /// Connects through `proxy` where it carries the destination.
    pub(crate) fn through(mut self, proxy: Option<Proxy>) -> Self {
        self.proxy = proxy.map(Arc::new);
        self
    }

    /// How long a request may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Keeps the first `bytes` of every answer's body (at most
    /// [`MAX_KEPT_BODY`]) in [`Answer::body`].
    pub(crate) fn keeping_bodies(mut self, bytes: usize) -> Self {
        self.keep = bytes.min(MAX_KEPT_BODY);
        self
    }

    /// POSTs `body` with `headers` to `url` and returns the answer, or the
    /// failure in words without the URL (it may carry credentials). The
    /// destination's addresses are checked when a connection is made
    /// ([`resolve::resolve`]); a kept-alive one was checked then. With an
    /// `identity` its client certificate is presented over TLS, on
    /// connections of that identity only.
    pub(crate) async fn post(
        &self,
        url: &str,
        identity: Option<&Identity>,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Result<Answer, Failure> {
        self.send(url, identity, headers, body, self.keep).await
    }

    /// The identity endpoint `endpoint` connects with when it has a client
    /// certificate (`stored`, the opened text of
    /// [`control_plane_core::ClientTls`]; [`identity`]).
    ///
    /// # Errors
    /// Why the pair cannot be used (never the key).
    pub(crate) fn identity(
        &self,
        endpoint: control_plane_core::EndpointId,
        stored: Option<&control_plane_core::Secret>,
    ) -> Result<Option<Identity>, String> {
        let Some(stored) = stored else {
            return Ok(None);
        };
        let pair = control_plane_core::ClientTls::from_text(stored).map_err(|e| e.to_string())?;
        self.identities
            .identity(&self.trust, &endpoint.to_string(), &pair)
            .map(Some)
    }

    /// As [`HttpClient::post`], keeping the first `keep` bytes of the
    /// answer's body (at most [`MAX_KEPT_BODY`]) whatever the client keeps:
    /// for answers the dispatcher reads itself (an OAuth2 token).
    pub(crate) async fn post_keeping(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &[u8],
        keep: usize,
    ) -> Result<Answer, Failure> {
        self.send(url, None, headers, body, keep).await
    }

    /// The request, on a connection of `identity` (or of none).
    async fn send(
        &self,
        url: &str,
        identity: Option<&Identity>,
        headers: &[(&str, String)],
        body: &[u8],
        keep: usize,
    ) -> Result<Answer, Failure> {
        let keep = keep.min(MAX_KEPT_BODY);
        let mut target = Target::parse(url).map_err(Failure::Refused)?;
        target.origin.client = identity.map(|i| i.pool.clone());
        let tls = identity.map_or(&self.tls, |i| &i.tls);
        let request = encode(&target, headers, body)?;
        let started = Instant::now();
        let (mut answer, rest) =
            tokio::time::timeout(self.timeout, self.exchange(&target, tls, &request))
                .await
                .map_err(|_| "timed out".to_string())??;
        // Read the body so the connection can carry the next request (and
        // keep its start); a receiver that answered has answered, whatever
        // its body does.
        if let Some(rest) = rest {
            let left = self
                .timeout
                .saturating_sub(started.elapsed())
                .min(DRAIN_FOR);
            let kept = &mut answer.body;
            if let Ok(Some(stream)) = tokio::time::timeout(left, drain(rest, keep, kept)).await {
                self.keep(target.origin, stream);
            }
        }
        Ok(answer)
    }

    /// The request on an idle connection, or on a new one when there is
    /// none or the idle one was closed without an answer.
    async fn exchange(
        &self,
        target: &Target,
        tls: &tokio_rustls::TlsConnector,
        request: &[u8],
    ) -> Result<(Answer, Option<Rest>), Failure> {
        if let Some(stream) = self.idle(&target.origin) {
            match round_trip(stream, request).await {
                Ok(done) => return Ok(done),
                Err(Unanswered::Silent) => {}
                Err(unanswered) => return Err(unanswered.into()),
            }
        }
        // Boxed: resolving and the TLS handshake are large futures that
        // each open request would otherwise carry while it waits (ADR 0017).
        let stream = Box::pin(self.connect(&target.origin, tls)).await?;
        round_trip(stream, request).await.map_err(Failure::from)
    }

    /// A new connection to `origin`: resolved through the private-address
    /// check, then TCP (and TLS with `tls`).
    async fn connect(
        &self,
        origin: &Origin,
        tls: &tokio_rustls::TlsConnector,
    ) -> Result<Stream, Failure> {
        let addrs = tokio::time::timeout(
            self.connect_timeout,
            resolve::resolve(&origin.host, origin.port, &self.allowed),
        )
        .await
        .map_err(|_| format!("cannot resolve {} in time", origin.host))??;
        let tcp = tokio::time::timeout(self.connect_timeout, self.open(origin, &addrs))
            .await
            .map_err(|_| "timed out".to_string())??;
        let _ = tcp.set_nodelay(true);
        if !origin.tls {
            return Ok(Either::Left(tcp));
        }
        let name = rustls::pki_types::ServerName::try_from(origin.host.clone()).map_err(|_| {
            Failure::Refused("the endpoint's host is not a valid TLS server name".into())
        })?;
        let tls = tokio::time::timeout(self.connect_timeout, tls.connect(name, tcp))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        Ok(Either::Right(tls))
    }

    /// A TCP connection to one of `addrs` (checked), directly or through
    /// the proxy's tunnel; a proxy's refusal is named in the failure.
    async fn open(&self, origin: &Origin, addrs: &[SocketAddr]) -> Result<TcpStream, Failure> {
        let proxy = match &self.proxy {
            Some(p) if p.carries(&origin.host) => p.clone(),
            _ => {
                return connect_any(addrs, TcpStream::connect)
                    .await
                    .ok_or_else(|| Failure::Failed("connection failed".into()))
            }
        };
        let last = Arc::new(Mutex::new(None::<String>));
        let noted = last.clone();
        let tunnel = move |to: SocketAddr| {
            let (proxy, noted) = (proxy.clone(), noted.clone());
            async move {
                let r = proxy.tunnel(to).await;
                if let Err(e) = &r {
                    *noted.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                }
                r
            }
        };
        connect_any(addrs, tunnel).await.ok_or_else(|| {
            let why = last.lock().unwrap_or_else(PoisonError::into_inner).take();
            Failure::Failed(match why {
                Some(why) => format!("connection failed: {why}"),
                None => "connection failed".into(),
            })
        })
    }

    /// Closes idle connections kept longer than [`IDLE_FOR`], of every
    /// origin (at most once per [`REAP_EVERY`]); the dispatcher calls it on
    /// a timer, so sockets close even when nothing is sent.
    pub(crate) fn reap_idle(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reap();
    }

    /// An idle connection to `origin` kept less than [`IDLE_FOR`] and
    /// still quiet (see [`quiet`]).
    fn idle(&self, origin: &Origin) -> Option<Stream> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.reap();
        let list = idle.by_origin.get_mut(origin)?;
        let mut found = None;
        let mut taken = 0;
        while let Some((mut stream, since)) = list.pop() {
            taken += 1;
            if since.elapsed() < IDLE_FOR && quiet(&mut stream) {
                found = Some(stream);
                break;
            }
        }
        if list.is_empty() {
            idle.by_origin.remove(origin);
        }
        idle.total = idle.total.saturating_sub(taken);
        found
    }

    /// Keeps `stream` for the next request to `origin`, dropping those
    /// idle too long.
    fn keep(&self, origin: Origin, stream: Stream) {
        let origin_key = origin.clone();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.reap();
        let list = idle.by_origin.entry(origin).or_default();
        let before = list.len();
        list.retain(|(_, since)| since.elapsed() < IDLE_FOR);
        let kept = list.len();
        idle.total = idle.total.saturating_sub(before - kept);
        if kept >= IDLE_PER_ORIGIN {
            return;
        }
        if idle.total >= self.idle_total {
            idle.evict_oldest();
        }
        idle.by_origin
            .entry(origin_key)
            .or_default()
            .push((stream, Instant::now()));
        idle.total += 1;
    }
}

/// The request's bytes: request line, headers, `content-length`, body. An
/// `authorization` among `headers` replaces the one of the URL's user and
/// password.
fn encode(target: &Target, headers: &[(&str, String)], body: &[u8]) -> Result<Vec<u8>, String> {
    let length = body.len().to_string();
    let fixed = [
        ("host", target.authority.as_str()),
        ("user-agent", USER_AGENT),
        ("content-length", length.as_str()),
    ];
    let given = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("authorization"));
    let auth = target
        .authorization
        .as_deref()
        .filter(|_| !given)
        .map(|a| ("authorization", a));
    let all = fixed
        .into_iter()
        .chain(auth)
        .chain(headers.iter().map(|(n, v)| (*n, v.as_str())));
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(target.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in all {
        // Header values here come from our own code and a parsed URL;
        // a control character would still end the head early.
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(format!(
                "request failed: the {name} header is not valid HTTP"
            ));
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Ok(out)
}

/// Writes `request` and reads the answer's head (skipping informational
/// 1xx heads). The connection comes back with what of the body is still to
/// read (see [`Pending`]) once the whole request was written.
async fn round_trip(
    mut stream: Stream,
    request: &[u8],
) -> Result<(Answer, Option<Rest>), Unanswered> {
    // A receiver may answer before it has read the whole request (an early
    // `413`) and close: the write then fails, and the answer is still read.
    let written = match stream.write_all(request).await {
        Ok(()) => stream.flush().await.is_ok(),
        Err(_) => false,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER);
    let mut answered = false;
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(READ_BUFFER);
        }
        let read = stream.read_buf(&mut buf).await;
        match read {
            Ok(n) if n > 0 => {}
            _ if answered || !buf.is_empty() => return Err(Unanswered::Broken),
            Err(e) => return Err(tls_alert(&e).map_or(Unanswered::Silent, Unanswered::Alert)),
            Ok(_) => return Err(Unanswered::Silent),
        }
        while let Some((head_len, head)) = parse_head(&buf)? {
            // A read may bring in more than the limit at once: the limit is
            // on the head itself, whatever arrived with it.
            if head_len > HEAD_LIMIT {
                return Err(Unanswered::Broken);
            }
            buf.drain(..head_len);
            answered = true;
            if (100..200).contains(&head.answer.status) {
                continue;
            }
            if !written {
                return Ok((head.answer, None));
            }
            let rest = match head.body {
                Some(Framing::Length(length)) => {
                    let already = u64::try_from(buf.len()).unwrap_or(u64::MAX);
                    let body = if length <= BODY_LIMIT && already <= length {
                        Pending::Length(length - already, buf)
                    } else {
                        // Too long to read for the connection's sake, or
                        // followed by bytes no request asked for: the
                        // connection goes, but the body's start is what an
                        // operator reads first on the attempt.
                        buf.truncate(usize::try_from(length).unwrap_or(usize::MAX));
                        Pending::UntilClose(buf, Some(length), false)
                    };
                    Some(Rest { stream, body })
                }
                Some(Framing::Chunked) => Some(Rest {
                    stream,
                    body: Pending::Chunked(buf),
                }),
                None => Some(Rest {
                    stream,
                    body: Pending::UntilClose(buf, head.length, head.chunked),
                }),
            };
            return Ok((head.answer, rest));
        }
        if buf.len() > HEAD_LIMIT {
            return Err(Unanswered::Broken);
        }
    }
}

/// The certificates of `pem` (none when `None`), as a client trusts them
/// beside the platform's roots.
///
/// # Errors
/// When `pem` holds no certificate or one that does not decode.
pub(crate) fn roots_of(
    pem: Option<&str>,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let Some(pem) = pem else {
        return Ok(Vec::new());
    };
    let roots = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("extra_roots_pem: not PEM certificates: {e}"))?;
    if roots.is_empty() {
        return Err("extra_roots_pem holds no \"-----BEGIN CERTIFICATE-----\" block".into());
    }
    Ok(roots)
}

impl From<Unanswered> for Failure {
    fn from(u: Unanswered) -> Failure {
        Failure::Failed(match u {
            Unanswered::Alert(why) => format!(
                "the receiver ended the TLS connection before answering: {why} \
                 (a receiver that requires a client certificate refuses a missing or untrusted one so)"
            ),
            Unanswered::Silent | Unanswered::Broken => "request failed".into(),
        })
    }
}

/// The TLS error in `e`, in rustls's words, when a read failed on one (an
/// alert the receiver sent, such as `CertificateRequired`).
fn tls_alert(e: &std::io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(ToString::to_string)
}

/// RFC 8305's connection attempt delay: how long one attempt runs alone
/// before the next address is tried beside it.
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// The first of `addrs` that accepts a TCP connection, Happy Eyeballs
/// style (RFC 8305): the families alternate, and each next address is
/// tried when the previous attempt failed or after [`ATTEMPT_DELAY`],
/// whichever comes first, so one address that drops packets does not fail
/// a name that has others. `connect` makes one attempt (tests drive it).
async fn connect_any<F, Fut, S>(addrs: &[SocketAddr], connect: F) -> Option<S>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = std::io::Result<S>> + Send + 'static,
    S: Send + 'static,
{
    // The families alternate, the first address's family first (RFC 8305 4).
    let mut next = in_turns(addrs.to_vec(), SocketAddr::is_ipv6).into_iter();
    let mut attempts = tokio::task::JoinSet::new();
    loop {
        if let Some(addr) = next.next() {
            attempts.spawn(connect(addr));
        }
        let more = next.len() > 0;
        tokio::select! {
            done = attempts.join_next() => match done {
                Some(Ok(Ok(stream))) => return Some(stream),
                Some(_) => {}
                None if !more => return None,
                None => {}
            },
            () = tokio::time::sleep(ATTEMPT_DELAY), if more => {}
        }
    }
}

#[cfg(test)]
mod tests;
