//! The resolver the client connects through: every address the
//! private-address rules ([`crate::ssrf`], pure) refuse is dropped, at each
//! new connection.

use super::Failure;
use crate::ssrf::{permitted, Cidr};

/// The addresses the HTTP client may connect to for `host` (a name, or an
/// IP literal without brackets): every address that [`crate::ssrf::is_private`] and the
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
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

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
