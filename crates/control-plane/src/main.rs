//! `control-plane`: resolves the store profile from `CONTROLPLANE_*` variables
//! (failing closed) and runs a role. See README.md for every command.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use control_plane_core::DynControlPlaneStore;

use crate::config::{Config, VARIABLES};

/// mimalloc (its v2 line) for the whole process: with its `override`
/// feature it also serves the `malloc` and `free` of the bundled DuckDB,
/// which spends much of each statement allocating (ADR 0029).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod config;
mod healthcheck;
mod logs;
mod loops;
mod service;
mod store;
mod tasks;

/// The durable control plane for webhook delivery and leased work.
#[derive(Parser)]
#[command(
    name = "control-plane",
    version,
    about,
    after_help = "Configuration comes from CONTROLPLANE_* environment variables (an unknown one \
                  stops the boot); `control-plane <command> --help` lists those a command reads."
)]
struct Cli {
    #[command(subcommand)]
    command: Role,
}

/// What the process does.
#[derive(Subcommand, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Run the HTTP API and the workers (webhook delivery, workflow tasks,
    /// maintenance) until SIGINT or SIGTERM.
    Serve,
    /// Run the HTTP API alone (postgres; needs CONTROLPLANE_ADMIN_TOKEN).
    Api,
    /// Run the workers alone (postgres).
    Worker,
    /// Create or upgrade the store's schema, then exit.
    Migrate,
    /// Print deliveries by state, open circuits and disabled endpoints as JSON, then exit.
    Status,
    /// Seal every endpoint secret under the key of CONTROLPLANE_SECRET_KEY_FILE
    /// (plain text and secrets under CONTROLPLANE_PREVIOUS_SECRET_KEY_FILES),
    /// in batches, then exit.
    RotateKey,
    /// Ask the running service's /readyz on CONTROLPLANE_LISTEN (a wildcard
    /// address is asked on loopback); exit 0 when it answers 200, 1
    /// otherwise. For container health checks: the image needs no HTTP client.
    Healthcheck,
    /// Run one endpoint's jq program on a body read from stdin (the
    /// service starts this itself, one process per transformation; ADR 0050).
    #[command(hide = true)]
    Transform,
}

impl Role {
    /// The command's name as typed.
    pub fn name(self) -> &'static str {
        match self {
            Role::Serve => "serve",
            Role::Api => "api",
            Role::Worker => "worker",
            Role::Migrate => "migrate",
            Role::Status => "status",
            Role::RotateKey => "rotate-key",
            Role::Healthcheck => "healthcheck",
            Role::Transform => "transform",
        }
    }
}

/// The variables `command` reads, with their defaults, for its `--help`.
fn variables_help(command: &str) -> String {
    let mut out = String::from("Environment (default in brackets):\n");
    for v in VARIABLES.iter().filter(|v| v.commands.contains(&command)) {
        out.push_str(&format!("  {} [{}]\n      {}\n", v.name, v.default, v.help));
    }
    out
}

/// The parsed command line; clap prints help, version and usage errors itself.
fn parse_args() -> Role {
    let mut cmd = Cli::command();
    for role in [
        Role::Serve,
        Role::Api,
        Role::Worker,
        Role::Migrate,
        Role::Status,
        Role::RotateKey,
        Role::Healthcheck,
    ] {
        let name = role.name();
        cmd = cmd.mut_subcommand(name, |c| c.after_help(variables_help(name)));
    }
    let matches = cmd.get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli.command,
        Err(e) => e.exit(),
    }
}

/// Raises the soft limit of open files to the hard limit: every send, kept
/// connection, pooled database connection and API client is a descriptor,
/// and soft limits are often 1,024. Best effort: a refusal leaves the limit.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.maximum.is_some() && limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

fn main() -> ExitCode {
    // Every file this process creates (the embedded store, its write-ahead
    // log, a generated admin token) is readable by its user only.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    raise_open_files_limit();
    let role = parse_args();
    if role == Role::Transform {
        return dispatcher::transform::worker_main();
    }
    if role == Role::Healthcheck {
        return run_healthcheck();
    }
    let config = match Config::from_vars(std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("control-plane: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let checked = store::check_compiled(&config)
        .and_then(|()| store::check_role(role, &config))
        .and_then(|()| logs::init(&config));
    let installed = match checked {
        Ok(installed) => installed,
        Err(e) => {
            eprintln!("control-plane: {e}");
            return ExitCode::from(2);
        }
    };
    let code = match tokio::runtime::Runtime::new() {
        Ok(runtime) => match runtime.block_on(run(role, config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    };
    // After the runtime is gone: the span exporter's last export blocks.
    installed.shutdown();
    code
}

/// `healthcheck`: 0 when the service on `CONTROLPLANE_LISTEN` is ready, 1
/// otherwise (a configuration error included: a container's health check
/// knows only those two).
fn run_healthcheck() -> ExitCode {
    let checked = config::listen_address(std::env::vars()).map_err(|e| e.to_string());
    match checked.and_then(|listen| {
        healthcheck::check(healthcheck::probe_address(listen), healthcheck::TIMEOUT)
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("control-plane: healthcheck: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Endpoints `rotate-key` reseals per transaction.
const RESEAL_BATCH: u32 = 500;

async fn run(role: Role, config: Config) -> Result<(), String> {
    let store: DynControlPlaneStore = store::open_store(role, &config).await?;
    match role {
        Role::Migrate => {
            println!("schema of the {} store is up to date", store.backend_name());
            Ok(())
        }
        Role::Status => {
            let status = store_status(&store).await.map_err(|e| e.to_string())?;
            println!("{status}");
            Ok(())
        }
        Role::RotateKey => {
            let mut sealed = 0;
            let mut retries = 0;
            loop {
                let n = match store.endpoint_reseal_secrets(RESEAL_BATCH).await {
                    Ok(n) => n,
                    // A batch that met a deadlock or a serialization failure
                    // changed nothing; it is run again.
                    Err(e) if e.is_retryable() && retries < 10 => {
                        retries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(100 * retries)).await;
                        continue;
                    }
                    Err(e) => {
                        return Err(format!("rotate-key stopped after {sealed} endpoints: {e}"))
                    }
                };
                retries = 0;
                if n == 0 {
                    break;
                }
                sealed += n;
                tracing::info!(sealed, "resealed a batch of endpoint secrets");
            }
            println!("the secrets of {sealed} endpoints were resealed under the current key");
            Ok(())
        }
        // Answered in `main` before any store is opened.
        Role::Healthcheck | Role::Transform => Err(format!("{} opens no store", role.name())),
        Role::Serve | Role::Api | Role::Worker => {
            store.ping().await.map_err(|e| e.to_string())?;
            service::run_service(role, &config, store).await
        }
    }
}

/// Deliveries by state, open circuits and disabled endpoints, across accounts.
async fn store_status(
    store: &DynControlPlaneStore,
) -> control_plane_core::StoreResult<serde_json::Value> {
    let counts = store.delivery_count_by_state().await?;
    let deliveries: serde_json::Map<String, serde_json::Value> = counts
        .into_iter()
        .map(|(s, n)| (s.as_str().to_string(), n.into()))
        .collect();
    Ok(serde_json::json!({
        "store": store.backend_name(),
        "deliveries": deliveries,
        "open_circuits": store.circuit_count_open().await?,
        "disabled_endpoints": store.endpoint_count_disabled().await?,
    }))
}
