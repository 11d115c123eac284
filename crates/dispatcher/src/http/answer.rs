//! Reading an answer: its head, and its body when the connection is to be
//! kept (drained up to a limit, or dropped).

use super::*;

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

/// Reads the rest of a body, keeping its first `keep` bytes in `kept`; the
/// connection when it all came and nothing followed it.
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
pub(super) fn dechunk(raw: &[u8], keep: usize) -> Vec<u8> {
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
