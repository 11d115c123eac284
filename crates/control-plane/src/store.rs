//! Profile to store: the only place that knows the adapters. It refuses a
//! profile this binary was built without, or one a role cannot use, opens
//! the store with the service's options and its sealing keys.

use std::sync::Arc;

use crate::config::{Config, SecretKeyFiles, StoreProfile};
use control_plane_core::Migrations;
use control_plane_core::{DynControlPlaneStore, StoreOptions, SystemClock};
use control_plane_store_kit::{SecretKey, SecretKeys};

use crate::Role;

/// Refuses, before anything starts, a profile this binary was built without
/// (cargo features `embedded` and `postgres`).
pub fn check_compiled(config: &Config) -> Result<(), String> {
    let (feature, compiled) = match config.store {
        StoreProfile::Embedded { .. } => ("embedded", cfg!(feature = "embedded")),
        StoreProfile::Postgres { .. } => ("postgres", cfg!(feature = "postgres")),
    };
    if compiled {
        return Ok(());
    }
    Err(format!(
        "CONTROLPLANE_STORE={feature}, but this control-plane was built without the `{feature}` cargo feature; \
         build it with `--features {feature}` (both profiles are default features) or choose another store"
    ))
}

/// Refuses what the role cannot run with, before anything is opened: a role
/// split on a profile that cannot serve it, `api` without a shared token.
pub fn check_role(role: Role, config: &Config) -> Result<(), String> {
    if matches!(role, Role::Api | Role::Worker)
        && matches!(config.store, StoreProfile::Embedded { .. })
    {
        return Err(format!(
            "the {} role alone needs CONTROLPLANE_STORE=postgres: one embedded DuckDB file serves one process, so run `control-plane serve` for both roles",
            role.name()
        ));
    }
    if role == Role::Api && config.admin_token.is_none() {
        return Err(API_NEEDS_TOKEN.into());
    }
    Ok(())
}

pub(crate) const API_NEEDS_TOKEN: &str =
    "the api role needs CONTROLPLANE_ADMIN_TOKEN (every replica must accept the same token)";

/// The store's policy: one attempt, then one per delay of the retry schedule;
/// `migrate` always applies the migrations, whatever `CONTROLPLANE_AUTO_MIGRATE` says.
fn store_options(role: Role, config: &Config) -> StoreOptions {
    StoreOptions {
        max_attempts: u32::try_from(config.retry_schedule.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        endpoint_concurrency: config.endpoint_concurrency,
        migrations: match role {
            Role::Migrate => Migrations::Apply,
            _ => config.migrations,
        },
        ..StoreOptions::default()
    }
}

/// Opens the store the profile names.
pub async fn open_store(role: Role, config: &Config) -> Result<DynControlPlaneStore, String> {
    let options = store_options(role, config);
    let (keys, created) = load_keys(&config.secret_keys)?;
    let opened = match &config.store {
        StoreProfile::Embedded { path } => open_embedded(path, options, keys).await,
        StoreProfile::Postgres {
            url,
            pool_size,
            schema,
            synchronous_outcomes,
        } => {
            let pg = PostgresSettings {
                pool_size: *pool_size,
                schema,
                synchronous_outcomes: *synchronous_outcomes,
            };
            open_postgres(url, pg, options, keys).await
        }
    };
    // A key made for a store that then did not open (it holds values under
    // another key, or its file is held) would stand where the right key
    // file has to be restored: it goes again.
    if opened.is_err() && created {
        let _ = std::fs::remove_file(&config.secret_keys.current);
    }
    opened
}

/// The keys that seal endpoint secrets (ADR 0022), read from their files;
/// the embedded default's file is created with a new key when missing (the
/// `bool` says so).
fn load_keys(files: &SecretKeyFiles) -> Result<(SecretKeys, bool), String> {
    let created = files.create_if_missing && !files.current.exists();
    let current = if created {
        let key = SecretKey::generate();
        write_private(&files.current, &format!("{}\n", key.to_text()), false).map_err(|e| {
            format!(
                "cannot create the secret key file {}: {e}; set CONTROLPLANE_SECRET_KEY_FILE",
                files.current.display()
            )
        })?;
        tracing::info!(
            path = %files.current.display(),
            key_id = key.id(),
            "created the key that seals endpoint secrets; keep it, and back it up apart from the store"
        );
        key
    } else {
        read_key(&files.current)?
    };
    let previous = files
        .previous
        .iter()
        .map(|p| read_key(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((SecretKeys::new(current, previous), created))
}

fn read_key(path: &std::path::Path) -> Result<SecretKey, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the secret key file {shown}: {e}"))?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %shown, "the secret key file is readable by other users; chmod 600 it");
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the secret key file {shown}: {e}"))?;
    SecretKey::parse(&text).map_err(|e| format!("the secret key file {shown}: {e}"))
}

/// The embedded store at `path`; an error when the binary was built
/// without it.
async fn open_embedded(
    path: &std::path::Path,
    options: StoreOptions,
    keys: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    #[cfg(feature = "embedded")]
    {
        let cfg = store_embedded::EmbeddedConfig {
            options,
            keys,
            ..store_embedded::EmbeddedConfig::new(path)
        };
        let store = store_embedded::EmbeddedStore::open(cfg, Arc::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(store))
    }
    #[cfg(not(feature = "embedded"))]
    {
        let _ = (path, options, keys);
        Err("built without the `embedded` feature".into())
    }
}

/// The postgres profile's settings besides its URL.
struct PostgresSettings<'a> {
    pool_size: u32,
    schema: &'a str,
    synchronous_outcomes: bool,
}

/// The postgres store at `url` with `pg`; an error when the binary was
/// built without it.
async fn open_postgres(
    url: &control_plane_store_kit::DatabaseUrl,
    pg: PostgresSettings<'_>,
    options: StoreOptions,
    keys: SecretKeys,
) -> Result<DynControlPlaneStore, String> {
    #[cfg(feature = "postgres")]
    {
        let mut cfg = store_postgres::PostgresConfig::new(url.clone());
        cfg.pool_size = pg.pool_size;
        cfg.schema = Some(pg.schema.to_string());
        cfg.synchronous_outcomes = pg.synchronous_outcomes;
        cfg.options = options;
        cfg.keys = keys;
        let store = store_postgres::PostgresStore::open(cfg, Arc::new(SystemClock))
            .await
            .map_err(|e| format!("cannot open the postgres store at {}: {e}", url.redacted()))?;
        Ok(Arc::new(store))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (url, pg, options, keys);
        Err("built without the `postgres` feature".into())
    }
}

/// Writes `text` to `path`, readable and writable by this user only (mode
/// 0600, also when the file existed); an existing file is replaced when
/// `replace`, refused otherwise.
pub(crate) fn write_private(
    path: &std::path::Path,
    text: &str,
    replace: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(replace)
        .create_new(!replace)
        .truncate(replace)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}
