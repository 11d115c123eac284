//! Destination checks: no requests to private, loopback or link-local
//! addresses unless an allowlist (`CONTROLPLANE_ALLOWED_TARGETS`) permits them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use control_plane_core::config::Cidr;

use crate::http::Failure;

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
}

fn private_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return private_v4(v4);
    }
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
}

/// Whether `ip` is private, loopback, link-local or unspecified (IPv4-mapped
/// IPv6 addresses are judged by their IPv4 address).
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => private_v6(v6),
    }
}

/// Whether a connection to `ip` is allowed.
fn permitted(ip: IpAddr, allowed: &[Cidr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    !is_private(ip) || allowed.iter().any(|c| c.contains(ip))
}

/// The addresses the HTTP client may connect to for `host` (a name, or an
/// IP literal without brackets): every address that [`is_private`] and the
/// allowlist refuse is dropped. Run at every connect and only there, so the
/// address connected to is the address checked, even when a name's answer
/// changes (DNS rebinding), and a request on a kept-alive connection costs
/// no lookup. A name that does not resolve now is a [`Failure::Failed`];
/// one with no permitted address a [`Failure::Refused`] naming
/// `CONTROLPLANE_ALLOWED_TARGETS`.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    allowed: &[Cidr],
) -> Result<Vec<std::net::SocketAddr>, Failure> {
    let found: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| Failure::Failed(format!("cannot resolve {host}")))?
        .filter(|a| permitted(a.ip(), allowed))
        .collect();
    if found.is_empty() {
        return Err(Failure::Refused(format!(
            "destination {host} is or resolves only to private, loopback or link-local addresses; \
             allow them with CONTROLPLANE_ALLOWED_TARGETS if they are meant to receive webhooks"
        )));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_ranges_are_recognised() {
        for p in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(ip(p)), "{p}");
        }
        for p in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(!is_private(ip(p)), "{p}");
        }
    }

    fn refused(r: Result<Vec<std::net::SocketAddr>, Failure>) -> String {
        match r {
            Err(Failure::Refused(e)) => e,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn private_destinations_are_refused_unless_allowed() {
        let loopback = Cidr::parse("127.0.0.0/8").unwrap();
        refused(resolve("127.0.0.1", 9, &[]).await);
        refused(resolve("::ffff:127.0.0.1", 9, &[]).await);
        refused(resolve("169.254.169.254", 80, &[loopback]).await);
        let e = refused(resolve("10.0.0.1", 80, &[]).await);
        assert!(e.contains("CONTROLPLANE_ALLOWED_TARGETS"), "{e}");
        assert_eq!(
            resolve("127.0.0.1", 9, &[loopback]).await.unwrap(),
            ["127.0.0.1:9".parse().unwrap()]
        );
        assert!(resolve("::1", 9, &[Cidr::parse("::1/128").unwrap()])
            .await
            .is_ok());
        assert!(
            resolve("8.8.8.8", 80, &[]).await.is_ok(),
            "public addresses are not checked further"
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_not_a_refusal() {
        let r = resolve("no-such-host.invalid", 80, &[]).await;
        assert!(matches!(r, Err(Failure::Failed(_))), "{r:?}");
    }

    #[tokio::test]
    async fn the_connecting_resolver_drops_private_answers() {
        let e = refused(resolve("localhost", 9, &[]).await);
        assert!(e.contains("CONTROLPLANE_ALLOWED_TARGETS"), "{e}");
        let allowed = [
            Cidr::parse("127.0.0.0/8").unwrap(),
            Cidr::parse("::1/128").unwrap(),
        ];
        let addrs = resolve("localhost", 9, &allowed).await.unwrap();
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 9));
    }
}
