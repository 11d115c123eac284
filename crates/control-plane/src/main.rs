//! `control-plane`: resolves the store profile from `CONTROLPLANE_*` variables
//! (failing closed) and runs a role. See README.md for every command.

use std::process::ExitCode;

use control_plane_core::{Config, DynControlPlaneStore};

mod wiring;

const USAGE: &str = "usage: control-plane <command>

commands:
  serve    run the HTTP API and the workers (webhook delivery, workflow
           tasks, maintenance) until SIGINT or SIGTERM
  api      the HTTP API alone (needs CONTROLPLANE_STORE=postgres and
           CONTROLPLANE_ADMIN_TOKEN)
  worker   the workers alone (needs CONTROLPLANE_STORE=postgres)
  migrate  create or upgrade the store's schema, then exit
  status   print delivery counts by state as JSON, then exit
  help     print this text

configuration: CONTROLPLANE_* environment variables, see README.md";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args.as_slice() {
        [c] => c.as_str(),
        [] => {
            eprintln!("control-plane: a command is required\n\n{USAGE}");
            return ExitCode::from(2);
        }
        _ => {
            eprintln!("control-plane: expected exactly one command, got {args:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if matches!(command, "help" | "--help" | "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if !matches!(command, "serve" | "api" | "worker" | "migrate" | "status") {
        eprintln!("control-plane: unknown command {command:?}\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let config = match Config::from_vars(std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("control-plane: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("control-plane: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(command, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("control-plane: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: &str, config: Config) -> Result<(), String> {
    wiring::check_role(command, &config)?;
    let store: DynControlPlaneStore = wiring::open_store(&config).await?;
    match command {
        "migrate" => {
            println!("schema of the {} store is up to date", store.backend_name());
            Ok(())
        }
        "status" => {
            let counts = store
                .delivery_count_by_state()
                .await
                .map_err(|e| e.to_string())?;
            let map: serde_json::Map<String, serde_json::Value> = counts
                .into_iter()
                .map(|(s, n)| (s.as_str().to_string(), n.into()))
                .collect();
            println!(
                "{}",
                serde_json::json!({ "store": store.backend_name(), "deliveries": map })
            );
            Ok(())
        }
        _ => {
            store.ping().await.map_err(|e| e.to_string())?;
            wiring::run_service(command, &config, store).await
        }
    }
}
