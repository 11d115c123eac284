//! AMQP 0.9.1 (RabbitMQ) through lapin: a persistent, mandatory publish on
//! a channel in confirm mode. The broker's ack delivers; a nack, or a
//! return because no queue is bound to the routing key, fails the attempt.

use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::Message;
use crate::http::Failure;

/// A connection and its confirming channel; the channel's handle keeps the
/// connection open.
pub(super) type Link = Arc<(Connection, Channel)>;

fn failed(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::Failed(format!("amqp: {what}: {e}"))
}

fn short(what: &str, s: &str) -> Result<ShortString, Failure> {
    ShortString::try_new(s.to_string())
        .map_err(|_| Failure::Refused(format!("amqp: {what} is longer than 255 bytes")))
}

/// Connects to `url` and opens a channel in confirm mode.
pub(super) async fn connect(url: &str) -> Result<Link, Failure> {
    let props =
        ConnectionProperties::default().with_connection_name(LongString::from("control-plane"));
    let conn = Connection::connect(url, props)
        .await
        .map_err(|e| failed("cannot connect", e))?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| failed("cannot open a channel", e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| failed("cannot enable publisher confirms", e))?;
    Ok(Arc::new((conn, channel)))
}

/// Publishes `msg` to `exchange` with `routing_key` and waits for the
/// broker's confirmation.
pub(super) async fn publish(
    link: &Link,
    exchange: &str,
    routing_key: &str,
    msg: &Message<'_>,
) -> Result<(), Failure> {
    let channel = &link.1;
    if !channel.status().connected() {
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
