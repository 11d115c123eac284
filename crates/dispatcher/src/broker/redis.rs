//! Redis streams through redis-rs: `XADD key MAXLEN ~ n * …`, delivered
//! once Redis answers with the entry's id. The entry's fields are the
//! headers by name, then `body`; a custom header named `body` is left out.

use std::net::SocketAddr;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::io::AsyncDNSResolver;
use redis::{AsyncConnectionConfig, RedisFuture};

use super::Message;
use crate::http::Failure;

/// A multiplexed connection (cheap to clone). It does not reconnect: a
/// send that fails on it drops it, and the next send connects again,
/// through the address rules.
pub(super) type Link = MultiplexedConnection;

/// Resolves every name to the addresses the address rules checked, so the
/// connection (for `rediss`, with the URL's name kept for the certificate)
/// goes to a checked address and not to what the name resolves to a moment
/// later.
struct Checked(Vec<SocketAddr>);

impl AsyncDNSResolver for Checked {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        _host: &'b str,
        _port: u16,
    ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        let addrs: Box<dyn Iterator<Item = SocketAddr> + Send + 'a> =
            Box::new(self.0.clone().into_iter());
        Box::pin(async move { Ok(addrs) })
    }
}

/// Connects to `url` (its credentials, database and TLS) at `addrs`,
/// waiting at most `timeout` to connect and for each answer.
pub(super) async fn connect(
    url: &str,
    addrs: Vec<SocketAddr>,
    timeout: Duration,
) -> Result<Link, Failure> {
    let client = redis::Client::open(url)
        .map_err(|e| Failure::Refused(format!("redis: the destination URL: {e}")))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_dns_resolver(Checked(addrs));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| Failure::Failed(format!("redis: cannot connect: {e}")))
}

/// Appends `msg` to `stream`, trimming it to about `maxlen` entries.
pub(super) async fn publish(
    mut link: Link,
    stream: &str,
    maxlen: u64,
    msg: &Message<'_>,
) -> Result<(), Failure> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("MAXLEN").arg("~").arg(maxlen).arg("*");
    for (name, value) in msg.headers {
        if *name != "body" {
            cmd.arg(*name).arg(value.as_str());
        }
    }
    cmd.arg("body").arg(msg.body);
    let id: String = cmd
        .query_async(&mut link)
        .await
        .map_err(|e| Failure::Failed(format!("redis: XADD to {stream:?}: {e}")))?;
    tracing::debug!(stream, id, "appended");
    Ok(())
}
