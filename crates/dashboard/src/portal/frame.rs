//! Which sites may frame the portal (`CONTROLPLANE_PORTAL_FRAME_ANCESTORS`):
//! the CSP `frame-ancestors` of the portal's pages, `'none'` by default.

/// The sources of the portal's CSP `frame-ancestors`: `'none'` (the
/// default), or `'self'` and origins such as `https://app.example.com`
/// or `https://*.example.com:8443`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameAncestors(String);

impl Default for FrameAncestors {
    fn default() -> Self {
        FrameAncestors("'none'".into())
    }
}

/// The most sources the setting takes.
const MAX_SOURCES: usize = 16;

impl FrameAncestors {
    /// Parses the setting: sources separated by spaces, each `'none'`
    /// (alone), `'self'`, or `http(s)://host[:port]` where the host may
    /// start with `*.`.
    ///
    /// # Errors
    /// What was wrong and what is accepted.
    pub fn parse(v: &str) -> Result<Self, String> {
        let sources: Vec<&str> = v.split_ascii_whitespace().collect();
        let accepted = "sources separated by spaces: 'none' alone, or 'self' and origins \
                        like https://app.example.com or https://*.example.com:8443";
        if sources.is_empty() || sources.len() > MAX_SOURCES {
            return Err(format!("expected 1 to {MAX_SOURCES} {accepted}"));
        }
        if sources.len() > 1 && sources.contains(&"'none'") {
            return Err(format!("'none' stands alone; expected {accepted}"));
        }
        if let Some(bad) = sources.iter().find(|s| !source_ok(s)) {
            return Err(format!("{bad:?} is not a source; expected {accepted}"));
        }
        Ok(FrameAncestors(sources.join(" ")))
    }

    /// Whether no site may frame the portal.
    pub fn is_none(&self) -> bool {
        self.0 == "'none'"
    }

    /// The sources as the CSP writes them.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `s` is `'none'`, `'self'` or an `http(s)` origin.
fn source_ok(s: &str) -> bool {
    if s == "'none'" || s == "'self'" {
        return true;
    }
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    let (host, port) = rest.split_once(':').unwrap_or((rest, ""));
    let host = host.strip_prefix("*.").unwrap_or(host);
    let label = |l: &str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    let port_ok = port.is_empty() || (port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()));
    host.len() <= 253 && host.split('.').all(label) && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_ancestors_setting_takes_origins_and_refuses_the_rest() {
        assert!(FrameAncestors::default().is_none());
        let ok =
            FrameAncestors::parse(" 'self'  https://app.example.com https://*.shop.example:8443 ")
                .unwrap();
        assert_eq!(
            ok.as_str(),
            "'self' https://app.example.com https://*.shop.example:8443"
        );
        assert!(!ok.is_none());
        assert!(FrameAncestors::parse("'none'").unwrap().is_none());
        for bad in [
            "",
            "*",
            "'none' https://a.example",
            "https://a.example/path",
            "https://a.example; script-src *",
            "javascript:alert(1)",
            "'unsafe-inline'",
            "https://a..example",
            "https://a.example:99999x",
        ] {
            let e = FrameAncestors::parse(bad).unwrap_err();
            assert!(e.contains("expected"), "{bad}: {e}");
        }
    }
}
