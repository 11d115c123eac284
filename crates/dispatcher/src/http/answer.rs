//! Reading an answer: its head, and its body when the connection is to be
//! kept (drained up to a limit, or dropped).

use crate::http::{Answer, Pending, Rest, Stream, Unanswered, MAX_HEADERS, READ_BUFFER};
use tokio::io::AsyncReadExt;
use tokio_util::either::Either;

/// A parsed answer head.
pub(super) struct Head {
    pub(super) answer: Answer,
    /// How the body ends, when the connection can be reused after it.
    pub(super) body: Option<Framing>,
    /// The `content-length`, even of an answer that closes its connection.
    pub(super) length: Option<u64>,
    /// Whether the body is chunked, even in an answer that closes its
    /// connection.
    pub(super) chunked: bool,
}

/// How an answer's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Framing {
    /// After this many bytes.
    Length(u64),
    /// After its last (empty) chunk and trailers.
    Chunked,
}

/// The head at the start of `buf` and its length, `None` while it is
/// incomplete.
pub(super) fn parse_head(buf: &[u8]) -> Result<Option<(usize, Head)>, Unanswered> {
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

/// Reads the rest of a body, keeping its first `keep` bytes in `kept`
/// (which starts empty); the connection when it all came and nothing
/// followed it. A body that ends the connection's use is read only as far
/// as its first `keep` bytes.
pub(super) async fn drain(rest: Rest, keep: usize, kept: &mut Vec<u8>) -> Option<Stream> {
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
        Pending::Chunked(raw) => drain_chunked(stream, raw, keep, kept, true).await,
        Pending::UntilClose(raw, _, true) => drain_chunked(stream, raw, keep, kept, false).await,
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

/// Reads a chunked body whose start is in `raw`. While `reuse` holds it is
/// read to its end, so that the connection can carry the next request; a
/// body that grows past [`CHUNKED_LIMIT`] or breaks the framing ends that,
/// and from then on (or from the start, when the connection closes after
/// the answer anyway) the body is read only as far as its first `keep`
/// bytes of data, within [`CHUNKED_LIMIT`] bytes of framing and data. What
/// of its first `keep` bytes came is in `kept` after every read, so that a
/// drain cut short by its time still leaves them.
async fn drain_chunked(
    mut stream: Stream,
    mut raw: Vec<u8>,
    keep: usize,
    kept: &mut Vec<u8>,
    mut reuse: bool,
) -> Option<Stream> {
    loop {
        let (data, more) = dechunk(&raw, keep);
        *kept = data;
        if reuse {
            match chunked_end(&raw) {
                Ok(Some(end)) => return (end == raw.len()).then_some(stream),
                Ok(None) if raw.len() <= CHUNKED_LIMIT => {}
                _ => reuse = false,
            }
        }
        if !reuse && (!more || raw.len() > CHUNKED_LIMIT) {
            return None;
        }
        // One read may bring in far more than was asked for: each is bounded
        // so that no more than one byte past the limit is ever read.
        let room = (CHUNKED_LIMIT + 1).saturating_sub(raw.len());
        raw.reserve(room.min(4 * READ_BUFFER));
        let mut bounded = (&mut stream).take(u64::try_from(room).unwrap_or(u64::MAX));
        match bounded.read_buf(&mut raw).await {
            Ok(n) if n > 0 => {}
            _ => return None,
        }
    }
}

/// The data of the chunked body at the start of `raw`, its first `keep`
/// bytes, and whether more of those may still come: `raw` stops inside the
/// body before `keep` bytes of data, where the framing is still whole.
/// Framing that breaks, the last chunk, or `keep` bytes end it. Unlike
/// [`chunked_end`] it takes any chunk size, and the data of a chunk not
/// all read yet: it reads a body for its start, not for its end.
pub(super) fn dechunk(raw: &[u8], keep: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < keep {
        let Some(line_end) = raw
            .get(at..)
            .and_then(|rest| rest.windows(2).position(|w| w == b"\r\n"))
        else {
            return (out, true);
        };
        let line = &raw[at..at + line_end];
        let size_text = line.split(|b| *b == b';').next().unwrap_or_default();
        let Some(size) = std::str::from_utf8(size_text)
            .ok()
            .and_then(|t| usize::from_str_radix(t.trim(), 16).ok())
        else {
            return (out, false);
        };
        if size == 0 {
            return (out, false);
        }
        let start = at + line_end + 2;
        let end = start.saturating_add(size);
        let data = raw.get(start..end.min(raw.len())).unwrap_or_default();
        let room = keep - out.len();
        out.extend_from_slice(&data[..data.len().min(room)]);
        if end > raw.len() {
            let more = out.len() < keep;
            return (out, more);
        }
        // The chunk's closing CRLF is not checked: only its data is kept.
        at = end.saturating_add(2);
    }
    (out, false)
}

/// The most of a chunked body (framing included) read to reuse its
/// connection, or to keep its start.
pub(super) const CHUNKED_LIMIT: usize = 80 * 1024;

/// A chunked body that breaks the framing of RFC 9112 7.1.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ChunkError;

/// Where the chunked body at the start of `buf` ends (after its last chunk,
/// trailers and the final empty line), `None` while it is incomplete.
/// Chunk sizes over [`CHUNKED_LIMIT`] are refused rather than waited for.
pub(super) fn chunked_end(buf: &[u8]) -> Result<Option<usize>, ChunkError> {
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
pub(super) fn quiet(stream: &mut Stream) -> bool {
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
