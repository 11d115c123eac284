//! Destination checks: no requests to private, loopback or link-local
//! addresses unless an allowlist (`CONTROLPLANE_ALLOWED_TARGETS`) permits them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use control_plane_core::config::Cidr;

use crate::http::Failure;

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24.
        || (a == 192 && b == 0 && c == 0)
        // Benchmarking, 198.18.0.0/15.
        || (a == 198 && (b == 18 || b == 19))
        // Reserved for future use, 240.0.0.0/4.
        || a >= 240
}

/// The IPv4 address an IPv6 address carries to an IPv4 host, where it is
/// one of the forms that reach one: IPv4-mapped `::ffff:0:0/96`,
/// IPv4-compatible `::/96`, NAT64 `64:ff9b::/96` (RFC 6052) and 6to4
/// `2002::/16` (RFC 3056).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let last = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0, hi, lo] if !ip.is_loopback() && !ip.is_unspecified() => {
            Some(last(hi, lo))
        }
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(last(hi, lo)),
        [0x2002, hi, lo, ..] => Some(last(hi, lo)),
        _ => None,
    }
}

fn private_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return private_v4(v4);
    }
    let s = ip.segments();
    let first = s[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // Unique local fc00::/7, link-local fe80::/10, site-local fec0::/10.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        // Local-use NAT64 64:ff9b:1::/48 (RFC 8215): translates to any IPv4
        // address, private ones included.
        || (first == 0x64 && s[1] == 0xff9b && s[2] == 1)
        // Teredo 2001::/32: its IPv4 address is obfuscated.
        || (first == 0x2001 && s[1] == 0)
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
            // NAT64 to the metadata service, and the local-use NAT64 prefix.
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::10.0.0.1",
            "64:ff9b:1::1.1.1.1",
            // IPv4-compatible, 6to4 of a private address, site-local, multicast.
            "::127.0.0.1",
            "::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
            "fec0::1",
            "ff02::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "240.0.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
        ] {
            assert!(is_private(ip(p)), "{p}");
        }
        for p in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "198.20.0.1",
            "192.0.1.1",
        ] {
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
