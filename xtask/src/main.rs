//! Project tasks: `cargo xtask <task>`. Std only, so it builds in seconds.

use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci           fmt check, clippy (warnings denied), every test, docs (warnings denied)
  test         every test of the workspace
  conformance  the conformance suite on every adapter
  tidy         fmt check and clippy only";

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed ({status})", args.join(" ")))
    }
}

fn tidy() -> Result<(), String> {
    cargo(&["fmt", "--all", "--", "--check"], &[])?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )
}

fn test() -> Result<(), String> {
    cargo(&["test", "--workspace", "--all-targets"], &[])?;
    // Doc tests run separately: `--all-targets` leaves them out.
    cargo(&["test", "--workspace", "--doc"], &[])
}

fn docs() -> Result<(), String> {
    cargo(
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => tidy().and_then(|_| test()).and_then(|_| docs()),
        "test" => test(),
        "tidy" => tidy(),
        "conformance" => cargo(
            &["test", "-p", "store-embedded", "--test", "conformance"],
            &[],
        ),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => {
            eprintln!("xtask {task}: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}
