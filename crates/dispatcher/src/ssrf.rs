//! Destination checks: no requests to private, loopback or link-local
//! addresses unless an allowlist (`CONTROLPLANE_ALLOWED_TARGETS`) permits them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use control_plane_core::config::Cidr;

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

/// Refuses `url` when its host is, or resolves to, a private address that
/// `allowed` does not permit. The error says what to do.
///
/// # Errors
/// A message naming the address and `CONTROLPLANE_ALLOWED_TARGETS`.
pub async fn check_destination(url: &str, allowed: &[Cidr]) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|_| "the endpoint URL does not parse".to_string())?;
    let host = parsed.host_str().ok_or("the endpoint URL has no host")?;
    let port = parsed.port_or_known_default().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| format!("cannot resolve {host}"))?
            .map(|a| a.ip())
            .collect(),
    };
    for ip in addrs {
        if !permitted(ip, allowed) {
            return Err(format!(
                "destination {host} resolves to {ip}, a private, loopback or link-local address; \
                 allow it with CONTROLPLANE_ALLOWED_TARGETS if it is meant to receive webhooks"
            ));
        }
    }
    Ok(())
}

/// Whether a connection to `ip` is allowed.
fn permitted(ip: IpAddr, allowed: &[Cidr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    !is_private(ip) || allowed.iter().any(|c| c.contains(ip))
}

/// The addresses the HTTP client may connect to for `host`: every resolved
/// address that [`is_private`] and the allowlist refuse is dropped, so the
/// address connected to is the address checked, even when a name's answer
/// changes between [`check_destination`] and the connect (DNS rebinding).
///
/// # Errors
/// When `host` does not resolve, or resolves only to refused addresses (the
/// message names `CONTROLPLANE_ALLOWED_TARGETS`).
pub async fn resolve(
    host: &str,
    port: u16,
    allowed: &[Cidr],
) -> Result<Vec<std::net::SocketAddr>, String> {
    let found: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| format!("cannot resolve {host}"))?
        .filter(|a| permitted(a.ip(), allowed))
        .collect();
    if found.is_empty() {
        return Err(format!(
            "destination {host} resolves only to private, loopback or link-local addresses; \
             allow them with CONTROLPLANE_ALLOWED_TARGETS if they are meant to receive webhooks"
        ));
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

    #[tokio::test]
    async fn private_destinations_are_refused_unless_allowed() {
        let loopback = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(check_destination("http://127.0.0.1:9/x", &[])
            .await
            .is_err());
        assert!(check_destination("http://[::ffff:127.0.0.1]:9/x", &[])
            .await
            .is_err());
        assert!(
            check_destination("http://localhost:9/x", &[])
                .await
                .is_err(),
            "names are resolved first"
        );
        assert!(
            check_destination("http://169.254.169.254/latest", &[loopback])
                .await
                .is_err()
        );
        assert!(check_destination("http://127.0.0.1:9/x", &[loopback])
            .await
            .is_ok());
        assert!(
            check_destination("http://[::1]:9/x", &[Cidr::parse("::1/128").unwrap()])
                .await
                .is_ok()
        );
        let e = check_destination("http://10.0.0.1/x", &[])
            .await
            .unwrap_err();
        assert!(e.contains("CONTROLPLANE_ALLOWED_TARGETS"), "{e}");
        assert!(
            check_destination("http://8.8.8.8/x", &[]).await.is_ok(),
            "public addresses are not checked further"
        );
    }

    #[tokio::test]
    async fn the_connecting_resolver_drops_private_answers() {
        let e = resolve("localhost", 9, &[]).await.unwrap_err();
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
