//! AMQP 0.9.1 (RabbitMQ) through lapin: a persistent, mandatory publish on
//! a channel in confirm mode. The broker's ack delivers; a nack, or a
//! return because no queue is bound to the routing key, fails the attempt.

use std::sync::Arc;

use control_plane_core::EndpointId;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::tcp::{AsyncTcpStream, TLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

use super::{Message, Reachable};
use crate::http::Failure;

/// A connection, shared by the endpoints on one server with one login.
pub(super) type Link = Arc<Connection>;

/// A channel in confirm mode, one per endpoint. It keeps its connection
/// open while it is kept, even after the connection's handle was dropped.
pub(super) type Channel = lapin::Channel;

fn failed(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::Failed(format!("amqp: {what}: {e}"))
}

fn short(what: &str, s: &str) -> Result<ShortString, Failure> {
    ShortString::try_new(s.to_string())
        .map_err(|_| Failure::Refused(format!("amqp: {what} is longer than 255 bytes")))
}

/// What an endpoint's channel is kept under: its connection's key and the
/// endpoint.
pub(super) fn channel_key(connection: &str, endpoint: EndpointId) -> String {
    format!("{connection}\n{endpoint}")
}

/// Whether a connection can still open channels.
pub(super) fn is_open(link: &Link) -> bool {
    link.status().connected()
}

/// Whether a channel can still publish (the broker closes one on an error,
/// such as a missing exchange).
pub(super) fn is_usable(channel: &Channel) -> bool {
    channel.status().connected()
}

/// Connects to `url` (its credentials and virtual host) at the addresses
/// `to` holds, and nowhere else: lapin would resolve the URL's host again,
/// at every connect and reconnect, so it is given a connector that dials
/// the checked addresses and, for `amqps`, starts TLS with the host's name
/// for the certificate.
pub(super) async fn connect(url: &str, to: Reachable) -> Result<Link, Failure> {
    let uri: AMQPUri = url
        .parse()
        .map_err(|e| Failure::Refused(format!("amqp: the destination URL: {e}")))?;
    let props =
        ConnectionProperties::default().with_connection_name(LongString::from("control-plane"));
    let runtime = lapin::runtime::default_runtime().map_err(|e| failed("no runtime", e))?;
    let Reachable { host, addrs, .. } = to;
    let conn = Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let stream = AsyncTcpStream::connect(&runtime, addrs.clone()).await?;
            Ok(match uri.scheme {
                AMQPScheme::AMQP => stream,
                AMQPScheme::AMQPS => stream.into_tls(&host, TLSConfig::default()).await?,
            })
        },
        props,
    )
    .await
    .map_err(|e| failed("cannot connect", e))?;
    Ok(Arc::new(conn))
}

/// Opens a channel in confirm mode on `conn`.
pub(super) async fn open_channel(conn: &Link) -> Result<Channel, Failure> {
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| failed("cannot open a channel", e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| failed("cannot enable publisher confirms", e))?;
    Ok(channel)
}

/// Publishes `msg` to `exchange` with `routing_key` and waits for the
/// broker's confirmation.
pub(super) async fn publish(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    msg: &Message<'_>,
) -> Result<(), Failure> {
    if !is_usable(channel) {
        return Err(failed("the channel is closed", "it will be opened again"));
    }
    let mut headers = FieldTable::default();
    for (name, value) in msg.headers {
        if *name != "content-type" {
            headers.insert(
                short("a header name", name)?,
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
    }
    let props = BasicProperties::default()
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2)
        .with_message_id(short("the message id", msg.id)?)
        .with_headers(headers);
    let confirm = channel
        .basic_publish(
            short("the exchange", exchange)?,
            short("the routing key", routing_key)?,
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            msg.body,
            props,
        )
        .await
        .map_err(|e| failed("publish", e))?
        .await
        .map_err(|e| failed("no confirmation", e))?;
    match confirm {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(Failure::Failed(format!(
            "amqp: returned unroutable ({} {}): no queue is bound to exchange {exchange:?} with routing key {routing_key:?}",
            returned.reply_code, returned.reply_text
        ))),
        Confirmation::Nack(_) => Err(Failure::Failed(
            "amqp: the broker refused the message (nack)".into(),
        )),
    }
}
