//! Where an endpoint's deliveries go (issue 59): an HTTP URL, or a message
//! broker named by a URL of its own scheme. The same subscription, signing,
//! retry and attempt log serve every kind; only the last step, the send and
//! what counts as its acknowledgement, differs (ADR 0037).
//!
//! - `http://`, `https://`: a `POST`; a 2xx answer delivers.
//! - `amqp://`, `amqps://host[:port][/vhost]?exchange=E&routing_key=K`: a
//!   persistent, mandatory publish on a channel with publisher confirms; the
//!   broker's ack delivers, a nack or a return (no queue bound) fails. The
//!   exchange may be empty (the default exchange, which routes by queue name).
//! - `nats://host[:port]?subject=S`: a JetStream publish; the stream's ack
//!   delivers. `Nats-Msg-Id` is the delivery id, so the stream's duplicate
//!   window drops a resend.
//! - `redis://`, `rediss://host[:port][/db]?stream=K[&maxlen=N]`: `XADD K
//!   MAXLEN ~ N`; the entry id in the answer delivers. `maxlen` defaults to
//!   [`DEFAULT_STREAM_MAXLEN`].
//!
//! Broker URLs follow the HTTP URL's rules: at most 2048 characters, no
//! spaces, and no credential in the clear (no user or password, no query
//! parameter named like one).

use crate::StoreError;

/// What a Redis stream keeps when a URL sets no `maxlen`: about this many
/// entries, trimmed approximately (`MAXLEN ~`).
pub const DEFAULT_STREAM_MAXLEN: u64 = 100_000;
/// The largest `maxlen` accepted.
pub const MAX_STREAM_MAXLEN: u64 = 100_000_000;
/// The longest exchange, routing key, subject or stream key, in bytes
/// (AMQP's short strings hold 255).
pub const MAX_NAME_BYTES: usize = 255;

/// An endpoint's destination, parsed from its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// An HTTP(S) receiver; the URL as given.
    Http {
        /// The URL.
        url: String,
    },
    /// An AMQP 0.9.1 exchange (RabbitMQ).
    Amqp {
        /// The connection URL: scheme, host, port and virtual host, without
        /// the query.
        server: String,
        /// The exchange; empty for the default exchange.
        exchange: String,
        /// The routing key.
        routing_key: String,
    },
    /// A NATS JetStream subject.
    Nats {
        /// The server URL, without the query.
        server: String,
        /// The subject published to; a stream must cover it.
        subject: String,
    },
    /// A Redis stream.
    Redis {
        /// The connection URL: scheme, host, port and database, without the
        /// query.
        server: String,
        /// The stream's key.
        stream: String,
        /// About how many entries the stream keeps (`XADD … MAXLEN ~`).
        maxlen: u64,
    },
}

impl Destination {
    /// The kind's name, as metrics, logs and the dashboard show it: `http`,
    /// `amqp`, `nats` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            Destination::Http { .. } => "http",
            Destination::Amqp { .. } => "amqp",
            Destination::Nats { .. } => "nats",
            Destination::Redis { .. } => "redis",
        }
    }

    /// The server's URL (for HTTP, the URL itself): what connections are
    /// pooled by.
    pub fn server(&self) -> &str {
        match self {
            Destination::Http { url } => url,
            Destination::Amqp { server, .. }
            | Destination::Nats { server, .. }
            | Destination::Redis { server, .. } => server,
        }
    }

    /// Parses and checks an endpoint's URL.
    ///
    /// # Errors
    /// `InvalidInput` saying what is wrong: an unknown scheme, no host, a
    /// credential in the clear, a missing or unknown broker parameter, or a
    /// name that is empty, too long or holds a space or control character.
    pub fn parse(url: &str) -> Result<Destination, StoreError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad_url(url))?;
        if rest.is_empty()
            || rest.starts_with(['/', '?', '#'])
            || url.len() > 2048
            || url.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(bad_url(url));
        }
        let (server, query) = match rest.split_once('?') {
            Some((s, q)) => (format!("{scheme}://{s}"), q),
            None => (url.to_string(), ""),
        };
        let http = matches!(scheme, "http" | "https");
        if !http && (query.contains('#') || server.contains('#')) {
            return Err(StoreError::InvalidInput(format!(
                "endpoint url must not have a fragment, got {url:?}"
            )));
        }
        // A broker URL's query holds only the parameters below, so only its
        // authority can carry a credential.
        let checked = if http {
            rest
        } else {
            rest.split('?').next().unwrap_or_default()
        };
        crate::endpoint::refuse_credentials_in(url, checked)?;
        match scheme {
            "http" | "https" => Ok(Destination::Http {
                url: url.to_string(),
            }),
            "amqp" | "amqps" => {
                let mut p = Params::parse(query, &["exchange", "routing_key"])?;
                Ok(Destination::Amqp {
                    server,
                    exchange: p.name("exchange", true)?,
                    routing_key: p.name("routing_key", false)?,
                })
            }
            "nats" => {
                let mut p = Params::parse(query, &["subject"])?;
                let subject = p.name("subject", false)?;
                check_nats_subject(&subject)?;
                Ok(Destination::Nats { server, subject })
            }
            "redis" | "rediss" => {
                check_redis_database(&server)?;
                let mut p = Params::parse(query, &["stream", "maxlen"])?;
                let stream = p.name("stream", false)?;
                let maxlen = match p.take("maxlen") {
                    None => DEFAULT_STREAM_MAXLEN,
                    Some(v) => v
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (1..=MAX_STREAM_MAXLEN).contains(n))
                        .ok_or_else(|| {
                            StoreError::InvalidInput(format!(
                                "maxlen must be a whole number from 1 to {MAX_STREAM_MAXLEN}, got {v:?}"
                            ))
                        })?,
                };
                Ok(Destination::Redis {
                    server,
                    stream,
                    maxlen,
                })
            }
            _ => Err(bad_url(url)),
        }
    }
}

/// Checks a NATS subject an endpoint publishes to: dot-separated tokens,
/// none empty, no wildcard (`*`, `>`: a publish names one subject), and not
/// in a reserved namespace. Subjects that start with `$` are the server's
/// own APIs (`$JS.API` manages JetStream streams, `$SYS` the server, `$KV`
/// and `$O` the key-value and object stores): a publish there would be an
/// API call made with the endpoint's login on every attempt, such as
/// `$JS.API.STREAM.PURGE.<stream>`, not a message. The dispatcher calls
/// this again before it publishes, for URLs stored before the rule.
///
/// # Errors
/// `InvalidInput` naming the subject and the rule it breaks.
pub fn check_nats_subject(subject: &str) -> Result<(), StoreError> {
    if subject.contains(['*', '>']) || subject.split('.').any(str::is_empty) {
        return Err(StoreError::InvalidInput(format!(
            "subject must be dot-separated tokens without wildcards (* or >), got {subject:?}"
        )));
    }
    if subject.starts_with('$') {
        return Err(StoreError::InvalidInput(format!(
            "subject must not start with \"$\": subjects such as $JS, $SYS, $KV and $O are the \
             NATS server's reserved API namespaces, not streams; got {subject:?}"
        )));
    }
    Ok(())
}

/// Checks a Redis URL's path (`server` is the URL without its query): none,
/// `/`, or `/<n>` for database number `n`, as Redis selects a database by
/// number only. Anything else would be accepted here and then fail every
/// attempt.
fn check_redis_database(server: &str) -> Result<(), StoreError> {
    let after_scheme = server.split_once("://").map_or(server, |(_, r)| r);
    let path = after_scheme.split_once('/').map_or("", |(_, p)| p);
    if path.is_empty() || (path.bytes().all(|b| b.is_ascii_digit()) && path.parse::<u32>().is_ok())
    {
        return Ok(());
    }
    Err(StoreError::InvalidInput(format!(
        "a redis URL's path must be empty or one database number (e.g. redis://cache:6379/0), \
         got \"/{path}\" in {server:?}"
    )))
}

fn bad_url(url: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "endpoint url must be an absolute http(s)://, amqp(s)://, nats:// or redis(s):// URL of at most \
         2048 characters without spaces or control characters, got {url:?}"
    ))
}

/// A broker URL's query: each known parameter at most once, decoded.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: &str, known: &[&str]) -> Result<Params, StoreError> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if !known.contains(&name.as_ref()) {
                return Err(StoreError::InvalidInput(format!(
                    "unknown parameter {name:?} in the destination URL; it takes {}",
                    known.join(", ")
                )));
            }
            if out.iter().any(|(n, _)| *n == name) {
                return Err(StoreError::InvalidInput(format!(
                    "parameter {name:?} is given twice in the destination URL"
                )));
            }
            out.push((name.into_owned(), value.into_owned()));
        }
        Ok(Params(out))
    }

    fn take(&mut self, name: &str) -> Option<String> {
        let at = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.swap_remove(at).1)
    }

    /// A required name: present, at most [`MAX_NAME_BYTES`], no space or
    /// control character; empty only when `may_be_empty`.
    fn name(&mut self, name: &str, may_be_empty: bool) -> Result<String, StoreError> {
        let v = self.take(name).ok_or_else(|| {
            StoreError::InvalidInput(format!("the destination URL needs the parameter {name:?}"))
        })?;
        if (v.is_empty() && !may_be_empty)
            || v.len() > MAX_NAME_BYTES
            || v.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(StoreError::InvalidInput(format!(
                "{name} must be {} to {MAX_NAME_BYTES} bytes without spaces or control characters, got {v:?}",
                if may_be_empty { 0 } else { 1 }
            )));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_parses_to_its_destination() {
        assert_eq!(
            Destination::parse("https://example.com/hook?a=1").unwrap(),
            Destination::Http {
                url: "https://example.com/hook?a=1".into()
            }
        );
        assert_eq!(
            Destination::parse("amqp://127.0.0.1:5672/%2f?exchange=&routing_key=orders").unwrap(),
            Destination::Amqp {
                server: "amqp://127.0.0.1:5672/%2f".into(),
                exchange: String::new(),
                routing_key: "orders".into(),
            }
        );
        assert_eq!(
            Destination::parse("nats://127.0.0.1:4222?subject=orders.created").unwrap(),
            Destination::Nats {
                server: "nats://127.0.0.1:4222".into(),
                subject: "orders.created".into(),
            }
        );
        let redis = Destination::parse("rediss://cache:6380/2?stream=events&maxlen=500").unwrap();
        assert_eq!(
            redis,
            Destination::Redis {
                server: "rediss://cache:6380/2".into(),
                stream: "events".into(),
                maxlen: 500,
            }
        );
        assert_eq!(
            (redis.kind(), redis.server()),
            ("redis", "rediss://cache:6380/2")
        );
        match Destination::parse("redis://cache?stream=s").unwrap() {
            Destination::Redis { maxlen, .. } => assert_eq!(maxlen, DEFAULT_STREAM_MAXLEN),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_broker_url_missing_or_bending_a_parameter_is_refused_with_its_name() {
        for (url, says) in [
            ("ftp://x/y", "amqp(s)://"),
            ("amqp://h?routing_key=k", "\"exchange\""),
            ("amqp://h?exchange=e", "\"routing_key\""),
            ("amqp://h?exchange=e&routing_key=", "routing_key must be 1"),
            (
                "amqp://h?exchange=e&routing_key=k&x=1",
                "unknown parameter \"x\"",
            ),
            (
                "amqp://h?exchange=e&exchange=f&routing_key=k",
                "given twice",
            ),
            ("nats://h?subject=orders.*", "wildcards"),
            ("nats://h?subject=orders..x", "wildcards"),
            ("nats://h?subject=$JS.API.STREAM.PURGE.X", "reserved"),
            ("nats://h?subject=%24SYS.REQ.SERVER.PING", "reserved"),
            ("nats://h?subject=$KV.bucket.key", "reserved"),
            ("nats://h?subject=$O.store.x", "reserved"),
            ("nats://h?subject=$JS.API.>", "wildcards"),
            ("nats://h", "\"subject\""),
            ("redis://h?stream=s&maxlen=0", "maxlen must be"),
            ("redis://h?stream=s&maxlen=x", "maxlen must be"),
            ("redis://h?stream=a%20b", "without spaces"),
            ("redis://user:pw@h?stream=s", "user or password"),
            ("amqp://h?exchange=e&routing_key=k#f", "fragment"),
            ("nats://", "nats://"),
        ] {
            let e = Destination::parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let long = format!("nats://h?subject={}", "a".repeat(MAX_NAME_BYTES + 1));
        assert!(Destination::parse(&long).is_err());
    }

    #[test]
    fn a_redis_url_with_a_path_other_than_one_database_number_is_refused() {
        for url in [
            "redis://h/abc?stream=s",
            "redis://h/0/1?stream=s",
            "rediss://h:6380/-1?stream=s",
            "redis://h/+1?stream=s",
            "redis://h/0/?stream=s",
            "redis://h//?stream=s",
            "redis://h/%30?stream=s",
            "redis://h/99999999999?stream=s",
        ] {
            let e = Destination::parse(url).unwrap_err().to_string();
            assert!(e.contains("one database number"), "{url}: {e}");
        }
        for url in [
            "redis://h?stream=s",
            "redis://h/?stream=s",
            "redis://h/0?stream=s",
            "rediss://h:6380/15?stream=s",
        ] {
            assert!(Destination::parse(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn a_nats_subject_in_a_reserved_namespace_is_refused() {
        for subject in ["$JS.API.STREAM.PURGE.X", "$SYS.x", "$KV.b.k", "$O.s", "$G"] {
            let e = check_nats_subject(subject).unwrap_err().to_string();
            assert!(e.contains("reserved"), "{subject}: {e}");
        }
        assert!(
            check_nats_subject("orders.$JS").is_ok(),
            "only the start is reserved"
        );
    }
}
