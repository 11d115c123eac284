//! The PostgreSQL connection URL as a value that never shows its password.

use std::fmt;

/// A PostgreSQL connection URL; `Debug` and `Display` hide the password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps a URL.
    pub fn new(s: impl Into<String>) -> Self {
        DatabaseUrl(s.into())
    }

    /// The URL itself, password included; pass it only to the driver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password (in the user info or a `password` query
    /// parameter) replaced by `***`; a string that is not a URL at all is
    /// not shown.
    ///
    /// libpq's other forms are redacted too: a URL with several hosts
    /// (`postgres://u:p@h1:5432,h2:5433/db`, which the `url` crate does not
    /// parse) and the key/value form (`host=h1,h2 password=p`).
    pub fn redacted(&self) -> String {
        let Ok(mut url) = url::Url::parse(&self.0) else {
            return redacted_libpq(&self.0);
        };
        if url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        if url.query_pairs().any(|(k, _)| k == "password") {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k == "password" {
                        "***".into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        url.to_string()
    }

    /// Whether it names more than one host, in either of libpq's forms
    /// (`postgres://u@h1:5432,h2:5433/db` or `host=h1,h2 ...`).
    pub fn several_hosts(&self) -> bool {
        match libpq_url(&self.0) {
            Some((_, authority, _)) => {
                let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                hosts.contains(',')
            }
            None => self
                .0
                .split_whitespace()
                .any(|pair| pair.strip_prefix("host=").is_some_and(|h| h.contains(','))),
        }
    }
}

/// A URL of libpq's form split into scheme, authority (user info and
/// hosts) and the rest (path and query); `None` without `://`.
fn libpq_url(s: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = s.split_once("://")?;
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    Some((scheme, authority, tail))
}

/// The password of a multi-host URL or of a key/value string replaced by
/// `***`; anything else is not shown.
fn redacted_libpq(s: &str) -> String {
    let hide_password_pairs = |text: &str, sep: char| -> String {
        text.split(sep)
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k.trim() == "password" => format!("{k}=***"),
                _ => pair.to_string(),
            })
            .collect::<Vec<_>>()
            .join(&sep.to_string())
    };
    if let Some((scheme, authority, tail)) = libpq_url(s) {
        if scheme != "postgres" && scheme != "postgresql" {
            return "(not a URL)".to_string();
        }
        let authority = match authority.rsplit_once('@') {
            Some((user, hosts)) => match user.split_once(':') {
                Some((name, _)) => format!("{name}:***@{hosts}"),
                None => format!("{user}@{hosts}"),
            },
            None => authority.to_string(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => format!("{path}?{}", hide_password_pairs(query, '&')),
            None => tail.to_string(),
        };
        return format!("{scheme}://{authority}{tail}");
    }
    if s.contains('=') {
        return hide_password_pairs(s, ' ');
    }
    "(not a URL)".to_string()
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?})", self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn every_form_libpq_takes_is_shown_without_its_password() {
        for (given, shown) in [
            (
                "postgres://u:secret@h1:5432,h2:5433/db?target_session_attrs=read-write",
                "postgres://u:***@h1:5432,h2:5433/db?target_session_attrs=read-write",
            ),
            (
                "postgresql://h1,h2/db?password=secret&sslmode=require",
                "postgresql://h1,h2/db?password=***&sslmode=require",
            ),
            (
                "host=h1,h2 port=5432,5433 user=u password=secret dbname=db",
                "host=h1,h2 port=5432,5433 user=u password=*** dbname=db",
            ),
            ("postgres://u:secret@h1/db", "postgres://u:***@h1/db"),
            ("nonsense", "(not a URL)"),
        ] {
            let r = DatabaseUrl::new(given).redacted();
            assert_eq!(r, shown);
            assert!(!r.contains("secret"));
        }
    }

    #[test]
    fn several_hosts_are_seen_in_both_forms() {
        for (url, several) in [
            ("postgres://u:p@h1:5432,h2:5433/db", true),
            ("postgresql://h1,h2/db?sslmode=require", true),
            ("host=h1,h2 port=5432,5433 dbname=db", true),
            ("postgres://u:p,q@h1/db", false),
            ("postgres://u@h1/db?options=a,b", false),
            ("host=h1 dbname=db", false),
        ] {
            assert_eq!(DatabaseUrl::new(url).several_hosts(), several, "{url}");
        }
    }
}
