//! Egress through an HTTP proxy (`CONTROLPLANE_HTTP_PROXY`), for receivers
//! that allow only the sender's proxy addresses.
//!
//! The destination is resolved and checked here, as without a proxy
//! ([`super::resolve`]); the proxy is then asked with `CONNECT` for a
//! tunnel to the checked address (never to the name, which it could
//! resolve elsewhere), and TLS runs through the tunnel with the URL's name.
//! `http://` destinations are tunnelled the same way, so every connection
//! is checked once, when it is made, and kept per destination (ADR 0046).
//! Destinations matching `CONTROLPLANE_NO_PROXY` are connected directly.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ssrf::Cidr;

/// The longest head of a proxy's answer to `CONNECT`.
const HEAD_LIMIT: usize = 8 * 1024;

/// The proxy connections go through, and the destinations that bypass it.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    host: String,
    port: u16,
    /// `Basic …` from the proxy URL's user and password; never shown.
    authorization: Option<String>,
    bypass: Vec<Bypass>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("credentials", &self.authorization.as_ref().map(|_| "***"))
            .field("bypass", &self.bypass)
            .finish()
    }
}

/// One entry of `CONTROLPLANE_NO_PROXY`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bypass {
    /// `*`: no destination goes through the proxy.
    All,
    /// A name and every name under it (`example.com` matches
    /// `hooks.example.com`; a leading dot is the same).
    Domain(String),
    /// An address or a network, matching destinations written as an
    /// address in their URL.
    Network(Cidr),
}

impl Proxy {
    /// The proxy of `url` (`http://[user:password@]host:port`), bypassed
    /// for the comma-separated entries of `no_proxy`: `*`, names (with
    /// every name under them) and addresses or networks (`10.0.0.0/8`).
    ///
    /// # Errors
    /// A message naming what is wrong, without the password.
    pub fn parse(url: &str, no_proxy: Option<&str>) -> Result<Proxy, String> {
        let parsed = url::Url::parse(url).map_err(|_| {
            "must be a URL such as http://proxy.internal:3128 (or http://user:password@host:port)"
                .to_string()
        })?;
        if parsed.scheme() != "http" {
            return Err(format!(
                "must be an http:// URL (the connection to the proxy is plain TCP; TLS to the \
                 destination runs through its tunnel), got {}://",
                parsed.scheme()
            ));
        }
        if parsed.path() != "/" && !parsed.path().is_empty()
            || parsed.query().is_some()
            || parsed.fragment().is_some()
        {
            return Err("must be only scheme, credentials, host and port".into());
        }
        let host = parsed.host_str().ok_or("names no host")?;
        let port = parsed.port_or_known_default().ok_or("names no port")?;
        let authorization = super::basic_authorization(&parsed);
        let bypass = no_proxy
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(Bypass::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Proxy {
            host: host.trim_start_matches('[').trim_end_matches(']').into(),
            port,
            authorization,
            bypass,
        })
    }

    /// Whether connections to `host` (a name, or an address without
    /// brackets) go through the proxy.
    pub(crate) fn carries(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let ip: Option<IpAddr> = host.parse().ok();
        !self.bypass.iter().any(|b| match b {
            Bypass::All => true,
            Bypass::Domain(d) => {
                host == *d
                    || host
                        .strip_suffix(d.as_str())
                        .is_some_and(|h| h.ends_with('.'))
            }
            Bypass::Network(net) => ip.is_some_and(|ip| net.contains(ip)),
        })
    }

    /// A TCP connection to the proxy, tunnelled with `CONNECT` to `to`
    /// (an address the rules let through).
    ///
    /// # Errors
    /// When the proxy cannot be reached or does not open the tunnel (its
    /// status is in the message, and a refusal of the credentials is
    /// named as one).
    pub(crate) async fn tunnel(self: Arc<Self>, to: SocketAddr) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| other(format!("cannot reach the proxy: {e}")))?;
        let mut head = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n");
        if let Some(auth) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        let status = read_status(&mut stream).await?;
        if !(200..300).contains(&status) {
            return Err(other(format!(
                "the proxy answered CONNECT with {status}{}",
                // 407 is the standard answer; tinyproxy answers 401.
                if status == 407 || status == 401 {
                    " (proxy credentials refused)"
                } else {
                    ""
                }
            )));
        }
        Ok(stream)
    }
}

impl Bypass {
    fn parse(entry: &str) -> Result<Bypass, String> {
        if entry == "*" {
            return Ok(Bypass::All);
        }
        if let Some(net) = Cidr::parse(entry.trim_start_matches('[').trim_end_matches(']')) {
            return Ok(Bypass::Network(net));
        }
        let name = entry.trim_start_matches('.').trim_end_matches('.');
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !valid {
            return Err(format!(
                "CONTROLPLANE_NO_PROXY: {entry:?} is neither *, a name, an address nor a network \
                 (ports are not matched)"
            ));
        }
        Ok(Bypass::Domain(name.to_ascii_lowercase()))
    }
}

fn other(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// Reads the head of the proxy's answer (nothing past it: the tunnel's
/// bytes are the destination's) and returns its status.
async fn read_status(stream: &mut TcpStream) -> std::io::Result<u16> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= HEAD_LIMIT {
            return Err(other("the proxy's answer to CONNECT is too long".into()));
        }
        if stream.read(&mut byte).await? == 0 {
            return Err(other(
                "the proxy closed the connection during CONNECT".into(),
            ));
        }
        head.push(byte[0]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    let mut parts = text.split_whitespace();
    match (parts.next(), parts.next().and_then(|s| s.parse().ok())) {
        (Some(v), Some(status)) if v.starts_with("HTTP/1.") => Ok(status),
        _ => Err(other(
            "the proxy's answer to CONNECT is not HTTP/1.x".into(),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_url_is_checked_and_its_password_never_shown() {
        let p = Proxy::parse("http://u:s%40cret@proxy.internal:3128", None).unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.internal", 3128));
        assert_eq!(p.authorization.as_deref(), Some("Basic dTpzQGNyZXQ="));
        assert!(!format!("{p:?}").contains("cret"), "{p:?}");
        assert_eq!(Proxy::parse("http://[::1]:8080", None).unwrap().host, "::1");
        for bad in [
            "proxy:3128",
            "https://proxy:3128",
            "socks5://proxy:1080",
            "http://proxy:3128/path",
            "http://proxy:3128?x=1",
        ] {
            assert!(Proxy::parse(bad, None).is_err(), "{bad}");
        }
        let e = Proxy::parse("https://u:hidden@proxy:3128", None).unwrap_err();
        assert!(!e.contains("hidden"), "{e}");
    }

    #[test]
    fn no_proxy_matches_names_under_it_addresses_and_networks() {
        let p = Proxy::parse(
            "http://proxy:3128",
            Some(" example.com, .internal,10.0.0.0/8, 192.0.2.7 ,::1"),
        )
        .unwrap();
        for direct in [
            "example.com",
            "hooks.example.com",
            "EXAMPLE.com.",
            "db.internal",
            "10.1.2.3",
            "192.0.2.7",
            "::1",
        ] {
            assert!(!p.carries(direct), "{direct} should bypass the proxy");
        }
        for proxied in [
            "notexample.com",
            "example.org",
            "192.0.2.8",
            "internal.evil",
            "11.0.0.1",
        ] {
            assert!(p.carries(proxied), "{proxied} should go through the proxy");
        }
        assert!(!Proxy::parse("http://p:1", Some("*"))
            .unwrap()
            .carries("any.where"));
        assert!(Proxy::parse("http://p:1", None)
            .unwrap()
            .carries("any.where"));
        let e = Proxy::parse("http://p:1", Some("example.com:443")).unwrap_err();
        assert!(e.contains("ports are not matched"), "{e}");
        assert!(Proxy::parse("http://p:1", Some("10.0.0.0/99")).is_err());
    }

    #[tokio::test]
    async fn a_tunnel_is_asked_for_the_checked_address_with_credentials() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = tokio::spawn(async move {
            let mut answers = Vec::new();
            for status in [
                "200 Connection established",
                "407 Proxy Authentication Required",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                answers.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                s.write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
            }
            answers
        });
        let p = Arc::new(Proxy::parse(&format!("http://u:p@127.0.0.1:{port}"), None).unwrap());
        let to: SocketAddr = "192.0.2.10:443".parse().unwrap();
        p.clone().tunnel(to).await.unwrap();
        let refused = p.tunnel(to).await.unwrap_err().to_string();
        assert!(refused.contains("407"), "{refused}");
        let heads = seen.await.unwrap();
        assert!(
            heads[0].starts_with("CONNECT 192.0.2.10:443 HTTP/1.1\r\n"),
            "{}",
            heads[0]
        );
        assert!(
            heads[0].contains("Proxy-Authorization: Basic dTpw\r\n"),
            "{}",
            heads[0]
        );
    }
}
