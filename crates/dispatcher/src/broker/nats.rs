//! NATS JetStream through async-nats: a publish with headers, waiting for
//! the stream's ack. `Nats-Msg-Id` is the delivery id, so a resend within
//! the stream's duplicate window is acknowledged without being stored twice.

use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName};

use super::{Credentials, Message};
use crate::http::Failure;

/// A JetStream context on a connected client (cheap to clone).
pub(super) type Link = jetstream::Context;

/// Connects to `url` with `creds`; acknowledgements are awaited at most
/// `timeout`. (The client reads no credentials from a URL: they are given
/// here.) `url` names the address the address rules checked, and the client
/// connects there only: a server's `INFO connect_urls` (other servers of
/// its cluster, which whoever runs it chooses) are ignored, as the client
/// would otherwise reconnect to them unchecked, with the endpoint's
/// credentials and messages.
pub(super) async fn connect(
    url: &str,
    creds: Option<&Credentials>,
    timeout: Duration,
) -> Result<Link, Failure> {
    let options = async_nats::ConnectOptions::new()
        .name("control-plane")
        .ignore_discovered_servers()
        .connection_timeout(timeout);
    let options = match creds {
        None => options,
        Some(Credentials::Login { user, password }) => {
            options.user_and_password(user.clone(), password.clone())
        }
        Some(Credentials::Token(t)) => options.token(t.clone()),
    };
    let client = options
        .connect(url)
        .await
        .map_err(|e| Failure::Failed(format!("nats: cannot connect: {e}")))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client))
}

/// Publishes `msg` to `subject` and waits for the stream's ack.
pub(super) async fn publish(link: &Link, subject: &str, msg: &Message<'_>) -> Result<(), Failure> {
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg.id);
    for (name, value) in msg.headers {
        let name = HeaderName::from_str(name)
            .map_err(|e| Failure::Refused(format!("nats: header {name:?}: {e}")))?;
        headers.insert(name, value.as_str());
    }
    let body = bytes::Bytes::copy_from_slice(msg.body);
    let ack = link
        .publish_with_headers(subject.to_string(), headers, body)
        .await
        .map_err(|e| Failure::Failed(format!("nats: publish to {subject:?}: {e}")))?
        .await
        .map_err(|e| Failure::Failed(format!("nats: no ack for {subject:?}: {e}")))?;
    tracing::debug!(
        stream = ack.stream,
        sequence = ack.sequence,
        duplicate = ack.duplicate,
        "acknowledged"
    );
    Ok(())
}
