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
    pub fn redacted(&self) -> String {
        let Ok(mut url) = url::Url::parse(&self.0) else {
            return "(not a URL)".to_string();
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
