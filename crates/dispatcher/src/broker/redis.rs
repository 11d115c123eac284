//! Redis streams through redis-rs: `XADD key MAXLEN ~ n * …`, delivered
//! once Redis answers with the entry's id. The entry's fields are the
//! headers by name, then `body`; a custom header named `body` is left out.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::Message;
use crate::http::Failure;

/// A connection manager (multiplexed, cheap to clone).
pub(super) type Link = ConnectionManager;

/// Connects to `url`, waiting at most `timeout` to connect and for each
/// answer.
pub(super) async fn connect(url: &str, timeout: Duration) -> Result<Link, Failure> {
    let client = redis::Client::open(url)
        .map_err(|e| Failure::Refused(format!("redis: the destination URL: {e}")))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1);
    client
        .get_connection_manager_with_config(config)
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
