//! Destination checks: no requests to private, loopback or link-local
//! addresses unless an allowlist (`CONTROLPLANE_ALLOWED_TARGETS`) permits them.
//! Pure rules over addresses; the HTTP client resolves names through them
//! at each connect (`http::resolve`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
        // Documentation, 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24.
        || (a == 192 && b == 0 && c == 2)
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        // Reserved for future use, 240.0.0.0/4.
        || a >= 240
}

/// The IPv4 address an IPv6 address carries to an IPv4 host, where it is
/// one of the forms that reach one: IPv4-mapped `::ffff:0:0/96`,
/// IPv4-compatible `::/96`, IPv4-translated (SIIT) `::ffff:0:0:0/96`
/// (RFC 2765), NAT64 `64:ff9b::/96` (RFC 6052) and 6to4 `2002::/16` (RFC 3056).
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
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(last(hi, lo)),
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
        // IETF protocol assignments 2001::/23, Teredo 2001::/32 among them
        // (its IPv4 address is obfuscated), and benchmarking 2001:2::/48.
        || (first == 0x2001 && s[1] < 0x0200)
        // Documentation 2001:db8::/32 and 3fff::/20.
        || (first == 0x2001 && s[1] == 0x0db8)
        || (first == 0x3fff && s[1] < 0x1000)
        // Discard-only 100::/64, and the dummy prefix 100:0:0:1::/64 (RFC 9780).
        || (first == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] <= 1)
        // Segment routing (SRv6) SIDs 5f00::/16.
        || first == 0x5f00
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
pub(crate) fn permitted(ip: IpAddr, allowed: &[Cidr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    !is_private(ip) || allowed.iter().any(|c| c.contains(ip))
}

/// An IP network, e.g. `127.0.0.0/8` or `::1/128` (a bare address is one host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr(ipnet::IpNet);

impl Cidr {
    /// Parses `addr/prefix` or a bare address.
    pub fn parse(s: &str) -> Option<Cidr> {
        let s = s.trim();
        match s.parse::<ipnet::IpNet>() {
            Ok(net) => Some(Cidr(net)),
            Err(_) => s.parse::<IpAddr>().ok().map(|a| Cidr(a.into())),
        }
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }
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

    /// Every entry of IANA's special-purpose address registries (IPv4 and
    /// IPv6, as of 2026), by its first and last address (or one inside for
    /// the large IPv6 blocks): refused unless the registry marks it
    /// globally reachable. Blocks whose reachability depends on the address
    /// they carry (IPv4-mapped, NAT64, 6to4) are judged by that address and
    /// checked in `private_ranges_are_recognised`. Where a block mixes both
    /// (192.0.0.0/24, 2001::/23), the whole block is refused: no webhook
    /// receiver lives there.
    #[test]
    fn every_special_purpose_block_that_is_not_globally_reachable_is_refused() {
        let refused_blocks: &[(&str, &[&str])] = &[
            ("0.0.0.0/8 this network", &["0.0.0.0", "0.255.255.255"]),
            ("10.0.0.0/8 private", &["10.0.0.0", "10.255.255.255"]),
            ("100.64.0.0/10 shared", &["100.64.0.0", "100.127.255.255"]),
            ("127.0.0.0/8 loopback", &["127.0.0.0", "127.255.255.255"]),
            (
                "169.254.0.0/16 link local",
                &["169.254.0.0", "169.254.255.255"],
            ),
            ("172.16.0.0/12 private", &["172.16.0.0", "172.31.255.255"]),
            (
                "192.0.0.0/24 IETF",
                &["192.0.0.0", "192.0.0.9", "192.0.0.255"],
            ),
            ("192.0.2.0/24 TEST-NET-1", &["192.0.2.0", "192.0.2.255"]),
            (
                "192.168.0.0/16 private",
                &["192.168.0.0", "192.168.255.255"],
            ),
            (
                "198.18.0.0/15 benchmarking",
                &["198.18.0.0", "198.19.255.255"],
            ),
            (
                "198.51.100.0/24 TEST-NET-2",
                &["198.51.100.0", "198.51.100.255"],
            ),
            (
                "203.0.113.0/24 TEST-NET-3",
                &["203.0.113.0", "203.0.113.255"],
            ),
            ("224.0.0.0/4 multicast", &["224.0.0.0", "239.255.255.255"]),
            ("240.0.0.0/4 reserved", &["240.0.0.0", "255.255.255.254"]),
            ("255.255.255.255/32 broadcast", &["255.255.255.255"]),
            ("::1/128 loopback", &["::1"]),
            ("::/128 unspecified", &["::"]),
            (
                "64:ff9b:1::/48 local-use NAT64",
                &["64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "100::/64 discard-only",
                &["100::", "100::ffff:ffff:ffff:ffff"],
            ),
            (
                "100:0:0:1::/64 dummy prefix",
                &["100:0:0:1::", "100:0:0:1:ffff:ffff:ffff:ffff"],
            ),
            (
                "::ffff:0:0:0/96 IPv4-translated (SIIT) of a private address",
                &["::ffff:0:a00:1", "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe"],
            ),
            (
                "2001::/23 IETF",
                &[
                    "2001::",
                    "2001:1::1",
                    "2001:3::1",
                    "2001:20::1",
                    "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
                ],
            ),
            (
                "2001:2::/48 benchmarking",
                &["2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "2001:db8::/32 documentation",
                &["2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "3fff::/20 documentation",
                &["3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "5f00::/16 SRv6 SIDs",
                &["5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "fc00::/7 unique local",
                &["fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "fe80::/10 link local",
                &["fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "fec0::/10 site local (deprecated)",
                &["fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
            (
                "ff00::/8 multicast",
                &["ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            ),
        ];
        for (block, addresses) in refused_blocks {
            for a in *addresses {
                assert!(is_private(ip(a)), "{a} of {block} is connected to");
            }
        }
        // Just outside those blocks, and globally reachable neighbours.
        for a in [
            "11.0.0.0",
            "100.128.0.0",
            "172.32.0.0",
            "192.0.3.0",
            "198.20.0.0",
            "198.51.101.0",
            "203.0.114.0",
            "223.255.255.255",
            "2001:200::1",
            "2001:db9::1",
            "3fff:1000::1",
            "2620:4f:8000::1",
            "2600::1",
        ] {
            assert!(!is_private(ip(a)), "{a} is refused but globally reachable");
        }
    }
}
