//! Sends to message brokers (issue 59, ADR 0037): the same signed message
//! as a webhook, published to RabbitMQ, NATS JetStream or a Redis stream,
//! and delivered only once the broker has acknowledged it.
//!
//! One link per broker server (its URL without the query) and credentials
//! is kept and shared by every send to it: an AMQP connection, a NATS
//! client's JetStream context, a Redis multiplexed connection. An AMQP
//! connection carries one confirming channel per endpoint, since a broker
//! closes a channel on an error (a missing exchange): one endpoint's mistake
//! then closes its own channel only, and no other endpoint's attempt fails
//! with, or shows, its error (DESIGN §3.11). A link is made at the first
//! send, through the same address rules as an HTTP connection
//! (`CONTROLPLANE_ALLOWED_TARGETS`), and dropped when a send on it fails or
//! times out, so the next send makes a new one. At most [`MAX_LINKS`] are
//! kept per transport, and [`MAX_CHANNELS`] AMQP channels.
//!
//! Every address a link connects to is one the rules checked: an AMQP or
//! Redis link connects only to the checked addresses, also for `amqps` and
//! `rediss` (the name stays for the certificate) and when lapin reconnects;
//! a NATS client is given the checked address and ignores the servers a
//! NATS server lists in `INFO connect_urls`, which it would otherwise
//! connect to, unchecked, when the connection drops.
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
use std::net::SocketAddr;
use std::time::Duration;

use control_plane_core::{Destination, EndpointId};

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

/// AMQP channels kept (one per endpoint, on the connections above); past it
/// they are all dropped and opened anew. A send still using a dropped
/// channel finishes on it. Well under RabbitMQ's 2047 channels per
/// connection, unless most endpoints share one server and login.
#[allow(dead_code)] // without the amqp feature
const MAX_CHANNELS: usize = 1024;

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
struct Links<T> {
    kept: std::sync::Mutex<HashMap<String, Cell<T>>>,
    /// How many are kept at most.
    max: usize,
}

impl<T: Clone> Links<T> {
    fn new(max: usize) -> Self {
        Links {
            kept: std::sync::Mutex::new(HashMap::new()),
            max,
        }
    }

    fn cell(&self, key: &str) -> Cell<T> {
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = kept.get(key) {
            return c.clone();
        }
        if kept.len() >= self.max {
            kept.clear();
        }
        let c = Cell::default();
        kept.insert(key.to_string(), c.clone());
        c
    }

    /// The link kept under `key`, made by `connect` when there is none (a
    /// failed `connect` leaves none, so the next send tries again).
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    async fn get<F, Fut>(&self, key: &str, connect: F) -> Result<T, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.cell(key).get_or_try_init(connect).await.cloned()
    }

    /// As [`Links::get`], but a kept link that `live` finds closed is
    /// dropped and made anew, so a send does not fail on a link that
    /// another send's error or a broker restart closed.
    #[cfg_attr(not(feature = "amqp"), allow(dead_code))]
    async fn get_live<F, Fut>(
        &self,
        key: &str,
        live: fn(&T) -> bool,
        connect: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let cell = self.cell(key);
        let cell = match cell.get() {
            Some(link) if !live(link) => {
                let mut kept = self
                    .kept
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Another send may have replaced it already: drop only this one.
                if kept
                    .get(key)
                    .is_some_and(|c| std::sync::Arc::ptr_eq(c, &cell))
                {
                    kept.remove(key);
                }
                drop(kept);
                self.cell(key)
            }
            _ => cell,
        };
        cell.get_or_try_init(connect).await.cloned()
    }

    /// Drops the link kept under `key` when `closed` says it is closed.
    #[allow(dead_code)] // without the amqp feature
    fn forget_if(&self, key: &str, closed: impl Fn(&T) -> bool) {
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.get(key).and_then(|c| c.get()).is_some_and(closed) {
            kept.remove(key);
        }
    }

    /// Drops the link kept under `key`: the next send makes a new one.
    fn forget(&self, key: &str) {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }
}

/// The broker transports of one dispatcher.
pub(crate) struct Brokers {
    allowed: Vec<Cidr>,
    timeout: Duration,
    /// AMQP connections, by server and credentials.
    #[cfg(feature = "amqp")]
    amqp: Links<amqp::Link>,
    /// Confirming channels on them, one per endpoint.
    #[cfg(feature = "amqp")]
    amqp_channels: Links<amqp::Channel>,
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
            amqp: Links::new(MAX_LINKS),
            #[cfg(feature = "amqp")]
            amqp_channels: Links::new(MAX_CHANNELS),
            #[cfg(feature = "nats")]
            nats: Links::new(MAX_LINKS),
            #[cfg(feature = "redis")]
            redis: Links::new(MAX_LINKS),
        }
    }

    /// Publishes `msg`, sent for `endpoint`, to `dest`, connecting with
    /// `creds`, and waits for the broker's acknowledgement, at most the
    /// request timeout. A link that failed or timed out is dropped.
    ///
    /// # Errors
    /// [`Failure::Refused`] for a destination that may not be sent to (its
    /// addresses, a reserved NATS subject, or a transport this build leaves
    /// out); [`Failure::Failed`] with the broker's or the connection's
    /// error otherwise.
    pub(crate) async fn publish(
        &self,
        dest: &Destination,
        creds: Option<&Credentials>,
        endpoint: EndpointId,
        msg: &Message<'_>,
    ) -> Result<(), Failure> {
        let key = format!("{}\n{}", dest.server(), Credentials::key(creds));
        let sent = tokio::time::timeout(
            self.timeout,
            self.publish_now(dest, &key, creds, endpoint, msg),
        )
        .await;
        let (failed, timed_out) = match sent {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(Failure::Refused(why))) => return Err(Failure::Refused(why)),
            Ok(Err(Failure::Failed(e))) => (e, false),
            Err(_) => (
                format!("timed out after {:?} waiting for the broker", self.timeout),
                true,
            ),
        };
        self.forget(dest, &key, endpoint, timed_out);
        Err(Failure::Failed(failed))
    }

    #[allow(unused_variables)] // without the amqp feature
    async fn publish_now(
        &self,
        dest: &Destination,
        key: &str,
        creds: Option<&Credentials>,
        endpoint: EndpointId,
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
                let conn = self
                    .amqp
                    .get_live(key, amqp::is_open, || async {
                        let to = self.reachable(server).await?;
                        let url = Credentials::into_url(creds, &to.url)?;
                        amqp::connect(&url, to).await
                    })
                    .await?;
                let channel = self
                    .amqp_channels
                    .get_live(&amqp::channel_key(key, endpoint), amqp::is_usable, || {
                        amqp::open_channel(&conn)
                    })
                    .await?;
                amqp::publish(&channel, exchange, routing_key, msg).await
            }
            #[cfg(feature = "nats")]
            Destination::Nats { server, subject } => {
                // Checked again here, before any connection, for a URL
                // stored before the rule: a reserved subject is an API call.
                control_plane_core::check_nats_subject(subject)
                    .map_err(|e| Failure::Refused(format!("nats: {e}")))?;
                let link = self
                    .nats
                    .get(key, || async {
                        nats::connect(&self.reachable(server).await?.url, creds, self.timeout).await
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
                        let to = self.reachable(server).await?;
                        let url = Credentials::into_url(creds, &to.url)?;
                        redis::connect(&url, to.addrs, self.timeout).await
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

    /// Drops what a failed send used. For AMQP that is the endpoint's
    /// channel, and its connection only when that has closed or timed out:
    /// other endpoints' channels keep the old connection open while they
    /// use it, so dropping it here fails none of them.
    #[allow(unused_variables)] // without any broker feature
    fn forget(&self, dest: &Destination, key: &str, endpoint: EndpointId, timed_out: bool) {
        match dest {
            #[cfg(feature = "amqp")]
            Destination::Amqp { .. } => {
                self.amqp_channels.forget(&amqp::channel_key(key, endpoint));
                if timed_out {
                    self.amqp.forget(key);
                } else {
                    self.amqp.forget_if(key, |c| !amqp::is_open(c));
                }
            }
            #[cfg(feature = "nats")]
            Destination::Nats { .. } => self.nats.forget(key),
            #[cfg(feature = "redis")]
            Destination::Redis { .. } => self.redis.forget(key),
            _ => {}
        }
    }

    /// Where to connect for `server`: its host's addresses that the
    /// address rules permit, in `addrs`, and a URL to give the client.
    /// Without TLS the URL names the first checked address itself; with
    /// TLS it keeps the name, which the certificate must match, and the
    /// transport connects to `addrs` itself (AMQP and Redis; a NATS URL has
    /// no TLS scheme).
    #[allow(dead_code)] // without any broker feature
    async fn reachable(&self, server: &str) -> Result<Reachable, Failure> {
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
        Ok(Reachable {
            url: url.to_string(),
            host,
            addrs,
        })
    }
}

/// A broker server checked against the address rules
/// ([`Brokers::reachable`]).
#[allow(dead_code)] // without some broker features
struct Reachable {
    /// The URL to give the client.
    url: String,
    /// The host as the URL names it: the name a TLS certificate must match.
    host: String,
    /// The permitted addresses: the only ones to connect to.
    addrs: Vec<SocketAddr>,
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

    #[cfg(feature = "nats")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reserved_nats_subject_is_refused_before_anything_is_sent() {
        // A real stream holding one message: a publish to its purge API
        // must leave it there, whatever the stored URL says.
        let client = async_nats::connect("nats://127.0.0.1:4222")
            .await
            .expect("NATS on 127.0.0.1:4222");
        let js = async_nats::jetstream::new(client);
        let name = format!("CPRESERVED{}", uuid::Uuid::new_v4().simple());
        let subject = format!("{}.kept", name.to_lowercase());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
        js.publish(subject, "kept".into())
            .await
            .unwrap()
            .await
            .unwrap();

        let brokers = Brokers::new(
            vec![Cidr::parse("127.0.0.0/8").unwrap()],
            Duration::from_secs(3),
        );
        let dest = Destination::Nats {
            server: "nats://127.0.0.1:4222".into(),
            subject: format!("$JS.API.STREAM.PURGE.{name}"),
        };
        let msg = Message {
            id: "msg_reserved",
            headers: &[],
            body: b"{}",
        };
        let sent = brokers.publish(&dest, None, EndpointId::new(), &msg).await;
        let mut stream = js.get_stream(&name).await.unwrap();
        let left = stream.info().await.unwrap().state.messages;
        let _ = js.delete_stream(&name).await;
        assert_eq!(left, 1, "the stream was purged: {sent:?}");
        match sent {
            Err(Failure::Refused(why)) => assert!(why.contains("reserved"), "{why}"),
            other => panic!("not refused: {other:?}"),
        }
    }

    /// A listener that counts the connections it accepts and holds them.
    #[cfg(any(feature = "amqp", feature = "redis"))]
    async fn watched() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(sock);
            }
        });
        (addr, count)
    }

    /// What the address rules would give for `host`: only `addr`.
    #[cfg(any(feature = "amqp", feature = "redis"))]
    fn checked(url: &str, host: &str, addr: SocketAddr) -> Reachable {
        Reachable {
            url: url.into(),
            host: host.into(),
            addrs: vec![addr],
        }
    }

    #[cfg(feature = "amqp")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_amqps_connection_goes_to_the_checked_address_not_to_the_name() {
        // The name does not resolve: a client that resolves it again
        // (instead of dialing the checked address) never reaches the
        // listener. The TLS handshake with it then fails; that is fine.
        let (addr, accepted) = watched().await;
        let url = "amqps://broker.invalid:5671/%2f";
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            super::amqp::connect(url, checked(url, "broker.invalid", addr)),
        )
        .await;
        assert!(
            accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "the checked address was not connected to"
        );
    }

    #[cfg(feature = "redis")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rediss_connection_goes_to_the_checked_address_not_to_the_name() {
        let (addr, accepted) = watched().await;
        let url = "rediss://cache.invalid:6380/0";
        let _ = super::redis::connect(url, vec![addr], Duration::from_secs(2)).await;
        assert!(
            accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "the checked address was not connected to"
        );
    }
}
