//! The HTTP/1.1 client that sends webhooks.
//!
//! Every request in flight holds one connection; with thousands in flight
//! (a slow receiver, `CONTROLPLANE_CONCURRENCY` in the thousands) what each
//! connection holds is most of the process's memory. A webhook needs only
//! the answer's status and `retry-after`, so this client writes the request
//! in one buffer, reads the answer's head through a small one, and holds no
//! task, channel or buffer per connection beyond that (ADR 0017).
//! Connections are kept alive per origin and reused when the answer's length
//! is known; redirects are never followed; every address connected to passed
//! the private-address check ([`crate::ssrf`]) at connect time.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ssrf::Cidr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::either::Either;

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
/// the next request) up to this size; a longer one closes the connection.
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

/// Where connections go: scheme, host and port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Origin {
    tls: bool,
    /// As resolved and named to TLS: without the brackets of an IPv6 literal.
    host: String,
    port: u16,
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
        let authorization =
            (!parsed.username().is_empty() || parsed.password().is_some()).then(|| {
                use base64::Engine;
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8_lossy()
                        .into_owned()
                };
                let pair = format!(
                    "{}:{}",
                    decode(parsed.username()),
                    decode(parsed.password().unwrap_or(""))
                );
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            });
        Ok(Target {
            origin: Origin {
                tls,
                host: host.trim_start_matches('[').trim_end_matches(']').into(),
                port,
            },
            authority,
            path,
            authorization,
        })
    }
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
    /// A body that ends when the connection closes (or after its length,
    /// when it gave one), with the bytes of it already read: read only for
    /// its start, the connection is not reused.
    UntilClose(Vec<u8>, Option<u64>, bool),
}

/// One client per dispatcher, shared by its sends.
pub(crate) struct HttpClient {
    tls: tokio_rustls::TlsConnector,
    allowed: Arc<Vec<Cidr>>,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Mutex<Idle>,
    /// Idle connections kept in all ([`IDLE_TOTAL`]).
    idle_total: usize,
    /// Bytes of each answer's body kept for the attempt log.
    keep: usize,
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
    /// A client whose requests take at most `timeout` each (connecting at
    /// most `connect_timeout` of it), verifying TLS certificates with the
    /// platform's roots and connecting to private addresses only inside
    /// `allowed`.
    pub(crate) fn new(
        timeout: Duration,
        connect_timeout: Duration,
        allowed: Vec<Cidr>,
    ) -> Result<HttpClient, String> {
        use rustls_platform_verifier::ConfigVerifierExt;
        // One process-wide TLS provider; a second install is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = rustls::ClientConfig::with_platform_verifier()
            .map_err(|e| format!("cannot load the TLS roots: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpClient {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            allowed: Arc::new(allowed),
            timeout,
            connect_timeout,
            idle: Mutex::default(),
            idle_total: IDLE_TOTAL,
            keep: 0,
        })
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
    /// ([`crate::ssrf::resolve`]); a kept-alive one was checked then.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Result<Answer, Failure> {
        self.post_keeping(url, headers, body, self.keep).await
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
        let keep = keep.min(MAX_KEPT_BODY);
        let target = Target::parse(url).map_err(Failure::Refused)?;
        let request = encode(&target, headers, body)?;
        let started = Instant::now();
        let (mut answer, rest) =
            tokio::time::timeout(self.timeout, self.exchange(&target, &request))
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
        request: &[u8],
    ) -> Result<(Answer, Option<Rest>), Failure> {
        if let Some(stream) = self.idle(&target.origin) {
            match round_trip(stream, request).await {
                Ok(done) => return Ok(done),
                Err(Unanswered::Silent) => {}
                Err(Unanswered::Broken) => return Err(Failure::Failed("request failed".into())),
            }
        }
        // Boxed: resolving and the TLS handshake are large futures that
        // each open request would otherwise carry while it waits (ADR 0017).
        let stream = Box::pin(self.connect(&target.origin)).await?;
        round_trip(stream, request)
            .await
            .map_err(|_| Failure::Failed("request failed".into()))
    }

    /// A new connection to `origin`: resolved through the private-address
    /// check, then TCP (and TLS).
    async fn connect(&self, origin: &Origin) -> Result<Stream, Failure> {
        let addrs = tokio::time::timeout(
            self.connect_timeout,
            crate::ssrf::resolve(&origin.host, origin.port, &self.allowed),
        )
        .await
        .map_err(|_| format!("cannot resolve {} in time", origin.host))??;
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            connect_any(&addrs, TcpStream::connect),
        )
        .await
        .map_err(|_| "timed out".to_string())?
        .ok_or_else(|| Failure::Failed("connection failed".into()))?;
        let _ = tcp.set_nodelay(true);
        if !origin.tls {
            return Ok(Either::Left(tcp));
        }
        let name = rustls::pki_types::ServerName::try_from(origin.host.clone()).map_err(|_| {
            Failure::Refused("the endpoint's host is not a valid TLS server name".into())
        })?;
        let tls = tokio::time::timeout(self.connect_timeout, self.tls.connect(name, tcp))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        Ok(Either::Right(tls))
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
/// 1xx heads). The connection comes back when the answer's body has a
/// known, small length and the receiver did not ask to close.
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
            _ => return Err(Unanswered::Silent),
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
                    (length <= BODY_LIMIT && already <= length).then(|| Rest {
                        stream,
                        body: Pending::Length(length - already, buf),
                    })
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

/// A parsed answer head.
struct Head {
    answer: Answer,
    /// How the body ends, when the connection can be reused after it.
    body: Option<Framing>,
    /// The `content-length`, even of an answer that closes its connection.
    length: Option<u64>,
    /// Whether the body is chunked, even in an answer that closes its
    /// connection.
    chunked: bool,
}

/// How an answer's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// After this many bytes.
    Length(u64),
    /// After its last (empty) chunk and trailers.
    Chunked,
}

/// The head at the start of `buf` and its length, `None` while it is
/// incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, Head)>, Unanswered> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Unanswered::Broken),
    };
    let status = response.code.ok_or(Unanswered::Broken)?;
    let value = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let encodings: Vec<&[u8]> = response
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
        .map(|h| h.value)
        .collect();
    // Only `chunked` alone is decoded; any other coding, or a length beside
    // it (RFC 9112 6.1: a sign of smuggling), ends the connection after the
    // answer.
    let chunked =
        matches!(encodings.as_slice(), [v] if v.trim_ascii().eq_ignore_ascii_case(b"chunked"));
    // Two different lengths make the framing ambiguous (RFC 9112 6.3):
    // the answer is refused, not guessed at.
    let lengths: Vec<Option<&str>> = response
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| std::str::from_utf8(h.value).ok().map(str::trim))
        .collect();
    let first = lengths.first().copied().flatten();
    if lengths.iter().any(|v| *v != first) {
        return Err(Unanswered::Broken);
    }
    let closes = response.version != Some(1)
        || value("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        || (!encodings.is_empty() && !chunked)
        || (chunked && !lengths.is_empty());
    let body = if closes {
        None
    } else if status == 204 || status == 304 {
        Some(Framing::Length(0))
    } else if chunked {
        Some(Framing::Chunked)
    } else {
        first
            .and_then(|v| v.parse::<u64>().ok())
            .map(Framing::Length)
    };
    let head = Head {
        answer: Answer {
            status,
            retry_after: value("retry-after").map(str::to_string),
            body: Vec::new(),
        },
        body,
        length: first.and_then(|v| v.parse::<u64>().ok()),
        chunked,
    };
    Ok(Some((len, head)))
}

/// Both answer parsers over `bytes` (see [`crate::parse_answer_for_fuzzing`]).
pub(crate) fn parse_for_fuzzing(bytes: &[u8]) {
    let _ = parse_head(bytes);
    let _ = chunked_end(bytes);
}

/// Reads the rest of a body, keeping its first `keep` bytes in `kept`; the
/// connection when it all came and nothing followed it.
async fn drain(rest: Rest, keep: usize, kept: &mut Vec<u8>) -> Option<Stream> {
    let Rest { mut stream, body } = rest;
    let take = |bytes: &[u8], kept: &mut Vec<u8>| {
        let room = keep.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    };
    match body {
        Pending::Length(mut left, already) => {
            take(&already, kept);
            let mut scratch = [0u8; READ_BUFFER];
            while left > 0 {
                let want = usize::try_from(left).map_or(READ_BUFFER, |l| l.min(READ_BUFFER));
                match stream.read(&mut scratch[..want]).await {
                    Ok(n) if n > 0 => {
                        take(&scratch[..n], kept);
                        left -= u64::try_from(n).unwrap_or(u64::MAX).min(left);
                    }
                    _ => return None,
                }
            }
            Some(stream)
        }
        Pending::Chunked(mut buf) => loop {
            match chunked_end(&buf) {
                Ok(Some(end)) => {
                    take(&dechunk(&buf[..end], keep), kept);
                    return (end == buf.len()).then_some(stream);
                }
                Ok(None) => {}
                Err(ChunkError) => return None,
            }
            if buf.len() > CHUNKED_LIMIT {
                return None;
            }
            buf.reserve(4 * READ_BUFFER);
            match stream.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        },
        Pending::UntilClose(mut raw, _, true) => {
            // Chunked, then closed: read the framing until the body's end,
            // the connection's end or enough data, then keep its data.
            while raw.len() <= CHUNKED_LIMIT
                && matches!(chunked_end(&raw), Ok(None))
                && dechunk(&raw, keep).len() < keep
            {
                raw.reserve(4 * READ_BUFFER);
                match stream.read_buf(&mut raw).await {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
            }
            take(&dechunk(&raw, keep), kept);
            None
        }
        Pending::UntilClose(already, length, false) => {
            take(&already, kept);
            let want = length.map_or(keep, |l| keep.min(usize::try_from(l).unwrap_or(usize::MAX)));
            let mut scratch = [0u8; READ_BUFFER];
            while kept.len() < want {
                match stream.read(&mut scratch).await {
                    Ok(n) if n > 0 => take(&scratch[..n], kept),
                    _ => break,
                }
            }
            None
        }
    }
}

/// The data of the whole chunked body `raw` (as [`chunked_end`] found it),
/// its first `keep` bytes.
fn dechunk(raw: &[u8], keep: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < keep {
        let Some(line_end) = raw[at..].windows(2).position(|w| w == b"\r\n") else {
            break;
        };
        let line = &raw[at..at + line_end];
        let size_text = line.split(|b| *b == b';').next().unwrap_or_default();
        let Some(size) = std::str::from_utf8(size_text)
            .ok()
            .and_then(|t| usize::from_str_radix(t.trim(), 16).ok())
        else {
            break;
        };
        if size == 0 {
            break;
        }
        let start = at + line_end + 2;
        let Some(data) = raw.get(start..start + size) else {
            break;
        };
        let room = keep - out.len();
        out.extend_from_slice(&data[..size.min(room)]);
        at = start + size + 2;
    }
    out
}

/// The most of a chunked body (framing included) read to reuse its
/// connection.
const CHUNKED_LIMIT: usize = 80 * 1024;

/// A chunked body that breaks the framing of RFC 9112 7.1.
#[derive(Debug, PartialEq, Eq)]
struct ChunkError;

/// Where the chunked body at the start of `buf` ends (after its last chunk,
/// trailers and the final empty line), `None` while it is incomplete.
/// Chunk sizes over [`CHUNKED_LIMIT`] are refused rather than waited for.
fn chunked_end(buf: &[u8]) -> Result<Option<usize>, ChunkError> {
    let line_end = |from: usize| -> Option<usize> {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let mut i = 0usize;
    loop {
        let Some(end) = line_end(i) else {
            return Ok(None);
        };
        let line = buf.get(i..end).ok_or(ChunkError)?;
        let size_text = line
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii_end();
        if size_text.is_empty()
            || size_text.len() > 8
            || !size_text.iter().all(u8::is_ascii_hexdigit)
        {
            return Err(ChunkError);
        }
        let size = std::str::from_utf8(size_text)
            .ok()
            .and_then(|t| usize::from_str_radix(t, 16).ok())
            .ok_or(ChunkError)?;
        if size > CHUNKED_LIMIT {
            return Err(ChunkError);
        }
        i = end + 2;
        if size == 0 {
            break;
        }
        let data_end = i + size;
        match buf.get(data_end..data_end + 2) {
            None => return Ok(None),
            Some(b"\r\n") => i = data_end + 2,
            Some(_) => return Err(ChunkError),
        }
    }
    // Trailer fields, then the empty line.
    loop {
        let Some(end) = line_end(i) else {
            return Ok(None);
        };
        if end == i {
            return Ok(Some(i + 2));
        }
        i = end + 2;
    }
}

/// Whether an idle connection is open with nothing to read. A receiver
/// that closed it, or wrote to it unasked (a late answer, a TLS alert),
/// would otherwise have those bytes read as the answer to the next request.
/// On TLS, records that rustls already took off the socket count too.
fn quiet(stream: &mut Stream) -> bool {
    let tcp = match stream {
        Either::Left(tcp) => &*tcp,
        Either::Right(tls) => {
            match tls.get_mut().1.process_new_packets() {
                Ok(io) if io.plaintext_bytes_to_read() == 0 && !io.peer_has_closed() => {}
                _ => return false,
            }
            tls.get_ref().0
        }
    };
    let mut byte = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut byte);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    tcp.poll_peek(&mut cx, &mut buf).is_pending()
}

/// RFC 8305's connection attempt delay: how long one attempt runs alone
/// before the next address is tried beside it.
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// `addrs` with the two families alternating, the first address's family
/// first (RFC 8305 4).
fn interleave(addrs: &[SocketAddr]) -> Vec<SocketAddr> {
    let first_v6 = addrs.first().is_some_and(SocketAddr::is_ipv6);
    let (mut a, mut b): (Vec<SocketAddr>, Vec<SocketAddr>) =
        addrs.iter().partition(|x| x.is_ipv6() == first_v6);
    a.reverse();
    b.reverse();
    let mut out = Vec::with_capacity(addrs.len());
    while !a.is_empty() || !b.is_empty() {
        out.extend(a.pop());
        out.extend(b.pop());
    }
    out
}

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
    let mut next = interleave(addrs).into_iter();
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
mod tests {
    use super::*;

    #[test]
    fn targets_carry_host_port_path_and_credentials() {
        let t = Target::parse("https://us%40er:p%3Ass@[::1]:8443/a/b?c=d").unwrap();
        assert_eq!(
            t.origin,
            Origin {
                tls: true,
                host: "::1".into(),
                port: 8443
            }
        );
        assert_eq!(t.authority, "[::1]:8443");
        assert_eq!(t.path, "/a/b?c=d");
        use base64::Engine;
        let expected = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
        assert_eq!(t.authorization, Some(format!("Basic {expected}")));
        let t = Target::parse("http://example.com").unwrap();
        assert_eq!(
            (t.origin.port, t.authority.as_str(), t.path.as_str()),
            (80, "example.com", "/")
        );
        assert!(t.authorization.is_none());
        assert!(Target::parse("ftp://example.com/x").is_err());
        assert!(Target::parse("not a url").is_err());
    }

    /// A receiver that answers the requests on each connection with the
    /// next scripted answer (written `chunk` bytes at a time; `|pause|`
    /// waits 50 ms; `|close|` closes without answering), and counts
    /// connections and requests.
    async fn receiver(
        answers: Vec<&'static str>,
        chunk: usize,
    ) -> (
        String,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook?x=1", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(answers);
        let (c, r) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let (r, answers) = (r.clone(), answers.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // One request: the head, then content-length bytes.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut b = [0u8; 1024];
                            match s.read(&mut b).await {
                                Ok(n) if n > 0 => buf.extend_from_slice(&b[..n]),
                                _ => return,
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        assert!(head.starts_with("post /hook?x=1 http/1.1\r\n"), "{head}");
                        assert!(head.contains("\r\nwebhook-id: msg_1\r\n"), "{head}");
                        let length: usize = head
                            .split("\r\n")
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .unwrap()
                            .parse()
                            .unwrap();
                        while buf.len() < head_end + length {
                            let mut b = [0u8; 1024];
                            let n = s.read(&mut b).await.unwrap();
                            buf.extend_from_slice(&b[..n]);
                        }
                        assert_eq!(&buf[head_end..head_end + length], b"{\"a\":1}");
                        buf.drain(..head_end + length);
                        let i = r.fetch_add(1, Ordering::SeqCst);
                        let answer = answers[i.min(answers.len() - 1)];
                        if answer == "|close|" {
                            return;
                        }
                        for (i, piece) in answer.split("|pause|").enumerate() {
                            if i > 0 {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            for part in piece.as_bytes().chunks(chunk) {
                                s.write_all(part).await.unwrap();
                                s.flush().await.unwrap();
                            }
                        }
                    }
                });
            }
        });
        (url, connections, requests)
    }

    fn client() -> HttpClient {
        HttpClient::new(
            Duration::from_secs(5),
            Duration::from_secs(5),
            vec![Cidr::parse("127.0.0.0/8").unwrap()],
        )
        .unwrap()
    }

    async fn post(client: &HttpClient, url: &str) -> Result<Answer, Failure> {
        client
            .post(url, &[("webhook-id", "msg_1".into())], b"{\"a\":1}")
            .await
    }

    /// Posts `posts` times through one client to a [`receiver`] of
    /// `answers`, waiting `gap` between posts: the statuses, then how many
    /// connections and requests the receiver saw.
    async fn statuses(
        answers: Vec<&'static str>,
        posts: usize,
        gap: Duration,
    ) -> (Vec<u16>, usize, usize) {
        use std::sync::atomic::Ordering;
        let (url, connections, requests) = receiver(answers, 1024).await;
        let client = client();
        let mut seen = Vec::new();
        for _ in 0..posts {
            seen.push(post(&client, &url).await.unwrap().status);
            tokio::time::sleep(gap).await;
        }
        (
            seen,
            connections.load(Ordering::SeqCst),
            requests.load(Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn answers_of_known_length_keep_the_connection() {
        let (seen, connections, requests) = statuses(
            vec!["HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"],
            3,
            Duration::ZERO,
        )
        .await;
        assert_eq!(seen, [200, 200, 200]);
        assert_eq!(requests, 3);
        assert_eq!(connections, 1, "one connection, reused");
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_in_all_the_longest_idle_closed_first() {
        let mut client = client();
        client.idle_total = 2;
        let mut urls = Vec::new();
        for _ in 0..3 {
            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
            let (url, _, _) = receiver(vec![answer], 1024).await;
            assert_eq!(post(&client, &url).await.unwrap().status, 200);
            urls.push(url);
        }
        let idle = client.idle.lock().unwrap();
        assert_eq!(idle.total, 2);
        let kept: usize = idle.by_origin.values().map(Vec::len).sum();
        assert_eq!(kept, 2, "three origins, two kept");
        let first = Target::parse(&urls[0]).unwrap().origin;
        assert!(
            !idle.by_origin.contains_key(&first),
            "the longest idle went"
        );
    }

    #[tokio::test]
    async fn an_answer_with_eighty_headers_is_an_answer() {
        let mut answer = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..80 {
            answer.push_str(&format!("x-h{i}: {i}\r\n"));
        }
        answer.push_str("content-length: 0\r\n\r\n");
        let answer: &'static str = Box::leak(answer.into_boxed_str());
        let (seen, connections, _) = statuses(vec![answer], 2, Duration::ZERO).await;
        assert_eq!(seen, [200, 200]);
        assert_eq!(connections, 1);
    }

    #[tokio::test]
    async fn heads_past_the_header_count_or_the_size_limit_fail_the_request() {
        let mut many = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..=MAX_HEADERS {
            many.push_str(&format!("x{i}: y\r\n"));
        }
        many.push_str("content-length: 0\r\n\r\n");
        let big = format!(
            "HTTP/1.1 200 OK\r\nx-pad: {}\r\ncontent-length: 0\r\n\r\n",
            "a".repeat(HEAD_LIMIT)
        );
        for answer in [many, big] {
            let answer: &'static str = Box::leak(answer.into_boxed_str());
            let (url, _, _) = receiver(vec![answer], 64 * 1024).await;
            let got = post(&client(), &url).await;
            assert!(matches!(got, Err(Failure::Failed(_))), "{}", &answer[..40]);
        }
    }

    #[tokio::test]
    async fn a_promised_body_that_never_comes_costs_the_connection_not_the_timeout() {
        let (url, connections, _) = receiver(
            vec!["HTTP/1.1 200 OK\r\ncontent-length: 65536\r\n\r\n"],
            1024,
        )
        .await;
        let client = HttpClient::new(
            Duration::from_secs(30),
            Duration::from_secs(5),
            vec![Cidr::parse("127.0.0.0/8").unwrap()],
        )
        .unwrap();
        let started = Instant::now();
        assert_eq!(post(&client, &url).await.unwrap().status, 200);
        // Bounded by DRAIN_FOR, far inside the 30 s request timeout.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(post(&client, &url).await.unwrap().status, 200);
        assert_eq!(
            connections.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the half-read connection is dropped"
        );
    }

    #[tokio::test]
    async fn two_different_lengths_fail_the_request() {
        let (url, _, _) = receiver(
            vec!["HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc"],
            1024,
        )
        .await;
        assert!(matches!(
            post(&client(), &url).await,
            Err(Failure::Failed(_))
        ));
        let (url, _, _) = receiver(
            vec!["HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc"],
            1024,
        )
        .await;
        assert_eq!(
            post(&client(), &url).await.unwrap().status,
            200,
            "equal lengths are one"
        );
    }

    #[tokio::test]
    async fn heads_read_in_pieces_after_an_informational_answer_are_parsed() {
        let (url, _, _) = receiver(
            vec!["HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"],
            3,
        )
        .await;
        let a = post(&client(), &url).await.unwrap();
        assert_eq!(
            a,
            Answer {
                status: 503,
                retry_after: Some("7".into()),
                body: Vec::new(),
            }
        );
    }

    /// The start of each answer's body is kept, up to the limit, whatever
    /// its framing: a length, chunks (de-chunked), or the connection's end
    /// (what came before the drain's time ran out); with no limit, none.
    #[tokio::test]
    async fn answer_bodies_are_kept_up_to_the_limit() {
        let (url, _, _) = receiver(
            vec![
                "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world",
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n",
                "HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nbusy",
                "HTTP/1.0 200 OK\r\n\r\nbye",
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                "HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
            ],
            3,
        )
        .await;
        let keeping = client().keeping_bodies(8);
        let mut kept = Vec::new();
        for _ in 0..6 {
            let a = post(&keeping, &url).await.unwrap();
            kept.push((a.status, String::from_utf8(a.body).unwrap()));
        }
        assert_eq!(
            kept,
            [
                (200, "hello wo".to_string()),
                (200, "helloabc".to_string()),
                (500, "busy".to_string()),
                (200, "bye".to_string()),
                (200, "ok".to_string()),
                (200, "hi".to_string()),
            ]
        );
        let (url, _, _) =
            receiver(vec!["HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"], 5).await;
        assert_eq!(post(&client(), &url).await.unwrap().body, b"");
        assert_eq!(dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", 4), b"abcd");
    }

    #[tokio::test]
    async fn chunked_answers_keep_the_connection_closing_ones_drop_it() {
        let (seen, connections, _) = statuses(
            vec![
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n",
                "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                "HTTP/1.0 202 Accepted\r\ncontent-length: 0\r\n\r\n",
                "HTTP/1.1 203 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            ],
            5,
            Duration::ZERO,
        )
        .await;
        assert_eq!(seen, [200, 201, 202, 203, 200]);
        // The chunked answer's connection carried the 201, which closed it;
        // the HTTP/1.0 and the gzip-coded answers closed theirs.
        assert_eq!(connections, 4);
    }

    #[tokio::test]
    async fn a_chunked_body_read_in_single_bytes_keeps_the_connection_bad_framing_drops_it() {
        use std::sync::atomic::Ordering;
        let good = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let (url, connections, _) = receiver(vec![good], 1).await;
        let client = client();
        for _ in 0..3 {
            assert_eq!(post(&client, &url).await.unwrap().status, 200);
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        let bad = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n";
        let (url, connections, _) = receiver(vec![bad], 1024).await;
        for _ in 0..2 {
            assert_eq!(
                post(&client, &url).await.unwrap().status,
                200,
                "the head counts"
            );
        }
        assert_eq!(
            connections.load(Ordering::SeqCst),
            2,
            "bad framing drops it"
        );
    }

    #[tokio::test]
    async fn an_early_answer_to_a_request_still_being_written_is_read() {
        // The receiver answers 413 after the head, stops reading and closes
        // while the client is still writing a body far larger than the
        // socket buffers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(
                b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            )
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        let body = vec![b'x'; 16 * 1024 * 1024];
        let answer = client()
            .post(&url, &[("webhook-id", "msg_1".into())], &body)
            .await;
        assert_eq!(answer.unwrap().status, 413);
    }

    #[test]
    fn chunked_end_finds_the_end_of_a_body_and_refuses_bad_framing() {
        let body = b"4\r\nWiki\r\n5 ; a=b\r\npedia\r\n0\r\nt: 1\r\n\r\n";
        assert_eq!(chunked_end(body), Ok(Some(body.len())));
        for cut in 0..body.len() {
            assert_eq!(chunked_end(&body[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(chunked_end(b"0\r\n\r\nextra"), Ok(Some(5)));
        assert_eq!(chunked_end(b"x\r\n"), Err(ChunkError));
        assert_eq!(chunked_end(b"\r\n"), Err(ChunkError));
        assert_eq!(chunked_end(b"3\r\nabcd\r\n"), Err(ChunkError));
        assert_eq!(chunked_end(b"fffffffff\r\n"), Err(ChunkError));
        assert_eq!(
            chunked_end(b"ffffff\r\n"),
            Err(ChunkError),
            "over the limit"
        );
    }

    proptest::proptest! {
        #[test]
        fn answer_parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = chunked_end(&bytes);
            let _ = parse_head(&bytes);
        }

        #[test]
        fn any_chunking_of_a_body_is_found_whole(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 1..300), 0..20),
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..50),
        ) {
            let mut body = Vec::new();
            for c in &chunks {
                body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                body.extend_from_slice(c);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n\r\n");
            let end = body.len();
            proptest::prop_assert_eq!(chunked_end(&body[..end - 1]), Ok(None));
            body.extend_from_slice(&tail);
            proptest::prop_assert_eq!(chunked_end(&body), Ok(Some(end)));
        }
    }

    #[tokio::test]
    async fn a_silent_address_does_not_hold_back_the_next_one() {
        let v6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let v4: SocketAddr = "192.0.2.1:443".parse().unwrap();
        let tried = Arc::new(Mutex::new(Vec::new()));
        let log = tried.clone();
        // The IPv6 address never answers; the IPv4 one connects.
        let connect = move |addr: SocketAddr| {
            log.lock().unwrap().push(addr);
            async move {
                if addr.is_ipv6() {
                    std::future::pending::<()>().await;
                }
                Ok::<SocketAddr, std::io::Error>(addr)
            }
        };
        let got = tokio::time::timeout(Duration::from_secs(5), connect_any(&[v6, v4], connect))
            .await
            .expect("one silent address held the connection back");
        assert_eq!(got, Some(v4));
        assert_eq!(*tried.lock().unwrap(), vec![v6, v4]);
        // Families alternate, the first address's family first.
        let (a, b, c) = (v6, v4, "[2001:db8::2]:443".parse().unwrap());
        assert_eq!(interleave(&[a, c, b]), vec![a, b, c]);
        // A failed attempt starts the next at once; all failing is None.
        let refuse = |_: SocketAddr| async {
            Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        };
        assert_eq!(connect_any(&[v4, v6], refuse).await, None);
    }

    #[tokio::test]
    async fn a_request_the_receiver_drops_on_a_reused_connection_goes_out_again() {
        // The receiver reads the second request on the kept connection and
        // closes it without an answer (as when its idle timeout fires just
        // then): the request is sent again on a new connection.
        let (seen, connections, requests) = statuses(
            vec![
                "HTTP/1.1 204 No Content\r\n\r\n",
                "|close|",
                "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            ],
            2,
            Duration::ZERO,
        )
        .await;
        assert_eq!(seen, [204, 202]);
        assert_eq!(requests, 3);
        assert_eq!(connections, 2);
    }

    #[tokio::test]
    async fn bytes_left_on_an_idle_connection_are_not_taken_for_the_next_answer() {
        // After its answer the receiver writes a stray head on the idle
        // connection: reusing it would report 418 for the next request.
        let (seen, connections, _) = statuses(
            vec![
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n|pause|HTTP/1.1 418 Teapot\r\ncontent-length: 0\r\n\r\n",
                "HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
            ],
            2,
            // Twenty times the receiver's pause before its stray head.
            Duration::from_millis(1000),
        )
        .await;
        assert_eq!(seen, [200, 201]);
        assert_eq!(connections, 2);
    }

    #[tokio::test]
    async fn an_answer_that_is_not_http_fails_the_request() {
        let (url, _, _) = receiver(vec!["SMTP ready\r\n\r\n"], 1024).await;
        assert_eq!(
            post(&client(), &url).await.unwrap_err(),
            Failure::Failed("request failed".into())
        );
    }

    #[tokio::test]
    async fn a_refused_destination_is_told_apart_from_a_failed_request() {
        let (url, connections, _) =
            receiver(vec!["HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"], 1024).await;
        let strict =
            HttpClient::new(Duration::from_secs(5), Duration::from_secs(5), Vec::new()).unwrap();
        match post(&strict, &url).await {
            Err(Failure::Refused(e)) => assert!(e.contains("CONTROLPLANE_ALLOWED_TARGETS"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(matches!(
            post(&strict, "ftp://example.com/").await,
            Err(Failure::Refused(_))
        ));
        assert!(matches!(
            post(&client(), "http://no-such-host.invalid/").await,
            Err(Failure::Failed(e)) if e.contains("cannot resolve")
        ));
        assert_eq!(post(&client(), &url).await.unwrap().status, 200);
    }

    #[test]
    fn control_characters_in_a_header_are_refused() {
        let t = Target::parse("http://example.com/").unwrap();
        let e = encode(&t, &[("webhook-id", "a\r\nx: y".into())], b"").unwrap_err();
        assert!(e.contains("webhook-id"), "{e}");
        let ok = encode(&t, &[("webhook-id", "msg_1".into())], b"{}").unwrap();
        let text = String::from_utf8(ok).unwrap();
        assert!(
            text.starts_with("POST / HTTP/1.1\r\nhost: example.com\r\n"),
            "{text}"
        );
        assert!(
            text.ends_with("content-length: 2\r\nwebhook-id: msg_1\r\n\r\n{}"),
            "{text}"
        );
    }
}
