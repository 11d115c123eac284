//! `cargo xtask bench`: the harness and the binary built, every benchmark
//! run against the test database, and BENCHMARKS.md written.

use std::process::Command;

use crate::{build_peers, cargo, ensure_pgq, target_dir, test_database, workspace_root};

/// Builds the harness and the binary (release unless `--quick`), runs every
/// benchmark against the test database, and writes BENCHMARKS.md (full runs).
/// `--peers` adds the peer queues' burn-down.
pub(crate) fn bench(flags: &[String]) -> Result<(), String> {
    let (mut quick, mut peers) = (false, false);
    for f in flags {
        match f.as_str() {
            "--quick" => quick = true,
            "--peers" => peers = true,
            other => return Err(format!("bench takes --quick and --peers, not {other:?}")),
        }
    }
    let peers_bin = if peers {
        ensure_pgq()?;
        Some(build_peers()?)
    } else {
        None
    };
    let (url, _cluster) = test_database()?;
    let profile = if quick { "debug" } else { "release" };
    // Each selection keeps the bundled DuckDB it was built with: the quick
    // run builds what the tests build (same features, so no second DuckDB
    // build), the full run the two binaries in release.
    let build: &[&str] = if quick {
        &["build", "--workspace", "--all-targets"]
    } else {
        &["build", "--release", "-p", "bench", "-p", "control-plane"]
    };
    cargo(build, &[])?;
    let dir = target_dir().join(profile);
    let serve = dir.join("control-plane");
    let serve = serve.to_string_lossy();
    let mut args = vec![
        "--database-url",
        url.as_str(),
        "--serve-bin",
        serve.as_ref(),
    ];
    if quick {
        args.push("--quick");
    }
    let peers_bin = peers_bin.map(|p| p.to_string_lossy().into_owned());
    if let Some(p) = &peers_bin {
        args.extend(["--peers-bin", p.as_str()]);
    }
    eprintln!("xtask: bench {}", args.join(" "));
    let out = Command::new(dir.join("bench"))
        .args(&args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run the benchmark harness: {e}"))?;
    if !out.status.success() {
        return Err(format!("the benchmarks failed ({})", out.status));
    }
    let report = String::from_utf8_lossy(&out.stdout);
    if quick {
        println!("{report}");
        return Ok(());
    }
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let text = format!(
        "# Benchmarks\n\nWritten by `cargo xtask bench` on {date} {BENCH_HEADER}\n\n{report}"
    );
    std::fs::write(workspace_root().join("BENCHMARKS.md"), text)
        .map_err(|e| format!("cannot write BENCHMARKS.md: {e}"))
}

/// What BENCHMARKS.md says of itself after its date.
const BENCH_HEADER: &str = "(release build; PostgreSQL with fsync on, the database of \
    `CONTROLPLANE_TEST_DATABASE_URL` or a throwaway local cluster). Throughputs are deliveries per \
    second; compare figures as ratios within this one run.\nExperiments (what each change was tried \
    against, kept or not, and why) are in `docs/experiments.md`, each with its date, its command and \
    the ADR it informed; this file holds only the report.";
