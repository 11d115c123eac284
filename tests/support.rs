//! Helpers shared by the workspace-level tests: where the workspace is, the
//! test database, `control-plane` processes, and a webhook receiver that
//! records every request it answers.
// Test support: a failed helper is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use control_plane_core::{AccountId, PublishRequest};
use hmac::{Hmac, Mac};

// ---------------------------------------------------------------- waiting

/// Asks `done` every `every` until it says yes; fails with `what` once
/// `within` has passed without a yes.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, every: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < within, "{what} (waited {within:?})");
        tokio::time::sleep(every).await;
    }
}

/// Sends `request` and returns the text of its answer.
pub async fn text_of(request: reqwest::RequestBuilder) -> String {
    request.send().await.unwrap().text().await.unwrap()
}

// ---------------------------------------------------------------- api calls

/// One call to the service's API at `base` with bearer `token`: the status
/// and the JSON body (`null` when the body is not JSON).
pub async fn api_call(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = http
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

// ---------------------------------------------------------------- workspace

/// The workspace root, read at run time: cargo sets `CARGO_MANIFEST_DIR` for
/// the test process, so a test binary reused from another checkout (the
/// shared target directory) still reads this checkout's files.
pub fn workspace_root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .expect("CARGO_MANIFEST_DIR is not set: run the tests through cargo");
    PathBuf::from(dir)
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The names listed in the `[dependencies]` table of a manifest (not dev or build).
pub fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside {
            if let Some((name, _)) = line.split_once(['=', '.']) {
                let name = name.trim();
                if !name.is_empty() && !name.starts_with('#') {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

// ----------------------------------------------------------------- database

/// The PostgreSQL the tests use; `cargo xtask test` provides it. A missing
/// variable fails the test: the postgres tests never skip.
pub fn database_url() -> String {
    std::env::var("CONTROLPLANE_TEST_DATABASE_URL").expect(
        "CONTROLPLANE_TEST_DATABASE_URL is not set: run the tests through `cargo xtask test`, which provides a database",
    )
}

/// A name no other test process uses at the same time (schemas, files).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A client of the test database, its connection driven on this runtime.
pub async fn pg_client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Drops a schema a test made; blocking, on its own thread and runtime, so it
/// can run from `Drop` inside an async test.
pub fn drop_schema(schema: &str) {
    let schema = schema.to_string();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            pg_client()
                .await
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .unwrap();
        });
    })
    .join();
}

/// A schema in the test database, dropped when the guard goes.
pub struct Schema(pub String);

impl Schema {
    pub fn new(prefix: &str) -> Schema {
        Schema(unique(prefix))
    }

    /// The variables that point a `control-plane` process at this schema.
    pub fn env(&self, pool_size: usize) -> Vec<(&'static str, String)> {
        postgres_env(&database_url(), &self.0, pool_size)
    }
}

/// The variables that point a `control-plane` process at `schema` of the
/// database at `url`, with a pool of `pool_size` connections and the key
/// file of this test binary.
pub fn postgres_env(url: &str, schema: &str, pool_size: usize) -> Vec<(&'static str, String)> {
    vec![
        ("CONTROLPLANE_STORE", "postgres".to_string()),
        (
            "CONTROLPLANE_SECRET_KEY_FILE",
            key_file().display().to_string(),
        ),
        ("CONTROLPLANE_DATABASE_URL", url.to_string()),
        ("CONTROLPLANE_DATABASE_SCHEMA", schema.to_string()),
        ("CONTROLPLANE_POOL_SIZE", pool_size.to_string()),
    ]
}

/// A key file every `control-plane` process of this test binary shares
/// (replicas of one store must seal with one key), mode 0600, under the
/// system's temporary directory; written once per test process.
pub fn key_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(unique("cp-test-key"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        writeln!(
            f,
            "{}",
            control_plane_store_kit::SecretKey::generate().to_text()
        )
        .unwrap();
        path
    })
    .clone()
}

/// The keys of [`key_file`], for a store a test opens beside the processes.
pub fn secret_keys() -> control_plane_store_kit::SecretKeys {
    let text = std::fs::read_to_string(key_file()).unwrap();
    control_plane_store_kit::SecretKeys::new(
        control_plane_store_kit::SecretKey::parse(&text).unwrap(),
        vec![],
    )
}

impl Drop for Schema {
    fn drop(&mut self) {
        drop_schema(&self.0);
    }
}

// ------------------------------------------------------------------ cluster

/// The directory of the PostgreSQL server binaries (`initdb`, `pg_ctl`):
/// `PG_BIN` when set, else the newest `/usr/lib/postgresql/*/bin` that has
/// `initdb`, else the first `PATH` entry that has it (as `cargo xtask`
/// looks them up).
pub fn server_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").exists() {
            Ok(dir)
        } else {
            Err(format!(
                "PG_BIN is {}, which has no initdb: point it at the PostgreSQL server binaries",
                dir.display()
            ))
        };
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .filter(|bin| bin.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    // Version directories: "9.6" < "15" as text, so compare them as numbers.
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .map(|v| {
                v.split('.')
                    .map(|part| part.parse::<u32>().unwrap_or(0))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    });
    if let Some(bin) = found.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| dir.join("initdb").exists())
        .ok_or_else(|| {
            "no PostgreSQL server binaries (initdb, pg_ctl) in PG_BIN, /usr/lib/postgresql/*/bin or PATH: \
             this test runs a PostgreSQL cluster of its own (it crashes it), so install the PostgreSQL \
             server (Debian: `apt-get install postgresql`) or point PG_BIN at its binaries"
                .to_string()
        })
}

/// A PostgreSQL cluster of the test's own, made with the installed server
/// binaries in a temporary directory and listening on a free loopback port,
/// so that a test may crash it without touching the machine's server. Run
/// as the `postgres` user (through `runuser`) when the test runs as root,
/// since `initdb` and the server refuse root. Stopped and removed on drop.
///
/// `fsync` is off (speed): a [`Cluster::crash`] kills the server's
/// processes, not the machine, so whatever they wrote to their files
/// survives in the page cache, flushed or not; what only the server's
/// shared memory held (the WAL of commits that did not wait for it) is
/// lost, as in a real crash. `synchronous_commit` keeps the server's
/// default (on): commits that wait, wait for their WAL to be written.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
    port: u16,
    settings: Vec<String>,
}

impl Cluster {
    /// Makes and starts a cluster, with `settings` (`name=value`) on top of
    /// the defaults above. Fails the test, saying why, when the server
    /// binaries are missing or the cluster does not start: the tests that
    /// need one never skip.
    pub fn start(settings: &[&str]) -> Cluster {
        let bin = server_bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let dir = std::env::temp_dir().join(unique("cp-pg"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if as_postgres {
            let handed = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                handed,
                "running as root, and cannot hand {} to the postgres user (initdb refuses root)",
                dir.display()
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let cluster = Cluster {
            dir,
            bin,
            as_postgres,
            port,
            settings: settings.iter().map(|s| s.to_string()).collect(),
        };
        let data = cluster.data();
        if let Err(e) = cluster.run(
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
        ) {
            panic!("{e}");
        }
        cluster.restart();
        cluster
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Crashes the server: `pg_ctl stop -m immediate`, which ends every
    /// server process at once, without a checkpoint and without writing
    /// what is still in shared memory; the next start recovers from the
    /// WAL. Returns once the server is gone.
    pub fn crash(&self) {
        let data = self.data();
        if let Err(e) = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]) {
            panic!("{e}\n{}", self.log());
        }
    }

    /// Starts the server on the cluster's directory and port (after
    /// [`Cluster::crash`], it recovers first); returns once it accepts
    /// connections.
    pub fn restart(&self) {
        let data = self.data();
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        for s in &self.settings {
            options.push_str(" -c ");
            options.push_str(s);
        }
        let log = self.dir.join("server.log");
        if let Err(e) = self.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &log.to_string_lossy(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        ) {
            panic!("{e}\n{}", self.log());
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    /// Runs one of the server binaries, as `postgres` when the test is root.
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        // The server started by `pg_ctl start` writes to its log file, not
        // to these pipes, so reading them to the end returns.
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "the test's PostgreSQL cluster, last lines of its log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let data = self.data();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------------ process

/// A running `control-plane` process: its API address when it serves one,
/// and its log (stderr), collected on a thread. Dropping it kills it.
pub struct Process {
    child: Child,
    api: Option<String>,
    probes: Option<String>,
    log: Arc<Mutex<Vec<String>>>,
}

/// The message of one log line: the line itself in the text format, its
/// `message` field in the JSON format (`CONTROLPLANE_LOG_FORMAT=json`).
pub fn log_message(line: &str) -> String {
    if line.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            return v["message"].as_str().unwrap_or_default().to_string();
        }
    }
    line.to_string()
}

/// How long a started process may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(120);

impl Process {
    /// Starts `bin command` with no `CONTROLPLANE_*` variable of the test's
    /// own environment, the API on a free loopback port, then `env`; waits
    /// for the ready line.
    pub fn start(bin: &str, command: &str, env: &[(&str, String)]) -> Process {
        let mut c = Command::new(bin);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
            c.env_remove(k);
        }
        c.arg(command)
            .env("CONTROLPLANE_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        // Every line is kept (dependencies' notices, debug detail); the
        // ready line is awaited with a deadline, so a child that never
        // says it fails the test instead of hanging the suite.
        let log = Arc::new(Mutex::new(Vec::new()));
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        // Standard output is kept too: what the process prints there (a
        // collector keeps it as well) is checked with the rest.
        let out_sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                out_sink.lock().unwrap().push(line);
            }
        });
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line.clone());
                let _ = lines_tx.send(line);
            }
        });
        let ready = loop {
            match lines.recv_timeout(READY_WITHIN) {
                Ok(line) if log_message(&line).contains(" ready on the ") => break line,
                Ok(_) => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "`{command}` did not start within {READY_WITHIN:?} ({e}):\n{}",
                        log.lock().unwrap().join("\n")
                    );
                }
            }
        };
        let address_after = |label: &str| {
            log_message(&ready)
                .split(label)
                .nth(1)
                .map(|a| a.trim().to_string())
        };
        let (api, probes) = (address_after("API on "), address_after("probes on "));
        Process {
            child,
            api,
            probes,
            log,
        }
    }

    /// The API's base address (`http://host:port`).
    pub fn api(&self) -> String {
        match &self.api {
            Some(a) => a.clone(),
            None => panic!("this process serves no API: {}", self.log()),
        }
    }

    /// A worker's probe address (`http://host:port`), when it serves one.
    pub fn probes(&self) -> Option<String> {
        self.probes.clone()
    }

    /// Everything the process has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, then waits (at most 30 s) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let kill = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(kill.success());
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process id (for a reaper that outlives the test process).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGKILL, and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

// ----------------------------------------------------------------- receiver

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: String,
    pub at: Instant,
}

impl Received {
    /// The `webhook-id` header, or "".
    pub fn webhook_id(&self) -> &str {
        self.headers.get("webhook-id").map_or("", String::as_str)
    }
}

/// How the receiver answers: given the request and how many requests its
/// path has had (this one included).
pub type Answer =
    Arc<dyn Fn(Received, usize) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// An [`Answer`] of `200 ok` to everything.
pub fn answer_ok() -> Answer {
    Arc::new(|_, _| Box::pin(async { axum::response::IntoResponse::into_response("ok") }))
}

/// An [`Answer`] of `status` after `delay` to everything: a slow or failing
/// endpoint.
pub fn answer_after(delay: Duration, status: u16) -> Answer {
    let status = axum::http::StatusCode::from_u16(status).unwrap();
    Arc::new(move |_, _| {
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            axum::response::IntoResponse::into_response((status, "ok"))
        })
    })
}

/// An HTTP server on a free loopback port that records every POST (before
/// answering it) and answers with an [`Answer`].
pub struct Receiver {
    seen: Mutex<Vec<Received>>,
    /// Requests so far per path (kept apart so that answering stays O(1)
    /// when a benchmark sends tens of thousands).
    per_path: Mutex<HashMap<String, usize>>,
    answer: Answer,
}

impl Receiver {
    /// Starts a receiver; returns it and its base address.
    pub async fn start(answer: Answer) -> (Arc<Receiver>, String) {
        let state = Arc::new(Receiver {
            seen: Mutex::new(Vec::new()),
            per_path: Mutex::new(HashMap::new()),
            answer,
        });
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::post(record))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (state, base)
    }

    /// Every request so far.
    pub fn all(&self) -> Vec<Received> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests to one path (without the leading `/`).
    pub fn requests(&self, path: &str) -> Vec<Received> {
        self.all().into_iter().filter(|r| r.path == path).collect()
    }

    /// How many requests have arrived.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// When the first request of `webhook-id` arrived, if one has.
    pub fn arrival_of(&self, webhook_id: &str) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.webhook_id() == webhook_id)
            .map(|r| r.at)
    }

    /// Each request's `webhook-id` and arrival, in arrival order.
    pub fn arrivals(&self) -> Vec<(String, Instant)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.webhook_id().to_string(), r.at))
            .collect()
    }

    /// Requests per `webhook-id`.
    pub fn hits_by_id(&self) -> HashMap<String, u32> {
        let mut out = HashMap::new();
        for r in self.seen.lock().unwrap().iter() {
            *out.entry(r.webhook_id().to_string()).or_default() += 1;
        }
        out
    }
}

async fn record(
    State(r): State<Arc<Receiver>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let received = Received {
        path: path.clone(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body,
        at: Instant::now(),
    };
    let nth = {
        let mut per_path = r.per_path.lock().unwrap();
        let n = per_path.entry(path).or_insert(0);
        *n += 1;
        r.seen.lock().unwrap().push(received.clone());
        *n
    };
    (r.answer)(received, nth).await
}

/// An independent Standard Webhooks check of one request: HMAC-SHA256 over
/// `id.timestamp.body` with the base64 key after `whsec_`, a timestamp within
/// five minutes, and a JSON body.
pub fn signature_is_valid(secret: &str, r: &Received) -> bool {
    let Some(key) = secret
        .strip_prefix("whsec_")
        .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
    else {
        return false;
    };
    let (Some(id), Some(ts), Some(signatures)) = (
        r.headers.get("webhook-id"),
        r.headers.get("webhook-timestamp"),
        r.headers.get("webhook-signature"),
    ) else {
        return false;
    };
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.{}", r.body).as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let fresh = ts.parse::<i64>().is_ok_and(|t| (now - t).abs() < 300);
    fresh
        && r.headers.get("content-type").map(String::as_str) == Some("application/json")
        && signatures
            .split(' ')
            .any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

/// Asserts that events at `at` (milliseconds, any order) over `seconds`
/// kept a limit of `rate` per second with a burst of one second's worth: no
/// one-second window holds more than twice the rate, the total is at most
/// the rate over the run plus the burst and one second of slack, and at
/// least `at_least` (the limit does not starve). Prints the figures.
pub fn assert_rate_kept(what: &str, at: &[i64], rate: usize, seconds: usize, at_least: usize) {
    let worst = busiest_window(at, 1000);
    eprintln!(
        "rate limit {rate}/s, {what}: {} in {seconds} s, worst one-second window {worst}",
        at.len()
    );
    assert!(
        worst <= 2 * rate,
        "worst one-second window {worst} > rate {rate} + burst {rate}"
    );
    assert!(
        at.len() <= rate * seconds + 2 * rate,
        "{} in {seconds} s at {rate}/s with a burst of {rate} (and a second of slack: claims start before the first arrival)",
        at.len()
    );
    assert!(
        at.len() >= at_least,
        "only {} in {seconds} s: the limit starves",
        at.len()
    );
}

/// `n` events of `event_type` for `account`, payloads `{"i": 0..n}`.
pub fn events(account: &AccountId, event_type: &str, n: usize) -> Vec<PublishRequest> {
    (0..n)
        .map(|i| PublishRequest::new(account.clone(), event_type, serde_json::json!({ "i": i })))
        .collect()
}

/// The most events that fall in any one window of `width` (sliding), given
/// their times in any unit and order.
pub fn busiest_window(at: &[i64], width: i64) -> usize {
    let mut at = at.to_vec();
    at.sort_unstable();
    (0..at.len())
        .map(|i| at[i..].iter().take_while(|t| **t < at[i] + width).count())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_window_counts_the_densest_second() {
        let at = [2400, 0, 100, 1500, 1600, 1700];
        assert_eq!(busiest_window(&at, 1000), 4);
        assert_eq!(busiest_window(&at, 100), 1);
        assert_eq!(busiest_window(&[], 1000), 0);
    }

    #[test]
    fn a_signature_check_rejects_a_tampered_body() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("msg_1.{ts}.{{}}").as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let mut r = Received {
            path: "x".into(),
            headers: [
                ("webhook-id", "msg_1".to_string()),
                ("webhook-timestamp", ts),
                ("webhook-signature", format!("v1,{sig}")),
                ("content-type", "application/json".to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            body: "{}".into(),
            at: Instant::now(),
        };
        assert!(signature_is_valid(secret, &r));
        r.body = "{ }".into();
        assert!(!signature_is_valid(secret, &r));
    }
}
