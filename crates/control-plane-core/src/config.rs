//! Profile resolution: `CONTROLPLANE_*` variables to a [`Config`], failing
//! closed. Parsing takes an iterator of variables, so it is tested without
//! touching the process environment; the binary wires the result.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::Secret;

/// Every variable the resolver accepts. Any other `CONTROLPLANE_*` key stops the boot.
pub const KNOWN_VARIABLES: &[&str] = &[
    "CONTROLPLANE_STORE",
    "CONTROLPLANE_DATABASE_URL",
    "CONTROLPLANE_POOL_SIZE",
    "CONTROLPLANE_DATABASE_SCHEMA",
    "CONTROLPLANE_EMBEDDED_PATH",
    "CONTROLPLANE_LISTEN",
    "CONTROLPLANE_ADMIN_TOKEN",
    "CONTROLPLANE_ALLOWED_TARGETS",
    "CONTROLPLANE_RETRY_SCHEDULE",
    "CONTROLPLANE_CONCURRENCY",
    "CONTROLPLANE_LEASE",
    "CONTROLPLANE_ENDPOINT_CONCURRENCY",
];

/// A configuration error: which variable, what was wrong, what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct ConfigError {
    /// The variable at fault.
    pub variable: String,
    /// What was wrong and what is accepted.
    pub message: String,
}

fn err(variable: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        variable: variable.to_string(),
        message: message.into(),
    }
}

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

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let s = &self.0;
        let mut out = match (s.find("://"), s.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &s[scheme + 3..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        format!("{}{}:***{}", &s[..scheme + 3], &userinfo[..colon], &s[at..])
                    }
                    None => s.clone(),
                }
            }
            _ => s.clone(),
        };
        if let Some(p) = out.find("password=") {
            let end = out[p..].find(['&', ' ']).map_or(out.len(), |e| p + e);
            out.replace_range(p..end, "password=***");
        }
        out
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

/// Which adapter, with its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreProfile {
    /// DuckDB in one file, one process.
    Embedded {
        /// The database file.
        path: PathBuf,
    },
    /// PostgreSQL, any number of replicas.
    Postgres {
        /// Connection URL.
        url: DatabaseUrl,
        /// Connections in the pool.
        pool_size: u32,
        /// Schema holding the tables.
        schema: String,
    },
}

impl StoreProfile {
    /// The profile's name as `CONTROLPLANE_STORE` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            StoreProfile::Embedded { .. } => "embedded",
            StoreProfile::Postgres { .. } => "postgres",
        }
    }
}

/// An IP network, e.g. `127.0.0.0/8` or `::1/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Network address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `addr/prefix` (a bare address means a single host).
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.trim().parse::<u8>().ok().filter(|&p| p <= max)?,
            None => max,
        };
        Some(Cidr { addr, prefix })
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The resolved configuration of the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The store profile.
    pub store: StoreProfile,
    /// API listen address.
    pub listen: SocketAddr,
    /// Admin bearer token, if set.
    pub admin_token: Option<Secret>,
    /// Private networks destinations may nevertheless resolve to.
    pub allowed_targets: Vec<Cidr>,
    /// Delays before each retry.
    pub retry_schedule: Vec<Duration>,
    /// In-flight sends per worker process.
    pub concurrency: u32,
    /// Lease length.
    pub lease: Duration,
    /// Default in-flight cap per endpoint, across every replica.
    pub endpoint_concurrency: u32,
}

/// Parses `500ms`, `30s`, `5m`, `2h` or `1d`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).map(Duration::from_millis)
}

fn parse_u32_in(var: &str, v: &str, lo: u32, hi: u32) -> Result<u32, ConfigError> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| {
            err(
                var,
                format!("expected a whole number from {lo} to {hi}, got {v:?}"),
            )
        })
}

impl Config {
    /// Resolves the configuration from `(name, value)` pairs, typically
    /// `std::env::vars()`. Variables not starting with `CONTROLPLANE_` are ignored.
    ///
    /// # Errors
    /// An unknown `CONTROLPLANE_*` key, an unknown store name, a missing or
    /// malformed value: the error names the variable and what is accepted.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let vars = Vars::known(vars)?;
        Ok(Config {
            store: store_profile(&vars)?,
            listen: listen(&vars)?,
            admin_token: admin_token(&vars)?,
            allowed_targets: allowed_targets(&vars)?,
            retry_schedule: retry_schedule(&vars)?,
            concurrency: match vars.get("CONTROLPLANE_CONCURRENCY") {
                Some(v) => parse_u32_in("CONTROLPLANE_CONCURRENCY", v, 1, 10_000)?,
                None => 64,
            },
            lease: lease(&vars)?,
            endpoint_concurrency: match vars.get("CONTROLPLANE_ENDPOINT_CONCURRENCY") {
                Some(v) => parse_u32_in(
                    "CONTROLPLANE_ENDPOINT_CONCURRENCY",
                    v,
                    1,
                    crate::flow::MAX_IN_FLIGHT_LIMIT,
                )?,
                None => crate::policy::DEFAULT_ENDPOINT_CONCURRENCY,
            },
        })
    }
}

/// The `CONTROLPLANE_*` variables, every one of them known.
struct Vars(std::collections::BTreeMap<String, String>);

impl Vars {
    /// Keeps the `CONTROLPLANE_*` pairs; an unknown one is an error (fail
    /// closed: a misspelt setting must not be silently ignored).
    fn known<I, K, V>(vars: I) -> Result<Vars, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut map = std::collections::BTreeMap::new();
        for (k, v) in vars {
            let k = k.as_ref();
            if !k.starts_with("CONTROLPLANE_") {
                continue;
            }
            if !KNOWN_VARIABLES.contains(&k) {
                return Err(err(
                    k,
                    format!(
                        "unknown variable; the accepted ones are {}",
                        KNOWN_VARIABLES.join(", ")
                    ),
                ));
            }
            map.insert(k.to_string(), v.as_ref().to_string());
        }
        Ok(Vars(map))
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// Refuses `keys` that the chosen store does not read.
    fn refuse(&self, keys: &[&str], why: &str) -> Result<(), ConfigError> {
        match keys.iter().find(|k| self.get(k).is_some()) {
            Some(k) => Err(err(k, why.to_string())),
            None => Ok(()),
        }
    }
}

fn store_profile(vars: &Vars) -> Result<StoreProfile, ConfigError> {
    match vars.get("CONTROLPLANE_STORE").unwrap_or("embedded") {
        "embedded" => {
            if vars.get("CONTROLPLANE_DATABASE_URL").is_some() {
                return Err(err(
                    "CONTROLPLANE_DATABASE_URL",
                    "set, but CONTROLPLANE_STORE is embedded; set CONTROLPLANE_STORE=postgres to use it, or unset it",
                ));
            }
            vars.refuse(
                &["CONTROLPLANE_POOL_SIZE", "CONTROLPLANE_DATABASE_SCHEMA"],
                "applies only to CONTROLPLANE_STORE=postgres; unset it",
            )?;
            embedded_profile(vars)
        }
        "postgres" => {
            vars.refuse(
                &["CONTROLPLANE_EMBEDDED_PATH"],
                "set, but CONTROLPLANE_STORE is postgres; unset it",
            )?;
            postgres_profile(vars)
        }
        other => Err(err(
            "CONTROLPLANE_STORE",
            format!("unknown store {other:?}; accepted: embedded (the default), postgres"),
        )),
    }
}

fn embedded_profile(vars: &Vars) -> Result<StoreProfile, ConfigError> {
    let path = vars
        .get("CONTROLPLANE_EMBEDDED_PATH")
        .unwrap_or("./control-plane.duckdb");
    if path.trim().is_empty() {
        return Err(err(
            "CONTROLPLANE_EMBEDDED_PATH",
            "expected a file path, got an empty value",
        ));
    }
    Ok(StoreProfile::Embedded {
        path: PathBuf::from(path),
    })
}

fn postgres_profile(vars: &Vars) -> Result<StoreProfile, ConfigError> {
    let url = vars.get("CONTROLPLANE_DATABASE_URL").ok_or_else(|| {
        err(
            "CONTROLPLANE_DATABASE_URL",
            "required when CONTROLPLANE_STORE=postgres, e.g. postgres://user@127.0.0.1:5432/db",
        )
    })?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(err(
            "CONTROLPLANE_DATABASE_URL",
            format!(
                "expected a postgres:// or postgresql:// URL, got {:?}",
                DatabaseUrl::new(url).redacted()
            ),
        ));
    }
    let pool_size = match vars.get("CONTROLPLANE_POOL_SIZE") {
        Some(v) => parse_u32_in("CONTROLPLANE_POOL_SIZE", v, 1, 1000)?,
        None => 16,
    };
    let schema = vars.get("CONTROLPLANE_DATABASE_SCHEMA").unwrap_or("public");
    let schema_ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !schema_ok {
        return Err(err(
            "CONTROLPLANE_DATABASE_SCHEMA",
            format!("expected 1 to 63 characters of a-z, 0-9 and '_', starting with a letter or '_', got {schema:?}"),
        ));
    }
    Ok(StoreProfile::Postgres {
        url: DatabaseUrl::new(url),
        pool_size,
        schema: schema.to_string(),
    })
}

fn listen(vars: &Vars) -> Result<SocketAddr, ConfigError> {
    match vars.get("CONTROLPLANE_LISTEN") {
        Some(v) => v.trim().parse::<SocketAddr>().map_err(|_| {
            err(
                "CONTROLPLANE_LISTEN",
                format!("expected an address like 127.0.0.1:8080, got {v:?}"),
            )
        }),
        None => Ok(SocketAddr::from(([127, 0, 0, 1], 8080))),
    }
}

fn admin_token(vars: &Vars) -> Result<Option<Secret>, ConfigError> {
    match vars.get("CONTROLPLANE_ADMIN_TOKEN") {
        Some(v) if v.len() < 16 => Err(err(
            "CONTROLPLANE_ADMIN_TOKEN",
            "expected at least 16 characters (use a long random value)",
        )),
        Some(v) => Ok(Some(Secret::new(v))),
        None => Ok(None),
    }
}

fn allowed_targets(vars: &Vars) -> Result<Vec<Cidr>, ConfigError> {
    let Some(v) = vars.get("CONTROLPLANE_ALLOWED_TARGETS") else {
        return Ok(Vec::new());
    };
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Cidr::parse(s).ok_or_else(|| {
                err(
                    "CONTROLPLANE_ALLOWED_TARGETS",
                    format!("expected comma-separated CIDRs like 127.0.0.0/8,::1/128, got {s:?}"),
                )
            })
        })
        .collect()
}

fn retry_schedule(vars: &Vars) -> Result<Vec<Duration>, ConfigError> {
    let Some(v) = vars.get("CONTROLPLANE_RETRY_SCHEDULE") else {
        return Ok(default_retry_schedule());
    };
    let s = v
        .split(',')
        .map(|p| {
            parse_duration(p).ok_or_else(|| {
                err(
                    "CONTROLPLANE_RETRY_SCHEDULE",
                    format!("expected comma-separated durations like 5s,5m,30m,2h, got {p:?}"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if s.len() > 100 {
        return Err(err("CONTROLPLANE_RETRY_SCHEDULE", "at most 100 retries"));
    }
    Ok(s)
}

fn lease(vars: &Vars) -> Result<Duration, ConfigError> {
    let Some(v) = vars.get("CONTROLPLANE_LEASE") else {
        return Ok(Duration::from_secs(30));
    };
    parse_duration(v)
        .filter(|d| *d >= Duration::from_secs(1) && *d <= Duration::from_secs(3600))
        .ok_or_else(|| {
            err(
                "CONTROLPLANE_LEASE",
                format!("expected a duration from 1s to 1h like 30s, got {v:?}"),
            )
        })
}

/// 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (after the first, immediate attempt).
pub fn default_retry_schedule() -> Vec<Duration> {
    [5, 300, 1800, 7200, 18_000, 36_000, 36_000]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(vars.iter().copied())
    }

    #[test]
    fn no_variables_means_embedded_defaults() {
        let c = parse(&[("PATH", "/bin")]).unwrap();
        assert_eq!(
            c.store,
            StoreProfile::Embedded {
                path: PathBuf::from("./control-plane.duckdb")
            }
        );
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.retry_schedule.len(), 7);
        assert_eq!(c.lease, Duration::from_secs(30));
    }

    #[test]
    fn postgres_requires_a_database_url() {
        let e = parse(&[("CONTROLPLANE_STORE", "postgres")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_DATABASE_URL");
        let c = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://u:pw@h/db"),
            ("CONTROLPLANE_POOL_SIZE", "4"),
        ])
        .unwrap();
        assert!(matches!(
            c.store,
            StoreProfile::Postgres { pool_size: 4, .. }
        ));
    }

    #[test]
    fn unknown_store_fails_closed_naming_the_accepted_ones() {
        let e = parse(&[("CONTROLPLANE_STORE", "sqlite")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_STORE");
        assert!(e.message.contains("embedded") && e.message.contains("postgres"));
    }

    #[test]
    fn unknown_controlplane_key_fails_closed() {
        let e = parse(&[("CONTROLPLANE_STOER", "embedded")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_STOER");
        assert!(e.message.contains("CONTROLPLANE_STORE"));
    }

    #[test]
    fn malformed_values_name_their_variable() {
        for (k, v) in [
            ("CONTROLPLANE_LISTEN", "nope"),
            ("CONTROLPLANE_LEASE", "30"),
            ("CONTROLPLANE_LEASE", "0s"),
            ("CONTROLPLANE_CONCURRENCY", "0"),
            ("CONTROLPLANE_RETRY_SCHEDULE", "5s,x"),
            ("CONTROLPLANE_ALLOWED_TARGETS", "10.0.0.0/33"),
            ("CONTROLPLANE_ADMIN_TOKEN", "short"),
            ("CONTROLPLANE_POOL_SIZE", "4"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://x/y"),
            ("CONTROLPLANE_DATABASE_SCHEMA", "s"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            assert_eq!(e.variable, k, "{k}={v}");
        }
    }

    #[test]
    fn debug_redacts_passwords_and_tokens() {
        let c = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            (
                "CONTROLPLANE_DATABASE_URL",
                "postgres://app:hunter2@db/x?password=hunter3",
            ),
            ("CONTROLPLANE_ADMIN_TOKEN", "tok-0123456789abcdef"),
        ])
        .unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("hunter2"), "{d}");
        assert!(!d.contains("hunter3"), "{d}");
        assert!(!d.contains("0123456789abcdef"), "{d}");
        assert!(d.contains("app:***@db"), "{d}");
    }

    #[test]
    fn durations_and_cidrs_parse() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("h"), None);
        let n = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(n.contains("127.1.2.3".parse().unwrap()));
        assert!(!n.contains("128.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
    }
}
