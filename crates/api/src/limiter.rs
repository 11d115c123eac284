//! Failed token checks counted per client address: past the limit within a
//! window, the address's invalid tokens are answered `429`, and those that
//! cannot be an account key are not looked up (`auth::caller_limited`).
//! Tokens carry 244 random bits, so the limit is not what stops a guesser;
//! it keeps one client from filling the logs and the store with lookups, and
//! does so without locking anyone out: not other addresses, and not a valid
//! token from behind the same address (a proxy, a NAT).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

/// Clients remembered at once; past it, those with no failure in the window
/// are forgotten first, then the one whose last failure is oldest.
const MAX_ADDRESSES: usize = 10_000;

/// The client an address stands for: an IPv4 address, or an IPv6 address's
/// /64 (one host commonly holds a whole /64, and would otherwise count as
/// many clients).
fn client_of(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// Failures per client address over a sliding window.
pub struct FailureLimiter {
    limit: usize,
    window: Duration,
    by_address: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
}

impl FailureLimiter {
    /// At most `limit` failures per address within `window`.
    pub fn new(limit: usize, window: Duration) -> Self {
        FailureLimiter {
            limit,
            window,
            by_address: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(wait)` while `addr` has used up its failures.
    pub fn check(&self, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut map = self
            .by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(failures) = map.get_mut(&client_of(addr)) else {
            return Ok(());
        };
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            failures.pop_front();
        }
        match failures.front() {
            Some(oldest) if failures.len() >= self.limit => {
                Err(self.window.saturating_sub(now.duration_since(*oldest)))
            }
            _ => Ok(()),
        }
    }

    /// Counts a failure of `addr`.
    pub fn failed(&self, addr: IpAddr, now: Instant) {
        let addr = client_of(addr);
        let mut map = self
            .by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&addr) {
            let window = self.window;
            map.retain(|_, f| f.back().is_some_and(|t| now.duration_since(*t) < window));
            if map.len() >= MAX_ADDRESSES {
                let stalest = map
                    .iter()
                    .min_by_key(|(_, f)| f.back().copied())
                    .map(|(a, _)| *a);
                if let Some(a) = stalest {
                    map.remove(&a);
                }
            }
        }
        let failures = map.entry(addr).or_default();
        failures.push_back(now);
        if failures.len() > self.limit {
            failures.pop_front();
        }
    }
}

/// The client's address, as an extractor (never fails).
pub struct ClientAddr(pub IpAddr);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddr(client_address(parts)))
    }
}

/// The client's address, from the connection (`0.0.0.0` when the router
/// runs without one, as in tests that call it directly).
pub fn client_address(parts: &Parts) -> IpAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_address_is_limited_alone_and_only_within_the_window() {
        let l = FailureLimiter::new(3, Duration::from_secs(60));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(l.check(a, t0).is_ok(), "failure {i}");
            l.failed(a, t0 + Duration::from_secs(i));
        }
        let wait = l.check(a, t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(50));
        assert!(l.check(b, t0).is_ok(), "another address is not limited");
        assert!(
            l.check(a, t0 + Duration::from_secs(60)).is_ok(),
            "the oldest left the window"
        );
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client() {
        let l = FailureLimiter::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        l.failed("2001:db8:1:2::1".parse().unwrap(), t0);
        l.failed("2001:db8:1:2:ffff::9".parse().unwrap(), t0);
        assert!(l.check("2001:db8:1:2::77".parse().unwrap(), t0).is_err());
        assert!(l.check("2001:db8:1:3::1".parse().unwrap(), t0).is_ok());
        l.failed("::ffff:192.0.2.1".parse().unwrap(), t0);
        l.failed("192.0.2.1".parse().unwrap(), t0);
        assert!(
            l.check("192.0.2.1".parse().unwrap(), t0).is_err(),
            "an IPv4-mapped address is the same client"
        );
    }
}
