//! Sends to message brokers (issue 59, ADR 0037): the same signed message
//! as a webhook, published to RabbitMQ, NATS JetStream or a Redis stream,
//! and delivered only once the broker has acknowledged it.
//!
//! One link per broker server (its URL without the query) is kept and
//! shared by every send to it: an AMQP connection with one confirming
//! channel, a NATS client's JetStream context, a Redis connection manager.
//! A link is made at the first send, through the same address rules as an
//! HTTP connection (`CONTROLPLANE_ALLOWED_TARGETS`), and dropped when a send
//! on it fails or times out, so the next send makes a new one. At most
//! [`MAX_LINKS`] are kept per transport.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use control_plane_core::Destination;

use crate::http::Failure;
use crate::ssrf::Cidr;

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "redis")]
mod redis;

/// Links kept per transport; past it they are all dropped and made anew.
const MAX_LINKS: usize = 256;

/// What is published: the webhook's headers (`webhook-id`,
/// `webhook-timestamp`, `webhook-signature`, `content-type`, `traceparent`
/// and the endpoint's own) and its body.
pub(crate) struct Message<'a> {
    /// The delivery id (`webhook-id`): AMQP's `message_id`, NATS's
    /// `Nats-Msg-Id`.
    pub id: &'a str,
    /// Header names (lower case) and values.
    pub headers: &'a [(&'a str, String)],
    /// The body, as an HTTP receiver would get it.
    pub body: &'a [u8],
}

/// The links of one transport, by server URL.
struct Links<T>(tokio::sync::Mutex<HashMap<String, T>>);

impl<T: Clone> Links<T> {
    fn new() -> Self {
        Links(tokio::sync::Mutex::new(HashMap::new()))
    }

    /// The link to `server`, made by `connect` when there is none.
    async fn get<F, Fut>(&self, server: &str, connect: F) -> Result<T, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut kept = self.0.lock().await;
        if let Some(link) = kept.get(server) {
            return Ok(link.clone());
        }
        let link = connect().await?;
        if kept.len() >= MAX_LINKS {
            kept.clear();
        }
        kept.insert(server.to_string(), link.clone());
        Ok(link)
    }

    /// Drops the link to `server`: the next send makes a new one.
    async fn forget(&self, server: &str) {
        self.0.lock().await.remove(server);
    }
}

/// The broker transports of one dispatcher.
pub(crate) struct Brokers {
    allowed: Vec<Cidr>,
    timeout: Duration,
    #[cfg(feature = "amqp")]
    amqp: Links<amqp::Link>,
    #[cfg(feature = "nats")]
    nats: Links<nats::Link>,
    #[cfg(feature = "redis")]
    redis: Links<redis::Link>,
}

impl Brokers {
    /// Transports that connect only to addresses `allowed` permits (as
    /// HTTP does) and give every send, connecting included, `timeout`.
    pub(crate) fn new(allowed: Vec<Cidr>, timeout: Duration) -> Self {
        Brokers {
            allowed,
            timeout,
            #[cfg(feature = "amqp")]
            amqp: Links::new(),
            #[cfg(feature = "nats")]
            nats: Links::new(),
            #[cfg(feature = "redis")]
            redis: Links::new(),
        }
    }

    /// Publishes `msg` to `dest` and waits for the broker's
    /// acknowledgement, at most the request timeout. A link that failed
    /// or timed out is dropped.
    ///
    /// # Errors
    /// [`Failure::Refused`] for a destination that may not be sent to (its
    /// addresses, or a transport this build leaves out); [`Failure::Failed`]
    /// with the broker's or the connection's error otherwise.
    pub(crate) async fn publish(
        &self,
        dest: &Destination,
        msg: &Message<'_>,
    ) -> Result<(), Failure> {
        let sent = tokio::time::timeout(self.timeout, self.publish_now(dest, msg)).await;
        let failed = match sent {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(Failure::Refused(why))) => return Err(Failure::Refused(why)),
            Ok(Err(Failure::Failed(e))) => e,
            Err(_) => format!("timed out after {:?} waiting for the broker", self.timeout),
        };
        self.forget(dest).await;
        Err(Failure::Failed(failed))
    }

    async fn publish_now(&self, dest: &Destination, msg: &Message<'_>) -> Result<(), Failure> {
        match dest {
            Destination::Http { .. } => Err(Failure::Refused(
                "an HTTP destination is not a broker".into(),
            )),
            #[cfg(feature = "amqp")]
            Destination::Amqp {
                server,
                exchange,
                routing_key,
            } => {
                let link = self
                    .amqp
                    .get(server, || async {
                        amqp::connect(&self.reachable(server).await?).await
                    })
                    .await?;
                amqp::publish(&link, exchange, routing_key, msg).await
            }
            #[cfg(feature = "nats")]
            Destination::Nats { server, subject } => {
                let link = self
                    .nats
                    .get(server, || async {
                        nats::connect(&self.reachable(server).await?, self.timeout).await
                    })
                    .await?;
                nats::publish(&link, subject, msg).await
            }
            #[cfg(feature = "redis")]
            Destination::Redis {
                server,
                stream,
                maxlen,
            } => {
                let link = self
                    .redis
                    .get(server, || async {
                        redis::connect(&self.reachable(server).await?, self.timeout).await
                    })
                    .await?;
                redis::publish(link, stream, *maxlen, msg).await
            }
            #[allow(unreachable_patterns)]
            other => Err(Failure::Refused(format!(
                "this build of the dispatcher has no {} transport (cargo feature {:?})",
                other.kind(),
                other.kind()
            ))),
        }
    }

    async fn forget(&self, dest: &Destination) {
        match dest {
            #[cfg(feature = "amqp")]
            Destination::Amqp { server, .. } => self.amqp.forget(server).await,
            #[cfg(feature = "nats")]
            Destination::Nats { server, .. } => self.nats.forget(server).await,
            #[cfg(feature = "redis")]
            Destination::Redis { server, .. } => self.redis.forget(server).await,
            _ => {}
        }
    }

    /// The URL to connect to for `server`: its host checked against the
    /// address rules. Without TLS the URL names the checked address itself,
    /// so the address connected to is the one checked; with TLS the name
    /// stays (the certificate names it), and the client resolves it again.
    #[allow(dead_code)] // without any broker feature
    async fn reachable(&self, server: &str) -> Result<String, Failure> {
        let mut url = url::Url::parse(server)
            .map_err(|e| Failure::Refused(format!("the destination URL does not parse: {e}")))?;
        let tls = matches!(url.scheme(), "amqps" | "rediss");
        let port = url.port().unwrap_or(match url.scheme() {
            "amqp" => 5672,
            "amqps" => 5671,
            "nats" => 4222,
            _ => 6379,
        });
        let host = url
            .host_str()
            .ok_or_else(|| Failure::Refused("the destination URL has no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let addrs = crate::http::resolve(&host, port, &self.allowed).await?;
        if !tls {
            if let Some(a) = addrs.first() {
                url.set_ip_host(a.ip()).map_err(|()| {
                    Failure::Refused("the destination URL takes no address".into())
                })?;
                url.set_port(Some(port))
                    .map_err(|()| Failure::Refused("the destination URL takes no port".into()))?;
            }
        }
        Ok(url.to_string())
    }
}
