//! `control-plane healthcheck`: asks the running service's `/readyz` on the
//! address of `CONTROLPLANE_LISTEN` and exits 0 when it answers 200, 1
//! otherwise. A container's `HEALTHCHECK` runs it, so the image needs no
//! HTTP client of its own. Plain blocking HTTP/1.1: one request, no runtime.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// How long the whole probe may take: connecting, then each read and write.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Where to ask: the listen address, with a wildcard (`0.0.0.0`, `[::]`)
/// replaced by the loopback address of its family.
pub fn probe_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// Asks `GET /readyz` at `addr`; `Ok` on a 200, otherwise what went wrong.
pub fn check(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let io = |e: std::io::Error| format!("no answer from {addr}: {e}");
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    // The status line is all that counts; it fits in the first read of any
    // real answer, and a longer one is read until its end of line.
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let status_line = text.lines().next().unwrap_or_default();
    match status_line.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        Some(code) => Err(format!("{addr}/readyz answered {code}: not ready")),
        None => Err(format!("{addr}/readyz gave no HTTP answer")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::TcpListener;

    use super::*;

    /// A one-shot server on a free loopback port that answers `answer`.
    fn serve_once(answer: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /readyz HTTP/1.1\r\n"));
            s.write_all(answer.as_bytes()).unwrap();
        });
        addr
    }

    #[test]
    fn ready_only_on_a_200() {
        let ok = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
        assert_eq!(check(ok, TIMEOUT), Ok(()));
        let down = serve_once("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
        let e = check(down, TIMEOUT).unwrap_err();
        assert!(e.contains("503"), "{e}");
        let garbage = serve_once("hello");
        assert!(check(garbage, TIMEOUT).is_err());
    }

    #[test]
    fn nothing_listening_is_not_ready() {
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = check(free, TIMEOUT).unwrap_err();
        assert!(e.contains("cannot connect"), "{e}");
    }

    #[test]
    fn a_wildcard_listen_address_is_asked_on_loopback() {
        let p = |s: &str| probe_address(s.parse().unwrap()).to_string();
        assert_eq!(p("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(p("[::]:9000"), "[::1]:9000");
        assert_eq!(p("10.1.2.3:8080"), "10.1.2.3:8080");
    }
}
