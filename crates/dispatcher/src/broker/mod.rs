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
//!
//! A broker's credentials come from the endpoint's `authorization` custom
//! header (sealed at rest and write-only, like every custom header):
//! `Basic` gives a user and password, `Bearer` a token (NATS's token, or a
//! Redis password). That header then authenticates the connection and is not
//! sent with the message.

// A build without any transport keeps the types and refuses every broker.
#![cfg_attr(
    not(any(feature = "amqp", feature = "nats", feature = "redis")),
    allow(dead_code, unused_variables)
)]

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
    #[cfg_attr(not(any(feature = "amqp", feature = "nats")), allow(dead_code))]
    pub id: &'a str,
    /// Header names (lower case) and values.
    pub headers: &'a [(&'a str, String)],
    /// The body, as an HTTP receiver would get it.
    pub body: &'a [u8],
}

/// How a connection to a broker authenticates, from the endpoint's
/// `authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// `Basic`: a user and a password.
    Login {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// `Bearer`: a token.
    Token(String),
}

impl Credentials {
    /// Reads an `authorization` header value: `Basic <base64 of
    /// user:password>` or `Bearer <token>`.
    ///
    /// # Errors
    /// [`Failure::Refused`] for any other form: retrying cannot help.
    pub(crate) fn from_authorization(value: &str) -> Result<Credentials, Failure> {
        use base64::Engine;
        let refused = || {
            Failure::Refused(
                "a broker's authorization header must be \"Basic <base64 of user:password>\" \
                 or \"Bearer <token>\""
                    .into(),
            )
        };
        let (scheme, rest) = value.trim().split_once(' ').ok_or_else(refused)?;
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
            return Ok(Credentials::Token(rest.to_string()));
        }
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(refused());
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(refused)?;
        let (user, password) = decoded.split_once(':').ok_or_else(refused)?;
        Ok(Credentials::Login {
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    /// What a link with these credentials is kept under, beside its
    /// server: links with other credentials are other links.
    fn key(creds: Option<&Credentials>) -> String {
        match creds {
            None => String::new(),
            Some(Credentials::Login { user, password }) => format!("login\n{user}\n{password}"),
            Some(Credentials::Token(t)) => format!("token\n{t}"),
        }
    }

    /// Puts these credentials in `url` as its user and password (a token
    /// as the password).
    #[allow(dead_code)] // without the amqp and redis features
    fn into_url(creds: Option<&Credentials>, url: &str) -> Result<String, Failure> {
        let Some(c) = creds else {
            return Ok(url.to_string());
        };
        let mut u = url::Url::parse(url)
            .map_err(|e| Failure::Refused(format!("the destination URL does not parse: {e}")))?;
        let (user, password) = match c {
            Credentials::Login { user, password } => (user.as_str(), password.as_str()),
            Credentials::Token(t) => ("", t.as_str()),
        };
        u.set_username(user)
            .and_then(|()| u.set_password(Some(password)))
            .map_err(|()| Failure::Refused("the destination URL takes no credentials".into()))?;
        Ok(u.to_string())
    }
}

/// One link, made once by whichever send needs it first.
type Cell<T> = std::sync::Arc<tokio::sync::OnceCell<T>>;

/// The links of one transport, by server URL and credentials. The map is
/// locked only to find or add a link's cell, never while connecting: a
/// broker that is slow to answer holds up the sends to it alone.
struct Links<T>(std::sync::Mutex<HashMap<String, Cell<T>>>);

impl<T: Clone> Links<T> {
    fn new() -> Self {
        Links(std::sync::Mutex::new(HashMap::new()))
    }

    fn cell(&self, key: &str) -> Cell<T> {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = kept.get(key) {
            return c.clone();
        }
        if kept.len() >= MAX_LINKS {
            kept.clear();
        }
        let c = Cell::default();
        kept.insert(key.to_string(), c.clone());
        c
    }

    /// The link kept under `key`, made by `connect` when there is none (a
    /// failed `connect` leaves none, so the next send tries again).
    async fn get<F, Fut>(&self, key: &str, connect: F) -> Result<T, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.cell(key).get_or_try_init(connect).await.cloned()
    }

    /// Drops the link kept under `key`: the next send makes a new one.
    fn forget(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
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

    /// Publishes `msg` to `dest`, connecting with `creds`, and waits for
    /// the broker's acknowledgement, at most the request timeout. A link
    /// that failed or timed out is dropped.
    ///
    /// # Errors
    /// [`Failure::Refused`] for a destination that may not be sent to (its
    /// addresses, or a transport this build leaves out); [`Failure::Failed`]
    /// with the broker's or the connection's error otherwise.
    pub(crate) async fn publish(
        &self,
        dest: &Destination,
        creds: Option<&Credentials>,
        msg: &Message<'_>,
    ) -> Result<(), Failure> {
        let key = format!("{}\n{}", dest.server(), Credentials::key(creds));
        let sent =
            tokio::time::timeout(self.timeout, self.publish_now(dest, &key, creds, msg)).await;
        let failed = match sent {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(Failure::Refused(why))) => return Err(Failure::Refused(why)),
            Ok(Err(Failure::Failed(e))) => e,
            Err(_) => format!("timed out after {:?} waiting for the broker", self.timeout),
        };
        self.forget(dest, &key);
        Err(Failure::Failed(failed))
    }

    async fn publish_now(
        &self,
        dest: &Destination,
        key: &str,
        creds: Option<&Credentials>,
        msg: &Message<'_>,
    ) -> Result<(), Failure> {
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
                    .get(key, || async {
                        let url = Credentials::into_url(creds, &self.reachable(server).await?)?;
                        amqp::connect(&url).await
                    })
                    .await?;
                amqp::publish(&link, exchange, routing_key, msg).await
            }
            #[cfg(feature = "nats")]
            Destination::Nats { server, subject } => {
                let link = self
                    .nats
                    .get(key, || async {
                        nats::connect(&self.reachable(server).await?, creds, self.timeout).await
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
                    .get(key, || async {
                        let url = Credentials::into_url(creds, &self.reachable(server).await?)?;
                        redis::connect(&url, self.timeout).await
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

    #[allow(unused_variables)] // without any broker feature
    fn forget(&self, dest: &Destination, key: &str) {
        match dest {
            #[cfg(feature = "amqp")]
            Destination::Amqp { .. } => self.amqp.forget(key),
            #[cfg(feature = "nats")]
            Destination::Nats { .. } => self.nats.forget(key),
            #[cfg(feature = "redis")]
            Destination::Redis { .. } => self.redis.forget(key),
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_read_from_basic_and_bearer_only() {
        assert!(
            Credentials::from_authorization("Basic dXNlcjpwOnc=").unwrap()
                == Credentials::Login {
                    user: "user".into(),
                    password: "p:w".into()
                }
        );
        assert!(
            Credentials::from_authorization("bearer t0k").unwrap()
                == Credentials::Token("t0k".into())
        );
        for bad in ["Basic !!", "Basic dXNlcg==", "Digest x", "Bearer", "token"] {
            assert!(
                matches!(
                    Credentials::from_authorization(bad),
                    Err(Failure::Refused(_))
                ),
                "{bad}"
            );
        }
        let url = Credentials::into_url(
            Some(&Credentials::Login {
                user: "u".into(),
                password: "p@ss".into(),
            }),
            "amqp://127.0.0.1:5672/%2f",
        )
        .unwrap();
        assert_eq!(url, "amqp://u:p%40ss@127.0.0.1:5672/%2f");
        let url = Credentials::into_url(
            Some(&Credentials::Token("t".into())),
            "redis://127.0.0.1:6379/0",
        )
        .unwrap();
        assert_eq!(url, "redis://:t@127.0.0.1:6379/0");
        assert_ne!(
            Credentials::key(None),
            Credentials::key(Some(&Credentials::Token("t".into())))
        );
    }
}
