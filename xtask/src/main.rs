//! Project tasks: `cargo xtask <task>`. Std only, so it builds in seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod bench;
mod container;
mod python;

use python::python_tool;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci           fmt check, clippy (warnings denied), every test, docs (warnings
               denied), the postgres-only build (no DuckDB; refuses the
               embedded profile), `api-check`, `container`, then `bench
               --quick` as a smoke test
  postgres-only  that build and its checks alone
  test         every test of the workspace; the postgres tests use
               CONTROLPLANE_TEST_DATABASE_URL, or a throwaway cluster started
               from the installed PostgreSQL server binaries
  conformance  the conformance suite on every adapter (embedded and postgres)
               and every crate's unit tests; the database as for `test`
  tidy         fmt check and clippy only
  bench        release build, then every benchmark (medians of 3 runs) into
               BENCHMARKS.md; `bench --quick`: a debug-build smoke run of every
               benchmark at small sizes (prints, writes nothing, asserts no timing);
               `bench --peers`: also builds crates/peers (its own workspace and
               target directory), installs PgQ (apt-get install
               postgresql-<major>-pgq3) when the server lacks it, and runs the
               same burn-down with graphile_worker, PgQ and apalis beside ours
  chaos        the fault tests at full size: 20,000 events (2,000 on embedded)
               with 20 SIGKILLs of worker processes, and the database outage
  fuzz         run each cargo-fuzz target of crates/fuzz for 60 s (needs the
               nightly toolchain and `cargo install cargo-fuzz`)
  openapi      rewrite openapi.json and docs/api.md from the code (a test fails while either differs)
  api-check    start `serve` on the embedded profile and run schemathesis (from
               PyPI, in a virtualenv under the target directory) against its
               OpenAPI document with the admin token (examples, coverage,
               fuzzing, and stateful sequences along the document's links):
               no 5xx, every status, content type and body as documented. `api-check --examples N`:
               N cases per operation and phase (default 25)
  container    hadolint on the Dockerfile, kubernetes-validate on
               deploy/kubernetes, systemd-analyze verify on the unit, the
               Compose, .dockerignore and README hardening (issue 72); installs
               and starts Docker (Debian's docker.io, docker-compose) when
               missing, builds the image around the tests' binary on base
               images made from the host's files, and runs tests/container.rs:
               embedded with a volume, postgres, and the compose file with two
               workers, one killed (README: Deploy)
  pg           start a throwaway PostgreSQL cluster, print its URL, stop it on Enter";

/// The schemathesis release `api-check` installs (pinned: its checks and
/// its data generation change between releases).
const SCHEMATHESIS: &str = "schemathesis==4.32.5";

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // `cargo run` gave this process xtask's package variables; build scripts
    // (ring's) rerun when those change, which would rebuild the bundled
    // DuckDB. Hand cargo the environment a shell would.
    for (k, _) in std::env::vars() {
        if k.starts_with("CARGO_PKG_")
            || matches!(
                k.as_str(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(k);
        }
    }
    let status = cmd
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
    )?;
    // Each broker transport is a cargo feature of the dispatcher (ADR
    // 0037): it builds with none of them and with each alone. (`-p` picks
    // only the dispatcher's own features; no DuckDB is built.)
    for features in ["", "amqp", "nats", "redis"] {
        let lib = [
            "clippy",
            "-p",
            "dispatcher",
            "--lib",
            "--no-default-features",
        ];
        let rest = ["--features", features, "--", "-D", "warnings"];
        cargo(&[&lib[..], &rest].concat(), &[])?;
    }
    Ok(())
}

/// The database the postgres tests use: `CONTROLPLANE_TEST_DATABASE_URL`
/// when set, otherwise a throwaway cluster that lives as long as the guard.
fn test_database() -> Result<(String, Option<Cluster>), String> {
    match std::env::var("CONTROLPLANE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let cluster = Cluster::start()?;
            Ok((cluster.url.clone(), Some(cluster)))
        }
    }
}

fn test() -> Result<(), String> {
    let (url, _cluster) = test_database()?;
    let env = [("CONTROLPLANE_TEST_DATABASE_URL", url.as_str())];
    cargo(&["test", "--workspace", "--all-targets"], &env)?;
    // Doc tests run separately: `--all-targets` leaves them out.
    cargo(&["test", "--workspace", "--doc"], &env)
}

/// The conformance suite on every adapter (each adapter crate's
/// `conformance` test target) and every crate's unit tests (`--workspace`,
/// so the build cache is the one `test` uses). CI also runs it without
/// `CONTROLPLANE_TEST_DATABASE_URL`, on a throwaway cluster as a new user's
/// `cargo xtask ci` does, whose settings may differ from the machine's server.
fn conformance() -> Result<(), String> {
    let (url, _cluster) = test_database()?;
    let env = [("CONTROLPLANE_TEST_DATABASE_URL", url.as_str())];
    cargo(
        &["test", "--workspace", "--lib", "--test", "conformance"],
        &env,
    )
}

/// A PostgreSQL cluster made with the installed server binaries in a
/// temporary directory, on a free port; stopped and removed on drop.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
    url: String,
}

fn server_bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|b| b.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if let Some(b) = found.pop() {
        return Ok(b);
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        if Path::new(dir).join("initdb").exists() {
            return Ok(PathBuf::from(dir));
        }
    }
    Err("no PostgreSQL server binaries (initdb, pg_ctl) found in /usr/lib/postgresql/*/bin, PG_BIN or PATH; \
         install the PostgreSQL server, or set CONTROLPLANE_TEST_DATABASE_URL to a database the tests may use"
        .into())
}

impl Cluster {
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn start() -> Result<Cluster, String> {
        let bin = server_bin_dir()?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("cp-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // initdb refuses to run as root: hand the directory to `postgres`.
        let root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false);
        if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success());
            if !matches!(ok, Ok(true)) {
                return Err(
                    "running as root, and cannot hand the cluster directory to the postgres user"
                        .into(),
                );
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free port: {e}"))?;
        let cluster = Cluster {
            dir: dir.clone(),
            bin,
            as_postgres: root,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        let data = dir.join("data");
        let data = data.to_string_lossy();
        eprintln!(
            "xtask: starting a throwaway PostgreSQL cluster in {} on port {port}",
            dir.display()
        );
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off",
            dir.display()
        );
        let log = dir.join("server.log");
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &log.to_string_lossy(),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = self.run(
            "pg_ctl",
            &["-D", &data.to_string_lossy(), "-m", "fast", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn workspace_root() -> PathBuf {
    // Read at run time (`cargo run` sets it): with a target directory shared
    // between checkouts, the path compiled in may be another checkout's.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Builds the peer queues' burn-down (`crates/peers`, its own workspace)
/// in release into its own target directory, so that its sqlx never touches
/// the shared cache; returns the binary.
fn build_peers() -> Result<PathBuf, String> {
    let dir = target_dir().join("peers");
    let manifest = workspace_root().join("crates/peers/Cargo.toml");
    let (manifest, dir_arg) = (manifest.to_string_lossy(), dir.to_string_lossy());
    cargo(
        &[
            "build",
            "--release",
            "--locked",
            "--manifest-path",
            manifest.as_ref(),
            "--target-dir",
            dir_arg.as_ref(),
        ],
        // apalis-postgres checks its queries against the metadata it ships
        // (.sqlx), never against a database named in the environment.
        &[("SQLX_OFFLINE", "true")],
    )?;
    Ok(dir.join("release").join("peers"))
}

/// The major version and the extension directory of the PostgreSQL server
/// the benchmarks use: Debian's layout under the server binaries `test`
/// finds (`/usr/lib/postgresql/<major>/bin` → `/usr/share/postgresql/<major>/extension`),
/// otherwise what `pg_config` reports.
fn server_extension_dir() -> Result<(String, PathBuf), String> {
    if let Ok(bin) = server_bin_dir() {
        let major = bin
            .parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str())
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        if let Some(major) = major {
            let dir = Path::new("/usr/share/postgresql")
                .join(major)
                .join("extension");
            return Ok((major.to_owned(), dir));
        }
    }
    let pg_config = |arg: &str| -> Result<String, String> {
        let out = Command::new("pg_config")
            .arg(arg)
            .output()
            .map_err(|e| format!("cannot run pg_config {arg}: {e}"))?;
        if !out.status.success() {
            return Err(format!("pg_config {arg} failed ({})", out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // "PostgreSQL 15.20 (Debian 15.20-0+deb12u1)"
    let version = pg_config("--version")?;
    let major = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("cannot read a major version in {version:?}"))?;
    let dir = PathBuf::from(pg_config("--sharedir")?).join("extension");
    Ok((major.to_owned(), dir))
}

/// The PgQ peer needs the server's `pgq` extension: when its control file is
/// missing, installs Debian's `postgresql-<major>-pgq3` (running
/// `apt-get update` only if the first attempt fails). The package also
/// installs and, under systemd, starts the `pgqd` ticker daemon, which would
/// tick the peer's queue beside the peer's own ticker: a daemon started by
/// this install is stopped again.
fn ensure_pgq() -> Result<(), String> {
    let (major, dir) = server_extension_dir()?;
    let control = dir.join("pgq.control");
    if control.exists() {
        return Ok(());
    }
    let package = format!("postgresql-{major}-pgq3");
    eprintln!(
        "xtask: {} is missing (the PgQ peer needs it): installing {package}",
        control.display()
    );
    let pgqd_was_active = systemctl(&["is-active", "--quiet", "pgqd"]);
    let installed = apt(&["install", "-y", &package])? || {
        eprintln!("xtask: the install failed; updating the package lists and trying again");
        apt(&["update"])? && apt(&["install", "-y", &package])?
    };
    if !installed {
        return Err(format!(
            "cannot install {package}, which the PgQ peer needs; as root: \
             apt-get update && apt-get install -y {package}"
        ));
    }
    if !control.exists() {
        return Err(format!(
            "{package} is installed but {} is still missing",
            control.display()
        ));
    }
    if !pgqd_was_active && systemctl(&["is-active", "--quiet", "pgqd"]) {
        eprintln!(
            "xtask: systemctl stop pgqd (the package started it; the PgQ peer runs its own ticker)"
        );
        if !systemctl(&["stop", "pgqd"]) {
            return Err("cannot stop pgqd: stop it yourself (systemctl stop pgqd)".into());
        }
    }
    Ok(())
}

/// `apt-get <args>`, non-interactive, its output on stderr; whether it succeeded.
fn apt(args: &[&str]) -> Result<bool, String> {
    eprintln!("xtask: apt-get {}", args.join(" "));
    Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(std::io::stderr())
        .status()
        .map(|s| s.success())
        .map_err(|e| format!("cannot run apt-get: {e}"))
}

/// `systemctl <args>` succeeded (false where there is no systemd).
fn systemctl(args: &[&str]) -> bool {
    Command::new("systemctl")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every fuzz target for a minute each.
fn fuzz() -> Result<(), String> {
    let dir = workspace_root().join("crates/fuzz");
    for target in ["config", "inputs", "answers"] {
        eprintln!("xtask: cargo +nightly fuzz run {target} for 60 s");
        let status = Command::new("cargo")
            .args([
                "+nightly",
                "fuzz",
                "run",
                "--fuzz-dir",
                ".",
                target,
                "--",
                "-max_total_time=60",
            ])
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
        if !status.success() {
            return Err(format!("fuzz target {target} failed ({status})"));
        }
    }
    Ok(())
}

/// The fault tests of `tests/chaos.rs` at full size (CI runs them small).
fn chaos() -> Result<(), String> {
    let (url, _cluster) = test_database()?;
    cargo(
        &[
            "test",
            "-p",
            "control-plane",
            "--test",
            "chaos",
            "--",
            "--nocapture",
            "--test-threads=1",
        ],
        &[
            ("CONTROLPLANE_TEST_DATABASE_URL", url.as_str()),
            ("CHAOS_EVENTS", "20000"),
            ("CHAOS_KILLS", "20"),
        ],
    )
}

/// Builds `control-plane` with the postgres profile alone, in a target
/// directory of its own (so the default binary the tests use stays), checks
/// that no DuckDB is in its dependency tree, and that it refuses
/// `CONTROLPLANE_STORE=embedded` with status 2 naming the missing feature.
fn postgres_only() -> Result<(), String> {
    let dir = target_dir().join("postgres-only");
    let features = ["--no-default-features", "--features", "postgres"];
    let started = std::time::Instant::now();
    let mut build = vec!["build", "-p", "control-plane"];
    build.extend(features);
    build.extend([
        "--target-dir",
        dir.to_str().ok_or("target dir is not UTF-8")?,
    ]);
    cargo(&build, &[])?;
    eprintln!(
        "xtask: the postgres-only binary built in {:.0?}",
        started.elapsed()
    );
    let mut tree = vec![
        "tree",
        "-p",
        "control-plane",
        "-e",
        "normal",
        "--prefix",
        "none",
    ];
    tree.extend(features);
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(&tree)
        .output()
        .map_err(|e| format!("cannot run cargo tree: {e}"))?;
    let deps = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || deps.contains("duckdb") {
        return Err(format!(
            "the postgres-only dependency tree is wrong (status {}):\n{deps}",
            out.status
        ));
    }
    let mut run = Command::new(dir.join("debug").join("control-plane"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        run.env_remove(k);
    }
    let out = run
        .arg("status")
        .env("CONTROLPLANE_STORE", "embedded")
        .output()
        .map_err(|e| format!("cannot run the postgres-only binary: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !stderr.contains("`embedded` cargo feature") {
        return Err(format!(
            "the postgres-only binary must refuse the embedded profile with status 2, got {}: {stderr}",
            out.status
        ));
    }
    Ok(())
}

/// Rewrites `openapi.json` from the code, through the test that compares them.
fn openapi() -> Result<(), String> {
    cargo(
        &["test", "--workspace", "--test", "openapi"],
        &[("UPDATE_OPENAPI", "1"), ("CI", "false")],
    )
}

/// A virtualenv under the target directory with schemathesis; its `st`.
fn schemathesis() -> Result<PathBuf, String> {
    python_tool("schemathesis-venv", &[SCHEMATHESIS], "st")
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free local port (bound, read, released).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Waits until `GET /readyz` on `addr` answers 200.
fn wait_ready(addr: &str, server: &mut Child) -> Result<(), String> {
    use std::io::{Read, Write};
    for _ in 0..300 {
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(format!("the service exited before it was ready ({status})"));
        }
        if let Ok(mut c) = std::net::TcpStream::connect(addr) {
            let req = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let mut answer = String::new();
            if c.write_all(req.as_bytes()).is_ok()
                && c.read_to_string(&mut answer).is_ok()
                && answer.starts_with("HTTP/1.1 200")
            {
                return Ok(());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err("the service was not ready within 30 s".into())
}

/// schemathesis against `serve` on the embedded profile.
fn api_check(examples: &str) -> Result<(), String> {
    cargo(&["build", "--workspace", "--all-targets"], &[])?;
    let st = schemathesis()?;
    let dir = std::env::temp_dir().join(format!("api-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let token = format!("cpa_api_check_token_0123456789_{}", std::process::id());
    let mut serve = Command::new(target_dir().join("debug").join("control-plane"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        serve.env_remove(k);
    }
    let mut server = Child(
        serve
            .arg("serve")
            .env("CONTROLPLANE_EMBEDDED_PATH", dir.join("api-check.duckdb"))
            .env("CONTROLPLANE_LISTEN", &addr)
            .env("CONTROLPLANE_ADMIN_TOKEN", &token)
            .env("CONTROLPLANE_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start control-plane serve: {e}"))?,
    );
    wait_ready(&addr, &mut server)?;
    eprintln!("xtask: schemathesis against http://{addr}/v1/openapi.json, {examples} examples");
    let status = Command::new(&st)
        .args([
            "--no-color",
            "run",
            &format!("http://{addr}/v1/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {token}"),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            examples,
            // One worker: with two, CPython 3.11's parser fails now and then
            // inside hypothesis ("AST constructor recursion depth mismatch").
            "--workers",
            "1",
            "--seed",
            "1",
            "--generation-database",
            "none",
        ])
        .status()
        .map_err(|e| format!("cannot run schemathesis: {e}"))?;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    if status.success() {
        Ok(())
    } else {
        Err(format!("schemathesis found failures ({status})"))
    }
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
        "ci" => tidy()
            .and_then(|_| test())
            .and_then(|_| docs())
            .and_then(|_| postgres_only())
            .and_then(|_| api_check("25"))
            .and_then(|_| container::container())
            .and_then(|_| bench::bench(&["--quick".to_string()])),
        "pg" => Cluster::start().map(|c| {
            eprintln!(
                "xtask: a throwaway cluster runs at {} until you press Enter",
                c.url
            );
            println!("{}", c.url);
            let _ = std::io::stdin().read_line(&mut String::new());
        }),
        "test" => test(),
        "chaos" => chaos(),
        "fuzz" => fuzz(),
        "bench" => bench::bench(&std::env::args().skip(2).collect::<Vec<_>>()),
        "tidy" => tidy(),
        "conformance" => conformance(),
        "postgres-only" => postgres_only(),
        "container" => container::container(),
        "openapi" => openapi(),
        "api-check" => {
            let examples = match (std::env::args().nth(2), std::env::args().nth(3)) {
                (Some(flag), Some(n)) if flag == "--examples" => n,
                _ => "25".to_string(),
            };
            api_check(&examples)
        }
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
