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
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use control_plane_core::config::Cidr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::either::Either;

/// What the answer's head is first read into; it grows only while a head
/// does not fit, up to [`HEAD_LIMIT`].
const READ_BUFFER: usize = 512;
/// The longest answer head accepted.
const HEAD_LIMIT: usize = 64 * 1024;
/// Headers parsed in an answer head at most.
const MAX_HEADERS: usize = 64;
/// An answer's body is read and dropped (so that its connection can carry
/// the next request) up to this size; a longer one closes the connection.
const BODY_LIMIT: u64 = 64 * 1024;
/// Idle connections kept per origin.
const IDLE_PER_ORIGIN: usize = 256;
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
#[derive(Debug, PartialEq, Eq)]
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

/// After an answer's head: the connection and the body bytes still to read,
/// when the connection can carry another request.
struct Rest {
    stream: Stream,
    body_left: u64,
}

/// One client per dispatcher, shared by its sends.
pub(crate) struct HttpClient {
    tls: tokio_rustls::TlsConnector,
    allowed: Arc<Vec<Cidr>>,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Mutex<HashMap<Origin, Vec<(Stream, Instant)>>>,
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
        })
    }

    /// POSTs `body` with `headers` to `url` and returns the answer, or the
    /// failure in words without the URL (it may carry credentials). The
    /// destination's addresses are checked when a connection is made
    /// ([`crate::ssrf::resolve`]); a kept-alive one was checked then.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
        body: &[u8],
    ) -> Result<Answer, Failure> {
        let target = Target::parse(url).map_err(Failure::Refused)?;
        let request = encode(&target, headers, body)?;
        let started = Instant::now();
        let (answer, rest) = tokio::time::timeout(self.timeout, self.exchange(&target, &request))
            .await
            .map_err(|_| "timed out".to_string())??;
        // Read the body so the connection can carry the next request; a
        // receiver that answered has answered, whatever its body does.
        if let Some(rest) = rest {
            let left = self.timeout.saturating_sub(started.elapsed());
            if let Ok(Some(stream)) = tokio::time::timeout(left, drain(rest)).await {
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
        let addrs = crate::ssrf::resolve(&origin.host, origin.port, &self.allowed).await?;
        let tcp = tokio::time::timeout(self.connect_timeout, connect_any(&addrs))
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

    /// An idle connection to `origin` kept less than [`IDLE_FOR`] and
    /// still quiet (see [`quiet`]).
    fn idle(&self, origin: &Origin) -> Option<Stream> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.get_mut(origin)?;
        let mut found = None;
        while let Some((stream, since)) = list.pop() {
            if since.elapsed() < IDLE_FOR && quiet(&stream) {
                found = Some(stream);
                break;
            }
        }
        if list.is_empty() {
            idle.remove(origin);
        }
        found
    }

    /// Keeps `stream` for the next request to `origin`, dropping those
    /// idle too long.
    fn keep(&self, origin: Origin, stream: Stream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.entry(origin).or_default();
        list.retain(|(_, since)| since.elapsed() < IDLE_FOR);
        if list.len() < IDLE_PER_ORIGIN {
            list.push((stream, Instant::now()));
        }
    }
}

/// The request's bytes: request line, headers, `content-length`, body.
fn encode(
    target: &Target,
    headers: &[(&'static str, String)],
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let length = body.len().to_string();
    let fixed = [
        ("host", target.authority.as_str()),
        ("user-agent", USER_AGENT),
        ("content-length", length.as_str()),
    ];
    let auth = target
        .authorization
        .as_deref()
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
    stream
        .write_all(request)
        .await
        .map_err(|_| Unanswered::Silent)?;
    stream.flush().await.map_err(|_| Unanswered::Silent)?;
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
            buf.drain(..head_len);
            answered = true;
            if (100..200).contains(&head.answer.status) {
                continue;
            }
            let rest = head.body.and_then(|length| {
                let already = u64::try_from(buf.len()).unwrap_or(u64::MAX);
                (length <= BODY_LIMIT && already <= length).then(|| Rest {
                    stream,
                    body_left: length - already,
                })
            });
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
    /// The body's length when the connection can be reused after it.
    body: Option<u64>,
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
    let closes = response.version != Some(1)
        || value("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        || value("transfer-encoding").is_some();
    let length = if status == 204 || status == 304 {
        Some(0)
    } else {
        value("content-length").and_then(|v| v.parse::<u64>().ok())
    };
    let head = Head {
        answer: Answer {
            status,
            retry_after: value("retry-after").map(str::to_string),
        },
        body: if closes { None } else { length },
    };
    Ok(Some((len, head)))
}

/// Reads and drops the rest of a body; the connection when it all came.
async fn drain(mut rest: Rest) -> Option<Stream> {
    let mut scratch = [0u8; READ_BUFFER];
    while rest.body_left > 0 {
        let want = usize::try_from(rest.body_left).map_or(READ_BUFFER, |l| l.min(READ_BUFFER));
        match rest.stream.read(&mut scratch[..want]).await {
            Ok(n) if n > 0 => {
                rest.body_left -= u64::try_from(n).unwrap_or(u64::MAX).min(rest.body_left)
            }
            _ => return None,
        }
    }
    Some(rest.stream)
}

/// Whether an idle connection is open with nothing to read. A receiver
/// that closed it, or wrote to it unasked (a late answer, a TLS alert),
/// would otherwise have those bytes read as the answer to the next request.
fn quiet(stream: &Stream) -> bool {
    let tcp = match stream {
        Either::Left(tcp) => tcp,
        Either::Right(tls) => tls.get_ref().0,
    };
    let mut byte = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut byte);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    tcp.poll_peek(&mut cx, &mut buf).is_pending()
}

/// The first of `addrs` that accepts a TCP connection.
async fn connect_any(addrs: &[SocketAddr]) -> Option<TcpStream> {
    for addr in addrs {
        if let Ok(s) = TcpStream::connect(addr).await {
            return Some(s);
        }
    }
    None
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
                retry_after: Some("7".into())
            }
        );
    }

    #[tokio::test]
    async fn chunked_or_closing_answers_are_read_and_the_connection_dropped() {
        let (seen, connections, _) = statuses(
            vec![
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                "HTTP/1.0 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            ],
            3,
            Duration::ZERO,
        )
        .await;
        assert_eq!(seen, [200, 201, 202]);
        assert_eq!(connections, 3);
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
            Duration::from_millis(200),
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
