//! Profile resolution: `CONTROLPLANE_*` variables to a [`Config`], failing
//! closed. Parsing takes an iterator of variables, so it is tested without
//! touching the process environment; `store` opens the store and `service`
//! runs the process from the result.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use api::MAX_TOKEN_BYTES;
use control_plane_core::Migrations;
use control_plane_core::Secret;
use control_plane_store_kit::DatabaseUrl;
use dispatcher::retry::default_retry_schedule;
use dispatcher::Cidr;

/// One `CONTROLPLANE_*` variable: its name, its default as shown to an
/// operator, what it does, and the commands that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// Its default, as an operator would write it.
    pub default: &'static str,
    /// What it sets.
    pub help: &'static str,
    /// The commands that read it.
    pub commands: &'static [&'static str],
}

const EVERY: &[&str] = &["serve", "api", "worker", "migrate", "status", "rotate-key"];
/// Every command, `healthcheck` included (it reads the listen address only).
#[cfg(test)]
const COMMANDS: &[&str] = &[
    "serve",
    "api",
    "worker",
    "migrate",
    "status",
    "rotate-key",
    "healthcheck",
];
const SERVICE: &[&str] = &["serve", "api", "worker"];
const WORKERS: &[&str] = &["serve", "worker"];
const API: &[&str] = &["serve", "api"];

/// Every variable the resolver accepts. Any other `CONTROLPLANE_*` key stops
/// the boot. `control-plane <command> --help` prints the ones a command reads.
#[rustfmt::skip]
pub const VARIABLES: &[Variable] = &[
    Variable { name: "CONTROLPLANE_STORE", default: "embedded", help: "embedded or postgres", commands: EVERY },
    Variable { name: "CONTROLPLANE_EMBEDDED_PATH", default: "./control-plane.duckdb", help: "the DuckDB file (embedded only)", commands: EVERY },
    Variable { name: "CONTROLPLANE_DATABASE_URL", default: "(required for postgres)", help: "postgres://user:password@host:port/db, several hosts as h1:5432,h2:5433 with ?target_session_attrs=read-write, or libpq's key/value form (or the next variable)", commands: EVERY },
    Variable { name: "CONTROLPLANE_DATABASE_URL_FILE", default: "(none)", help: "file holding the database URL instead (a container secret); one trailing newline is ignored", commands: EVERY },
    Variable { name: "CONTROLPLANE_POOL_SIZE", default: "16", help: "connections, 1 to 1000 (postgres only)", commands: EVERY },
    Variable { name: "CONTROLPLANE_OUTCOME_COMMIT", default: "sync", help: "sync or async: whether the commits of delivery outcomes wait for the disk (postgres only; ADR 0034)", commands: WORKERS },
    Variable { name: "CONTROLPLANE_DATABASE_SCHEMA", default: "public", help: "schema holding the tables (postgres only)", commands: EVERY },
    Variable { name: "CONTROLPLANE_AUTO_MIGRATE", default: "true", help: "false: a store whose schema is behind refuses to start until `control-plane migrate` runs", commands: &["serve", "api", "worker", "status", "rotate-key"] },
    Variable { name: "CONTROLPLANE_SECRET_KEY_FILE", default: "(embedded: the store file + .key, created; required for postgres)", help: "file holding the key endpoint secrets are sealed with: the base64 of 32 random bytes", commands: EVERY },
    Variable { name: "CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES", default: "(none)", help: "comma-separated key files still read, during a rotation (see rotate-key)", commands: EVERY },
    Variable { name: "CONTROLPLANE_LISTEN", default: "127.0.0.1:8080", help: "the API's address; a worker serves /healthz and /readyz there only when it is set; healthcheck asks it (0.0.0.0 and [::] as loopback)", commands: &["serve", "api", "worker", "healthcheck"] },
    Variable { name: "CONTROLPLANE_HTTP_HEADER_TIMEOUT", default: "10s", help: "time to send a request head, and idle time of a kept-alive connection, 1s to 5m", commands: API },
    Variable { name: "CONTROLPLANE_HTTP_BODY_TIMEOUT", default: "30s", help: "time to send a request body (408 past it), 1s to 10m", commands: API },
    Variable { name: "CONTROLPLANE_HTTP_MAX_CONNECTIONS", default: "16384", help: "API connections served at once, 1 to 1000000; more wait in the backlog", commands: API },
    Variable { name: "CONTROLPLANE_QUOTA_ENDPOINTS", default: "1000", help: "endpoints one account may hold, 1 to 1000000", commands: API },
    Variable { name: "CONTROLPLANE_QUOTA_EVENT_TYPES", default: "1000", help: "event types one account may register, 1 to 1000000", commands: API },
    Variable { name: "CONTROLPLANE_QUOTA_SCHEMA_BYTES", default: "4194304", help: "bytes of schemas and examples one account may register, 1024 to 1073741824", commands: API },
    Variable { name: "CONTROLPLANE_PORTAL_FRAME_ANCESTORS", default: "'none'", help: "sites that may frame the portal (/portal) as CSP frame-ancestors: 'self' and origins like https://app.example.com, separated by spaces", commands: API },
    Variable { name: "CONTROLPLANE_ADMIN_TOKEN", default: "(generated by serve)", help: "admin bearer token, 32 to 256 visible ASCII characters (required for api, or the next variable)", commands: API },
    Variable { name: "CONTROLPLANE_ADMIN_TOKEN_FILE", default: "(none)", help: "file holding the admin token instead (a container secret); one trailing newline is ignored", commands: API },
    Variable { name: "CONTROLPLANE_ALLOWED_TARGETS", default: "(none)", help: "CIDRs that destinations may resolve to despite being private", commands: WORKERS },
    Variable { name: "CONTROLPLANE_HTTP_PROXY", default: "(none)", help: "http://[user:password@]host:port: webhooks (and OAuth2 token requests) leave through this proxy's CONNECT tunnels, to the address checked here; brokers connect directly", commands: WORKERS },
    Variable { name: "CONTROLPLANE_HTTP_PROXY_FILE", default: "(none)", help: "file holding the proxy URL instead (keeps its password out of the environment)", commands: WORKERS },
    Variable { name: "CONTROLPLANE_NO_PROXY", default: "(none)", help: "comma-separated destinations sent directly: * , names (and every name under them), addresses, networks", commands: WORKERS },
    Variable { name: "CONTROLPLANE_RETRY_SCHEDULE", default: "5s,5m,30m,2h,5h,10h,10h", help: "delays before each retry", commands: SERVICE },
    Variable { name: "CONTROLPLANE_CONCURRENCY", default: "64", help: "in-flight sends per worker process", commands: WORKERS },
    Variable { name: "CONTROLPLANE_CLAIM_AHEAD", default: "100", help: "deliveries a worker claims beyond its free send slots while every endpoint answers quickly, 0 to 10000", commands: WORKERS },
    Variable { name: "CONTROLPLANE_OUTCOME_LINGER", default: "5ms", help: "while outcomes arrive together, how long a worker waits for 64 of them before committing a batch, 0s to 100ms (ADR 0041)", commands: WORKERS },
    Variable { name: "CONTROLPLANE_SLOW_ANSWER", default: "1s", help: "answers slower than this lower the endpoint's in-flight cap, 10ms to 1h", commands: WORKERS },
    Variable { name: "CONTROLPLANE_LEASE", default: "30s", help: "lease length of a delivery being sent, 1s to 1h", commands: WORKERS },
    Variable { name: "CONTROLPLANE_RESPONSE_BODY_BYTES", default: "4096", help: "bytes of each answer's body kept on its attempt (0 to 65536)", commands: WORKERS },
    Variable { name: "CONTROLPLANE_ENDPOINT_CONCURRENCY", default: "16", help: "in-flight cap of an endpoint without max_in_flight, across replicas", commands: SERVICE },
    Variable { name: "CONTROLPLANE_RETENTION", default: "30d", help: "how long finished history is kept before maintenance purges it", commands: WORKERS },
    Variable { name: "CONTROLPLANE_LOG", default: "info", help: "log filter, e.g. debug or info,dispatcher=debug", commands: EVERY },
    Variable { name: "CONTROLPLANE_LOG_FORMAT", default: "text", help: "text or json (one object per line)", commands: EVERY },
];

/// Whether `name` is a variable the resolver accepts.
pub fn is_known(name: &str) -> bool {
    VARIABLES.iter().any(|v| v.name == name)
}

/// The `CONTROLPLANE_*` names that the Compose files under `deploy/` read
/// for themselves (ports, the image, the secrets' directory); the binary
/// never reads them, and names them so in its error.
const COMPOSE_ONLY: &[&str] = &[
    "CONTROLPLANE_PORT",
    "CONTROLPLANE_BIND_ADDRESS",
    "CONTROLPLANE_WORKER_1_PORT",
    "CONTROLPLANE_WORKER_2_PORT",
    "CONTROLPLANE_IMAGE",
    "CONTROLPLANE_SECRETS_DIR",
    "CONTROLPLANE_PG_GATE_IMAGE",
    "CONTROLPLANE_PG_HOST",
    "CONTROLPLANE_PG_PORT",
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
        /// Whether the commits of delivery outcomes wait for the disk.
        synchronous_outcomes: bool,
    },
}

/// The resolved configuration of the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The store profile.
    pub store: StoreProfile,
    /// Whether `CONTROLPLANE_LISTEN` was set: a `worker` serves its probes
    /// only then, so that workers side by side on one host do not contend
    /// for the default port.
    pub listen_set: bool,
    /// API listen address.
    pub listen: SocketAddr,
    /// The API server's connection limits.
    pub server: api::ServerLimits,
    /// Time a request body may take to arrive.
    pub body_timeout: Duration,
    /// What one account may hold.
    pub quotas: api::Quotas,
    /// Admin bearer token, if set.
    pub admin_token: Option<Secret>,
    /// Where the keys that seal endpoint secrets are read from.
    pub secret_keys: SecretKeyFiles,
    /// Private networks destinations may nevertheless resolve to.
    pub allowed_targets: Vec<Cidr>,
    /// The egress proxy of HTTP destinations, if any.
    pub proxy: Option<dispatcher::Proxy>,
    /// Delays before each retry.
    pub retry_schedule: Vec<Duration>,
    /// In-flight sends per worker process.
    pub concurrency: u32,
    /// Deliveries claimed beyond the free send slots (ADR 0038).
    pub claim_ahead: u32,
    /// Lease length.
    pub lease: Duration,
    /// Answers slower than this lower the endpoint's in-flight cap (ADR 0019).
    pub slow_answer: Duration,
    /// How long the completion batcher waits for company (ADR 0041).
    pub outcome_linger: Duration,
    /// Default in-flight cap per endpoint, across every replica.
    pub endpoint_concurrency: u32,
    /// Bytes of each answer's body kept on its attempt.
    pub response_body_bytes: u32,
    /// Whether opening the store applies pending migrations.
    pub migrations: Migrations,
    /// How long finished history is kept.
    pub retention: Duration,
    /// Which sites may frame the portal's pages.
    pub portal_frame_ancestors: dashboard::FrameAncestors,
    /// The log filter (an `EnvFilter` directive).
    pub log: String,
    /// How log lines are written.
    pub log_format: LogFormat,
}

/// The files holding the keys endpoint secrets are sealed with (ADR 0022).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretKeyFiles {
    /// The key that seals (`CONTROLPLANE_SECRET_KEY_FILE`).
    pub current: PathBuf,
    /// Whether a missing `current` file is created with a new key: the
    /// embedded default only; a postgres replica must share its key.
    pub create_if_missing: bool,
    /// Keys that only open, during a rotation.
    pub previous: Vec<PathBuf>,
}

fn secret_key_files(vars: &Vars) -> Result<SecretKeyFiles, ConfigError> {
    const VAR: &str = "CONTROLPLANE_SECRET_KEY_FILE";
    let given = vars.get(VAR).map(str::trim);
    if given == Some("") {
        return Err(err(VAR, "expected a file path, got an empty value"));
    }
    let (current, create_if_missing) = match (given, vars.get("CONTROLPLANE_STORE")) {
        (Some(path), Some("postgres")) => (PathBuf::from(path), false),
        (Some(path), _) => (PathBuf::from(path), true),
        (None, Some("postgres")) => {
            return Err(err(
                VAR,
                "required when CONTROLPLANE_STORE=postgres: every replica seals endpoint secrets with \
                 the same key; create one with `(umask 077; head -c 32 /dev/urandom | base64 > key)`",
            ))
        }
        (None, _) => {
            let store = vars
                .get("CONTROLPLANE_EMBEDDED_PATH")
                .unwrap_or("./control-plane.duckdb");
            (PathBuf::from(format!("{store}.key")), true)
        }
    };
    let previous = vars
        .get("CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES")
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    Ok(SecretKeyFiles {
        current,
        create_if_missing,
        previous,
    })
}

/// How log lines are written (`CONTROLPLANE_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Parses a duration like `500ms`, `30s`, `5m`, `2h`, `1d` or `1h 30m`
/// (humantime's syntax).
pub fn parse_duration(s: &str) -> Option<Duration> {
    humantime::parse_duration(s.trim()).ok()
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
            listen_set: vars.get("CONTROLPLANE_LISTEN").is_some(),
            server: server_limits(&vars)?,
            quotas: quotas(&vars)?,
            body_timeout: duration_in(
                &vars,
                "CONTROLPLANE_HTTP_BODY_TIMEOUT",
                Duration::from_secs(30),
                (Duration::from_secs(1), Duration::from_secs(600)),
                "a duration from 1s to 10m like 30s",
            )?,
            admin_token: admin_token(&vars)?,
            secret_keys: secret_key_files(&vars)?,
            allowed_targets: allowed_targets(&vars)?,
            proxy: proxy(&vars)?,
            retry_schedule: retry_schedule(&vars)?,
            concurrency: match vars.get("CONTROLPLANE_CONCURRENCY") {
                Some(v) => parse_u32_in("CONTROLPLANE_CONCURRENCY", v, 1, 10_000)?,
                None => 64,
            },
            claim_ahead: match vars.get("CONTROLPLANE_CLAIM_AHEAD") {
                Some(v) => parse_u32_in("CONTROLPLANE_CLAIM_AHEAD", v, 0, 10_000)?,
                None => 100,
            },
            lease: lease(&vars)?,
            slow_answer: slow_answer(&vars)?,
            outcome_linger: outcome_linger(&vars)?,
            endpoint_concurrency: match vars.get("CONTROLPLANE_ENDPOINT_CONCURRENCY") {
                Some(v) => parse_u32_in(
                    "CONTROLPLANE_ENDPOINT_CONCURRENCY",
                    v,
                    1,
                    control_plane_core::MAX_IN_FLIGHT_LIMIT,
                )?,
                None => control_plane_core::DEFAULT_ENDPOINT_CONCURRENCY,
            },
            response_body_bytes: match vars.get("CONTROLPLANE_RESPONSE_BODY_BYTES") {
                Some(v) => parse_u32_in("CONTROLPLANE_RESPONSE_BODY_BYTES", v, 0, 65_536)?,
                None => 4096,
            },
            migrations: migrations(&vars)?,
            retention: retention(&vars)?,
            log: vars.get("CONTROLPLANE_LOG").unwrap_or("info").to_string(),
            log_format: log_format(&vars)?,
            portal_frame_ancestors: match vars.get("CONTROLPLANE_PORTAL_FRAME_ANCESTORS") {
                None => dashboard::FrameAncestors::default(),
                Some(v) => dashboard::FrameAncestors::parse(v)
                    .map_err(|m| err("CONTROLPLANE_PORTAL_FRAME_ANCESTORS", m))?,
            },
        })
    }
}

/// The `CONTROLPLANE_*` variables, every one of them known.
struct Vars(std::collections::BTreeMap<String, String>);

impl Vars {
    /// Keeps the `CONTROLPLANE_*` pairs; an unknown one is an error (fail
    /// closed: a misspelt setting must not be silently ignored), except the
    /// test suite's own `CONTROLPLANE_TEST_*`, which the service never reads,
    /// so a shell set up for the tests can run the service too.
    fn known<I, K, V>(vars: I) -> Result<Vars, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut map = std::collections::BTreeMap::new();
        for (k, v) in vars {
            let k = k.as_ref();
            if !k.starts_with("CONTROLPLANE_") || k.starts_with("CONTROLPLANE_TEST_") {
                continue;
            }
            if COMPOSE_ONLY.contains(&k) {
                return Err(err(
                    k,
                    "read by the Compose files under deploy/, not by control-plane (its address is \
                     CONTROLPLANE_LISTEN); unset it in the environment that runs control-plane",
                ));
            }
            if !is_known(k) {
                let names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
                return Err(err(
                    k,
                    format!(
                        "unknown variable; the accepted ones are {}",
                        names.join(", ")
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
            vars.refuse(
                &[DATABASE_URL, DATABASE_URL_FILE],
                "set, but CONTROLPLANE_STORE is embedded; set CONTROLPLANE_STORE=postgres to use it, or unset it",
            )?;
            vars.refuse(
                &[
                    "CONTROLPLANE_POOL_SIZE",
                    "CONTROLPLANE_DATABASE_SCHEMA",
                    "CONTROLPLANE_OUTCOME_COMMIT",
                ],
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

const DATABASE_URL: &str = "CONTROLPLANE_DATABASE_URL";
const DATABASE_URL_FILE: &str = "CONTROLPLANE_DATABASE_URL_FILE";

fn postgres_profile(vars: &Vars) -> Result<StoreProfile, ConfigError> {
    let (var, url) = value_or_file(vars, DATABASE_URL, DATABASE_URL_FILE)?.ok_or_else(|| {
        err(
            DATABASE_URL,
            format!(
                "required when CONTROLPLANE_STORE=postgres, e.g. postgres://user@127.0.0.1:5432/db \
                 (or {DATABASE_URL_FILE}, a file holding it)"
            ),
        )
    })?;
    let url = url.as_str();
    // libpq's forms: a URL (one host or several, `h1:5432,h2:5433`), or
    // key/value pairs (`host=h1,h2 port=5432,5433 ...`).
    let key_values = !url.contains("://") && url.contains('=');
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://") || key_values) {
        return Err(err(
            var,
            format!(
                "expected a postgres:// or postgresql:// URL (several hosts as h1:5432,h2:5433) \
                 or libpq's key/value form (host=h1,h2 port=5432,5433 ...), got {:?}",
                DatabaseUrl::new(url).redacted()
            ),
        ));
    }
    if DatabaseUrl::new(url).several_hosts()
        && !url
            .replace(' ', "&")
            .contains("target_session_attrs=read-write")
    {
        // The driver keeps the first host that answers: after a failover
        // that may be the old primary, now a standby, and the process would
        // stay on it, unable to write (issue 74's failover test saw it).
        return Err(err(
            var,
            "names several hosts without target_session_attrs=read-write: add it (e.g. \
             postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write), so that every \
             connection finds the primary",
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
    let synchronous_outcomes = match vars.get("CONTROLPLANE_OUTCOME_COMMIT") {
        None | Some("sync") => true,
        Some("async") => false,
        Some(other) => {
            return Err(err(
                "CONTROLPLANE_OUTCOME_COMMIT",
                format!("expected sync or async, got {other:?}"),
            ))
        }
    };
    Ok(StoreProfile::Postgres {
        url: DatabaseUrl::new(url),
        pool_size,
        schema: schema.to_string(),
        synchronous_outcomes,
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

/// The shortest admin token accepted: it reaches every account, so it must
/// not be guessable even without a rate limit in front of it.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

fn admin_token(vars: &Vars) -> Result<Option<Secret>, ConfigError> {
    const VAR: &str = "CONTROLPLANE_ADMIN_TOKEN";
    const FILE_VAR: &str = "CONTROLPLANE_ADMIN_TOKEN_FILE";
    // What a caller can send back: a bearer token is visible ASCII, and the
    // API reads at most MAX_TOKEN_BYTES of one.
    let sendable = |v: &str| {
        (MIN_ADMIN_TOKEN_BYTES..=MAX_TOKEN_BYTES).contains(&v.len())
            && v.bytes().all(|b| b.is_ascii_graphic())
    };
    let Some((var, token)) = value_or_file(vars, VAR, FILE_VAR)? else {
        return Ok(None);
    };
    if !sendable(&token) {
        return Err(err(
            var,
            "expected 32 to 256 visible ASCII characters, no spaces (use a long random value, \
             e.g. `openssl rand -hex 24`)",
        ));
    }
    Ok(Some(Secret::new(token)))
}

/// A secret setting, given either as the variable `var` itself or as
/// `file_var`, the path of a file holding it (a Compose or Kubernetes
/// secret), so that it need not sit in the process's environment. One
/// trailing newline (`\n` or `\r\n`) of the file is ignored; setting both is
/// an error. Returns the variable the value came from, for the caller's
/// errors, and the value.
fn value_or_file(
    vars: &Vars,
    var: &'static str,
    file_var: &'static str,
) -> Result<Option<(&'static str, String)>, ConfigError> {
    match (vars.get(var), vars.get(file_var)) {
        (Some(_), Some(_)) => Err(err(file_var, format!("set {var} or {file_var}, not both"))),
        (Some(v), None) => Ok(Some((var, v.to_string()))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path.trim())
                .map_err(|e| err(file_var, format!("cannot read {path:?}: {e}")))?;
            let line = text.strip_suffix('\n').unwrap_or(&text);
            let value = line.strip_suffix('\r').unwrap_or(line);
            Ok(Some((file_var, value.to_string())))
        }
        (None, None) => Ok(None),
    }
}

/// `CONTROLPLANE_HTTP_PROXY` (or its file) with `CONTROLPLANE_NO_PROXY`.
fn proxy(vars: &Vars) -> Result<Option<dispatcher::Proxy>, ConfigError> {
    let no_proxy = vars.get("CONTROLPLANE_NO_PROXY");
    let Some((var, url)) = value_or_file(
        vars,
        "CONTROLPLANE_HTTP_PROXY",
        "CONTROLPLANE_HTTP_PROXY_FILE",
    )?
    else {
        return match no_proxy {
            Some(_) => Err(err(
                "CONTROLPLANE_NO_PROXY",
                "is set but CONTROLPLANE_HTTP_PROXY is not: there is no proxy to bypass",
            )),
            None => Ok(None),
        };
    };
    dispatcher::Proxy::parse(url.trim(), no_proxy)
        .map(Some)
        .map_err(|e| match e.strip_prefix("CONTROLPLANE_NO_PROXY: ") {
            Some(entry) => err("CONTROLPLANE_NO_PROXY", entry),
            None => err(var, e),
        })
}

/// The API's address alone, for `healthcheck`, which must not fail on the
/// settings of a store it never opens.
///
/// # Errors
/// An unknown `CONTROLPLANE_*` key or a malformed `CONTROLPLANE_LISTEN`.
pub fn listen_address<I, K, V>(vars: I) -> Result<SocketAddr, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    listen(&Vars::known(vars)?)
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

/// A duration setting: `default` when unset, else a duration from `min` to
/// `max`; `expected` describes the accepted values in the error.
fn duration_in(
    vars: &Vars,
    var: &str,
    default: Duration,
    (min, max): (Duration, Duration),
    expected: &str,
) -> Result<Duration, ConfigError> {
    let Some(v) = vars.get(var) else {
        return Ok(default);
    };
    parse_duration(v)
        .filter(|d| *d >= min && *d <= max)
        .ok_or_else(|| err(var, format!("expected {expected}, got {v:?}")))
}

/// A setting with two values: the first is the default.
fn one_of<T>(vars: &Vars, var: &str, (a, b): ((&str, T), (&str, T))) -> Result<T, ConfigError> {
    match vars.get(var).map(str::trim) {
        None => Ok(a.1),
        Some(v) if v == a.0 => Ok(a.1),
        Some(v) if v == b.0 => Ok(b.1),
        Some(v) => Err(err(var, format!("expected {} or {}, got {v:?}", a.0, b.0))),
    }
}

fn quotas(vars: &Vars) -> Result<api::Quotas, ConfigError> {
    let d = api::Quotas::default();
    let number = |var: &str, lo: u32, hi: u32, default: u32| match vars.get(var) {
        Some(v) => parse_u32_in(var, v, lo, hi),
        None => Ok(default),
    };
    let schema_bytes = u32::try_from(d.schema_bytes).unwrap_or(u32::MAX);
    Ok(api::Quotas {
        endpoints: number("CONTROLPLANE_QUOTA_ENDPOINTS", 1, 1_000_000, d.endpoints)?,
        event_types: number(
            "CONTROLPLANE_QUOTA_EVENT_TYPES",
            1,
            1_000_000,
            d.event_types,
        )?,
        schema_bytes: number(
            "CONTROLPLANE_QUOTA_SCHEMA_BYTES",
            1024,
            1 << 30,
            schema_bytes,
        )?
        .into(),
    })
}

fn server_limits(vars: &Vars) -> Result<api::ServerLimits, ConfigError> {
    let defaults = api::ServerLimits::default();
    Ok(api::ServerLimits {
        header_timeout: duration_in(
            vars,
            "CONTROLPLANE_HTTP_HEADER_TIMEOUT",
            defaults.header_timeout,
            (Duration::from_secs(1), Duration::from_secs(300)),
            "a duration from 1s to 5m like 10s",
        )?,
        max_connections: match vars.get("CONTROLPLANE_HTTP_MAX_CONNECTIONS") {
            Some(v) => {
                let n = parse_u32_in("CONTROLPLANE_HTTP_MAX_CONNECTIONS", v, 1, 1_000_000)?;
                usize::try_from(n).unwrap_or(defaults.max_connections)
            }
            None => defaults.max_connections,
        },
        ..defaults
    })
}

fn lease(vars: &Vars) -> Result<Duration, ConfigError> {
    let bounds = (Duration::from_secs(1), Duration::from_secs(3600));
    let expected = "a duration from 1s to 1h like 30s";
    duration_in(
        vars,
        "CONTROLPLANE_LEASE",
        Duration::from_secs(30),
        bounds,
        expected,
    )
}

fn slow_answer(vars: &Vars) -> Result<Duration, ConfigError> {
    let bounds = (Duration::from_millis(10), Duration::from_secs(3600));
    let expected = "a duration from 10ms to 1h like 1s or 500ms";
    duration_in(
        vars,
        "CONTROLPLANE_SLOW_ANSWER",
        Duration::from_secs(1),
        bounds,
        expected,
    )
}

fn outcome_linger(vars: &Vars) -> Result<Duration, ConfigError> {
    let bounds = (Duration::ZERO, Duration::from_millis(100));
    let expected = "a duration from 0s to 100ms like 5ms";
    let default = dispatcher::OUTCOME_LINGER;
    duration_in(
        vars,
        "CONTROLPLANE_OUTCOME_LINGER",
        default,
        bounds,
        expected,
    )
}

fn migrations(vars: &Vars) -> Result<Migrations, ConfigError> {
    let choices = (("true", Migrations::Apply), ("false", Migrations::Refuse));
    one_of(vars, "CONTROLPLANE_AUTO_MIGRATE", choices)
}

fn retention(vars: &Vars) -> Result<Duration, ConfigError> {
    let bounds = (Duration::from_secs(60), Duration::MAX);
    let expected = "a duration of at least 1m like 30d or 12h";
    duration_in(
        vars,
        "CONTROLPLANE_RETENTION",
        Duration::from_secs(30 * 86_400),
        bounds,
        expected,
    )
}

fn log_format(vars: &Vars) -> Result<LogFormat, ConfigError> {
    one_of(
        vars,
        "CONTROLPLANE_LOG_FORMAT",
        (("text", LogFormat::Text), ("json", LogFormat::Json)),
    )
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
        assert_eq!(c.slow_answer, Duration::from_secs(1));
        assert_eq!(c.claim_ahead, 100);
        assert_eq!(c.migrations, Migrations::Apply);
        assert_eq!(c.retention, Duration::from_secs(30 * 86_400));
        assert_eq!((c.log.as_str(), c.log_format), ("info", LogFormat::Text));
    }

    #[test]
    fn the_portal_frame_ancestors_are_read_and_checked() {
        assert!(parse(&[]).unwrap().portal_frame_ancestors.is_none());
        let v = "'self' https://app.example.com";
        let c = parse(&[("CONTROLPLANE_PORTAL_FRAME_ANCESTORS", v)]).unwrap();
        assert_eq!(c.portal_frame_ancestors.as_str(), v);
        let e = parse(&[("CONTROLPLANE_PORTAL_FRAME_ANCESTORS", "*; script-src *")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_PORTAL_FRAME_ANCESTORS");
        assert!(e.message.contains("expected"), "{e}");
    }

    #[test]
    fn operator_settings_parse() {
        let c = parse(&[
            ("CONTROLPLANE_AUTO_MIGRATE", "false"),
            ("CONTROLPLANE_RETENTION", "12h"),
            ("CONTROLPLANE_LOG", "debug"),
            ("CONTROLPLANE_LOG_FORMAT", "json"),
            ("CONTROLPLANE_HTTP_HEADER_TIMEOUT", "3s"),
            ("CONTROLPLANE_HTTP_BODY_TIMEOUT", "1m"),
            ("CONTROLPLANE_HTTP_MAX_CONNECTIONS", "100"),
            ("CONTROLPLANE_QUOTA_ENDPOINTS", "5"),
            ("CONTROLPLANE_QUOTA_SCHEMA_BYTES", "2048"),
        ])
        .unwrap();
        assert_eq!((c.quotas.endpoints, c.quotas.event_types), (5, 1000));
        assert_eq!(c.quotas.schema_bytes, 2048);
        assert_eq!(c.server.header_timeout, Duration::from_secs(3));
        assert_eq!(c.server.max_connections, 100);
        assert_eq!(c.body_timeout, Duration::from_secs(60));
        let d = parse(&[]).unwrap();
        assert_eq!(d.server, api::ServerLimits::default());
        assert_eq!(d.body_timeout, Duration::from_secs(30));
        assert_eq!(c.migrations, Migrations::Refuse);
        assert_eq!(c.retention, Duration::from_secs(12 * 3600));
        assert_eq!((c.log.as_str(), c.log_format), ("debug", LogFormat::Json));
    }

    #[test]
    fn the_admin_token_comes_from_the_variable_or_its_file_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let token = "t".repeat(40);
        std::fs::write(&file, format!("{token}\n")).unwrap();
        let path = file.to_string_lossy().into_owned();
        let c = parse(&[("CONTROLPLANE_ADMIN_TOKEN_FILE", path.as_str())]).unwrap();
        assert_eq!(c.admin_token.unwrap().expose(), token);
        let both = parse(&[
            ("CONTROLPLANE_ADMIN_TOKEN_FILE", path.as_str()),
            ("CONTROLPLANE_ADMIN_TOKEN", token.as_str()),
        ])
        .unwrap_err();
        assert_eq!(both.variable, "CONTROLPLANE_ADMIN_TOKEN_FILE");
        let missing = dir.path().join("absent").to_string_lossy().into_owned();
        let e = parse(&[("CONTROLPLANE_ADMIN_TOKEN_FILE", missing.as_str())]).unwrap_err();
        assert!(e.message.contains("cannot read"), "{e}");
        // The file's token is held to the variable's rules.
        std::fs::write(&file, "short\n").unwrap();
        let e = parse(&[("CONTROLPLANE_ADMIN_TOKEN_FILE", path.as_str())]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_ADMIN_TOKEN_FILE");
        std::fs::write(&file, format!("{token}\n\n")).unwrap();
        assert!(parse(&[("CONTROLPLANE_ADMIN_TOKEN_FILE", path.as_str())]).is_err());
    }

    #[test]
    fn a_worker_binds_its_probes_only_when_listen_is_set() {
        assert!(!parse(&[]).unwrap().listen_set);
        let c = parse(&[("CONTROLPLANE_LISTEN", "127.0.0.1:9000")]).unwrap();
        assert!(c.listen_set);
    }

    #[test]
    fn the_healthcheck_reads_the_listen_address_alone() {
        let vars = [
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_LISTEN", "0.0.0.0:9090"),
        ];
        // A store profile that `serve` would refuse (no database URL)…
        assert!(parse(&vars).is_err());
        // …does not stop the probe.
        assert_eq!(listen_address(vars).unwrap().to_string(), "0.0.0.0:9090");
        assert!(listen_address([("CONTROLPLANE_LISTEN", "nowhere")]).is_err());
        assert_eq!(
            listen_address([("CONTROLPLANE_NOPE", "1")])
                .unwrap_err()
                .variable,
            "CONTROLPLANE_NOPE"
        );
    }

    #[test]
    fn every_variable_names_its_default_and_commands() {
        for v in VARIABLES {
            assert!(v.name.starts_with("CONTROLPLANE_"), "{v:?}");
            assert!(!v.default.is_empty() && !v.help.is_empty(), "{v:?}");
            assert!(!v.commands.is_empty(), "{v:?}");
            assert!(
                v.commands.iter().all(|c| COMMANDS.contains(c)),
                "{v:?} names an unknown command"
            );
        }
    }

    #[test]
    fn a_database_url_may_name_several_hosts_or_be_key_values() {
        for url in [
            "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
            "host=h1,h2 port=5432,5433 user=u dbname=db target_session_attrs=read-write",
        ] {
            let c = parse(&[
                ("CONTROLPLANE_STORE", "postgres"),
                ("CONTROLPLANE_DATABASE_URL", url),
                ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            ]);
            assert!(c.is_ok(), "{url}: {:?}", c.err());
        }
        let e = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_DATABASE_URL", "mysql://h/db"),
            ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
        ])
        .unwrap_err();
        assert!(e.message.contains("key/value"), "{e}");
        // Several hosts without read-write sessions could stay on a standby.
        for url in [
            "postgres://u@h1:5432,h2:5433/db",
            "postgres://u@h1,h2/db?target_session_attrs=any",
            "host=h1,h2 port=5432,5433 user=u dbname=db",
        ] {
            let e = parse(&[
                ("CONTROLPLANE_STORE", "postgres"),
                ("CONTROLPLANE_DATABASE_URL", url),
                ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            ])
            .unwrap_err();
            assert!(
                e.message.contains("target_session_attrs=read-write"),
                "{url}: {e}"
            );
        }
        assert!(!DatabaseUrl::new("postgres://u:p,w@h1/db").several_hosts());
    }

    #[test]
    fn postgres_requires_a_database_url() {
        let e = parse(&[("CONTROLPLANE_STORE", "postgres")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_DATABASE_URL");
        let c = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://u:pw@h/db"),
            ("CONTROLPLANE_POOL_SIZE", "4"),
            ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
        ])
        .unwrap();
        assert!(matches!(
            c.store,
            StoreProfile::Postgres { pool_size: 4, .. }
        ));
    }

    #[test]
    fn the_database_url_comes_from_the_variable_or_its_file_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("database-url");
        std::fs::write(&file, "postgres://app:hunter2@db:5432/x\r\n").unwrap();
        let path = file.to_string_lossy().into_owned();
        let pg = |extra: &[(&'static str, &str)]| {
            let mut vars = vec![
                ("CONTROLPLANE_STORE", "postgres"),
                ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            ];
            vars.extend_from_slice(extra);
            parse(&vars)
        };
        let c = pg(&[("CONTROLPLANE_DATABASE_URL_FILE", path.as_str())]).unwrap();
        let StoreProfile::Postgres { url, .. } = c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(url.expose(), "postgres://app:hunter2@db:5432/x");
        let both = pg(&[
            ("CONTROLPLANE_DATABASE_URL_FILE", path.as_str()),
            ("CONTROLPLANE_DATABASE_URL", "postgres://u@h/db"),
        ])
        .unwrap_err();
        assert_eq!(both.variable, "CONTROLPLANE_DATABASE_URL_FILE");
        let missing = dir.path().join("absent").to_string_lossy().into_owned();
        let e = pg(&[("CONTROLPLANE_DATABASE_URL_FILE", missing.as_str())]).unwrap_err();
        assert!(e.message.contains("cannot read"), "{e}");
        // The file's URL is held to the variable's rules, and named by the
        // variable that gave it, without its password.
        std::fs::write(&file, "mysql://app:hunter2@db/x\n").unwrap();
        let e = pg(&[("CONTROLPLANE_DATABASE_URL_FILE", path.as_str())]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_DATABASE_URL_FILE");
        assert!(!e.message.contains("hunter2"), "{e}");
        // The missing-URL error names the file form too.
        let e = pg(&[]).unwrap_err();
        assert!(e.message.contains("CONTROLPLANE_DATABASE_URL_FILE"), "{e}");
        // Like the variable, it belongs to the postgres profile alone.
        let e = parse(&[("CONTROLPLANE_DATABASE_URL_FILE", path.as_str())]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_DATABASE_URL_FILE");
        assert!(e.message.contains("embedded"), "{e}");
    }

    #[test]
    fn outcome_commits_are_sync_unless_async_is_asked_and_only_on_postgres() {
        let pg = |v: Option<&'static str>| {
            let mut vars = vec![
                ("CONTROLPLANE_STORE", "postgres"),
                ("CONTROLPLANE_DATABASE_URL", "postgres://u:pw@h/db"),
                ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            ];
            vars.extend(v.map(|v| ("CONTROLPLANE_OUTCOME_COMMIT", v)));
            parse(&vars)
        };
        for (v, sync) in [(None, true), (Some("async"), false), (Some("sync"), true)] {
            assert!(
                matches!(
                    pg(v).unwrap().store,
                    StoreProfile::Postgres { synchronous_outcomes, .. } if synchronous_outcomes == sync
                ),
                "{v:?}"
            );
        }
        let e = pg(Some("off")).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_OUTCOME_COMMIT");
        assert!(e.message.contains("sync or async"), "{}", e.message);
        let e = parse(&[("CONTROLPLANE_OUTCOME_COMMIT", "sync")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_OUTCOME_COMMIT");
    }

    #[test]
    fn postgres_requires_a_shared_key_file_and_embedded_makes_its_own() {
        let e = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://u:pw@h/db"),
        ])
        .unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_SECRET_KEY_FILE");
        let c = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://u:pw@h/db"),
            ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            (
                "CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES",
                "/run/old1, /run/old2",
            ),
        ])
        .unwrap();
        assert_eq!(
            c.secret_keys,
            SecretKeyFiles {
                current: PathBuf::from("/run/key"),
                create_if_missing: false,
                previous: vec![PathBuf::from("/run/old1"), PathBuf::from("/run/old2")],
            }
        );
        let c = parse(&[("CONTROLPLANE_EMBEDDED_PATH", "/data/cp.duckdb")]).unwrap();
        assert_eq!(c.secret_keys.current, PathBuf::from("/data/cp.duckdb.key"));
        assert!(c.secret_keys.create_if_missing && c.secret_keys.previous.is_empty());
    }

    #[test]
    fn unknown_store_fails_closed_naming_the_accepted_ones() {
        let e = parse(&[("CONTROLPLANE_STORE", "sqlite")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_STORE");
        assert!(e.message.contains("embedded") && e.message.contains("postgres"));
    }

    #[test]
    fn the_test_suites_variables_are_not_the_services() {
        let c = parse(&[(
            "CONTROLPLANE_TEST_DATABASE_URL",
            "postgres://postgres@127.0.0.1/test",
        )])
        .unwrap();
        assert!(matches!(c.store, StoreProfile::Embedded { .. }));
        assert!(
            parse(&[("CONTROLPLANE_TESTING", "1")]).is_err(),
            "only the prefix"
        );
    }

    #[test]
    fn unknown_controlplane_key_fails_closed() {
        let e = parse(&[("CONTROLPLANE_STOER", "embedded")]).unwrap_err();
        assert_eq!(e.variable, "CONTROLPLANE_STOER");
        assert!(e.message.contains("CONTROLPLANE_STORE"));
    }

    #[test]
    fn compose_variables_fail_closed_saying_whose_they_are() {
        for name in COMPOSE_ONLY {
            let e = parse(&[(*name, "8080")]).unwrap_err();
            assert_eq!(e.variable, *name);
            assert!(e.message.contains("Compose"), "{e}");
            assert!(e.message.contains("CONTROLPLANE_LISTEN"), "{e}");
        }
    }

    /// Every `CONTROLPLANE_*` name the Compose files interpolate is either
    /// one the binary reads or one it refuses as Compose's own.
    #[test]
    fn the_compose_files_name_only_known_or_compose_only_variables() {
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
        let mut seen = 0;
        for entry in std::fs::read_dir(deploy).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "yml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for part in text.split("${").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    is_known(&name) || COMPOSE_ONLY.contains(&name.as_str()),
                    "{} interpolates {name}, which is neither a setting nor in COMPOSE_ONLY",
                    path.display()
                );
                seen += 1;
            }
        }
        assert!(seen > 0, "no Compose file under {deploy}");
    }

    #[test]
    fn auto_migrate_is_in_the_help_of_every_command_that_opens_the_store_unmigrated() {
        let v = VARIABLES
            .iter()
            .find(|v| v.name == "CONTROLPLANE_AUTO_MIGRATE")
            .unwrap();
        // `migrate` migrates whatever the setting; `healthcheck` opens nothing.
        for command in ["serve", "api", "worker", "status", "rotate-key"] {
            assert!(v.commands.contains(&command), "{command}");
        }
    }

    #[test]
    fn outcome_batches_linger_5ms_unless_set_and_0s_never_waits() {
        assert_eq!(parse(&[]).unwrap().outcome_linger, Duration::from_millis(5));
        let never = parse(&[("CONTROLPLANE_OUTCOME_LINGER", "0s")]).unwrap();
        assert_eq!(never.outcome_linger, Duration::ZERO);
        let most = parse(&[("CONTROLPLANE_OUTCOME_LINGER", "100ms")]).unwrap();
        assert_eq!(most.outcome_linger, Duration::from_millis(100));
    }

    #[test]
    fn kept_answer_bytes_default_to_4096_and_may_be_0() {
        assert_eq!(parse(&[]).unwrap().response_body_bytes, 4096);
        let none = parse(&[("CONTROLPLANE_RESPONSE_BODY_BYTES", "0")]).unwrap();
        assert_eq!(none.response_body_bytes, 0);
    }

    #[test]
    fn the_egress_proxy_is_read_checked_and_never_shown() {
        assert_eq!(parse(&[]).unwrap().proxy, None);
        let c = parse(&[
            (
                "CONTROLPLANE_HTTP_PROXY",
                "http://u:hunter2@proxy.internal:3128",
            ),
            ("CONTROLPLANE_NO_PROXY", "internal,10.0.0.0/8"),
        ])
        .unwrap();
        assert!(c.proxy.is_some());
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        for (vars, variable) in [
            (
                vec![("CONTROLPLANE_NO_PROXY", "internal")],
                "CONTROLPLANE_NO_PROXY",
            ),
            (
                vec![("CONTROLPLANE_HTTP_PROXY", "https://proxy:3128")],
                "CONTROLPLANE_HTTP_PROXY",
            ),
            (
                vec![
                    ("CONTROLPLANE_HTTP_PROXY", "http://proxy:3128"),
                    ("CONTROLPLANE_NO_PROXY", "example.com:443"),
                ],
                "CONTROLPLANE_NO_PROXY",
            ),
        ] {
            let e = parse(&vars).unwrap_err();
            assert_eq!(e.variable, variable, "{vars:?}: {e}");
        }
    }

    #[test]
    fn malformed_values_name_their_variable() {
        let long = "x".repeat(257);
        for (k, v) in [
            ("CONTROLPLANE_LISTEN", "nope"),
            ("CONTROLPLANE_LEASE", "30"),
            ("CONTROLPLANE_LEASE", "0s"),
            ("CONTROLPLANE_SLOW_ANSWER", "1ms"),
            ("CONTROLPLANE_SLOW_ANSWER", "2h"),
            ("CONTROLPLANE_OUTCOME_LINGER", "101ms"),
            ("CONTROLPLANE_OUTCOME_LINGER", "soon"),
            ("CONTROLPLANE_CONCURRENCY", "0"),
            ("CONTROLPLANE_CLAIM_AHEAD", "10001"),
            ("CONTROLPLANE_CLAIM_AHEAD", "-1"),
            ("CONTROLPLANE_RETRY_SCHEDULE", "5s,x"),
            ("CONTROLPLANE_ALLOWED_TARGETS", "10.0.0.0/33"),
            ("CONTROLPLANE_ADMIN_TOKEN", "short"),
            (
                "CONTROLPLANE_ADMIN_TOKEN",
                "thirty-one-characters-long-0123",
            ),
            ("CONTROLPLANE_ADMIN_TOKEN", "has spaces in the middle of it"),
            ("CONTROLPLANE_ADMIN_TOKEN", long.as_str()),
            ("CONTROLPLANE_POOL_SIZE", "4"),
            ("CONTROLPLANE_DATABASE_URL", "postgres://x/y"),
            ("CONTROLPLANE_DATABASE_SCHEMA", "s"),
            ("CONTROLPLANE_AUTO_MIGRATE", "yes"),
            ("CONTROLPLANE_RETENTION", "30"),
            ("CONTROLPLANE_RETENTION", "10s"),
            ("CONTROLPLANE_LOG_FORMAT", "xml"),
            ("CONTROLPLANE_SECRET_KEY_FILE", " "),
            ("CONTROLPLANE_RESPONSE_BODY_BYTES", "65537"),
            ("CONTROLPLANE_RESPONSE_BODY_BYTES", "-1"),
            ("CONTROLPLANE_HTTP_HEADER_TIMEOUT", "0s"),
            ("CONTROLPLANE_HTTP_HEADER_TIMEOUT", "1h"),
            ("CONTROLPLANE_HTTP_BODY_TIMEOUT", "500ms"),
            ("CONTROLPLANE_HTTP_MAX_CONNECTIONS", "0"),
            ("CONTROLPLANE_QUOTA_ENDPOINTS", "0"),
            ("CONTROLPLANE_QUOTA_SCHEMA_BYTES", "10"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            assert_eq!(e.variable, k, "{k}={v}");
        }
    }

    #[test]
    fn debug_redacts_passwords_and_tokens() {
        let c = parse(&[
            ("CONTROLPLANE_STORE", "postgres"),
            ("CONTROLPLANE_SECRET_KEY_FILE", "/run/key"),
            (
                "CONTROLPLANE_DATABASE_URL",
                "postgres://app:hunter2@db/x?password=hunter3",
            ),
            (
                "CONTROLPLANE_ADMIN_TOKEN",
                "tok-0123456789abcdef0123456789abcdef",
            ),
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
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("30"), None);
        let n = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(n.contains("127.1.2.3".parse().unwrap()));
        assert!(!n.contains("128.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
    }

    /// README's configuration table has a row for every variable the resolver
    /// accepts, with the same default, and no row for a variable it refuses.
    #[test]
    fn readme_documents_every_variable_with_its_default() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
                .unwrap();
        for v in VARIABLES {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", v.name)))
                .unwrap_or_else(|| panic!("README has no row for {}", v.name));
            if !v.default.starts_with('(') {
                assert!(
                    row.contains(&format!("| `{}` |", v.default)),
                    "README's default for {} differs from `{}`: {row}",
                    v.name,
                    v.default
                );
            }
        }
        for row in readme.lines().filter(|l| l.starts_with("| `CONTROLPLANE_")) {
            let name = row.split('`').nth(1).unwrap_or_default();
            assert!(
                is_known(name) || name.starts_with("CONTROLPLANE_TEST"),
                "README documents {name}, which the resolver refuses"
            );
        }
    }
}
