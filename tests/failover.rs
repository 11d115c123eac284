//! Issue 74: the database fails over under the service. A single-node etcd
//! and two PostgreSQL nodes under Patroni (`synchronous_mode: true`, a 10 s
//! TTL), on loopback ports in a temporary directory; one `api` and two
//! `worker` processes on the multi-host URL
//! `postgres://postgres@h1:p1,h2:p2/postgres?target_session_attrs=read-write`.
//! Events are published at a steady rate for the whole run while:
//!   1. the primary's postmaster is SIGKILLed, and Patroni promotes the
//!      sync standby (an unplanned failover);
//!   2. later `patronictl switchover` moves the primary back (a planned move).
//!
//! Asserted: no accepted publish (2xx) is lost, every duplicate POST is
//! explained (an expired lease, or a failover window), publishes during a
//! gap are answered 503 (never 500 or another status, never left without
//! an answer past the client's timeout), and deliveries resume within the
//! Patroni TTL plus 10 s after each event. The gap of each event is printed,
//! with what `/readyz` of each process answered and what they logged.
//!
//! Needs Debian's `patroni` and `etcd-server` (and the PostgreSQL server
//! binaries); missing ones fail the test, which never skips. Knobs:
//! `FAILOVER_RATE` (publishes per second, default 50), `FAILOVER_STEADY`
//! (seconds of steady publishing before, between and after the events,
//! default 8), `FAILOVER_KEEP=1` (keep the cluster's directory),
//! `FAILOVER_LOGS=dir` (write every process's log there),
//! `FAILOVER_SESSION_ATTRS` (the URL's `target_session_attrs`, default
//! `read-write`; `any` shows what the service does itself on a standby).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workspace_tests::{answer_ok, postgres_env, server_bin_dir, unique, Process, Receiver};

const ADMIN: &str = "cpa_failover_admin_token_0123456789";
/// Patroni's leader-key TTL, loop and retry timeout (ttl >= loop_wait + 2 * retry_timeout).
const TTL: u64 = 10;
const LOOP_WAIT: u64 = 2;
const RETRY_TIMEOUT: u64 = 3;
/// How long a publish may go unanswered before the test calls it a hang.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The schema the processes share in the Patroni cluster's `postgres` database.
const SCHEMA: &str = "cp_failover";
/// How long before an event a POST may have arrived whose claim or outcome
/// the event then lost (claims and outcomes commit without waiting for
/// their WAL: ADR 0016, 0034), as in tests/chaos.rs.
const REACH: Duration = Duration::from_secs(5);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `control-plane` binary: cargo names it when this test belongs to the
/// binary's package; else it sits beside this test's `deps` directory
/// (`cargo test --workspace` builds every package's binaries for
/// integration tests).
fn binary() -> String {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_control-plane") {
        return bin.to_string();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("control-plane"))
        .unwrap();
    assert!(
        bin.exists(),
        "no control-plane binary at {}: run this test with `cargo test --workspace --test failover`",
        bin.display()
    );
    bin.display().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// `program` on PATH, or a failure that says what to install.
fn require(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).exists()))
        .unwrap_or(false);
    assert!(
        found,
        "`{program}` is not installed: this test runs PostgreSQL under Patroni with etcd; \
         install Debian's packages: `apt-get install -y --no-install-recommends patroni etcd-server` \
         ({package})"
    );
}

/// The uid and gid of the `postgres` user when the test runs as root
/// (PostgreSQL refuses root), else `None` (run as ourselves).
fn postgres_owner() -> Option<(u32, u32)> {
    let out = |args: &[&str]| {
        Command::new("id").args(args).output().ok().and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u32>()
                .ok()
        })
    };
    if out(&["-u"]) != Some(0) {
        return None;
    }
    let owner = (out(&["-u", "postgres"]), out(&["-g", "postgres"]));
    match owner {
        (Some(u), Some(g)) => Some((u, g)),
        _ => panic!("running as root and there is no `postgres` user to run PostgreSQL as"),
    }
}

// ------------------------------------------------------------------ cluster

struct Node {
    name: String,
    pg_port: u16,
    rest_port: u16,
    data: PathBuf,
    config: PathBuf,
    child: Option<Child>,
}

/// One member as Patroni's `/cluster` describes it.
#[derive(Clone, Debug, PartialEq)]
struct Member {
    name: String,
    role: String,
    state: String,
    timeline: Option<i64>,
}

/// etcd and two PostgreSQL nodes under Patroni, all on loopback ports, in a
/// temporary directory; everything killed and removed on drop.
struct Ha {
    dir: PathBuf,
    owner: Option<(u32, u32)>,
    pg_bin: PathBuf,
    etcd: Option<Child>,
    etcd_port: u16,
    nodes: Vec<Node>,
    http: reqwest::Client,
    /// A shell that cleans up if this test process dies without dropping
    /// the cluster (SIGKILL, a timeout): Drop guards do not run then.
    reaper: Option<Child>,
}

impl Ha {
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(program);
        if let Some((uid, gid)) = self.owner {
            c.uid(uid).gid(gid);
        }
        c.env("HOME", &self.dir);
        c
    }

    fn log_file(&self, name: &str) -> (PathBuf, Stdio, Stdio) {
        let path = self.dir.join(name);
        let f = std::fs::File::create(&path).unwrap();
        let g = f.try_clone().unwrap();
        (path, Stdio::from(f), Stdio::from(g))
    }

    async fn start() -> Ha {
        require("etcd", "etcd-server");
        require("patroni", "patroni");
        require("patronictl", "patroni");
        let pg_bin = server_bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let dir = std::env::temp_dir().join(unique("cp-ha"));
        std::fs::create_dir_all(&dir).unwrap();
        let owner = postgres_owner();
        let mut ha = Ha {
            dir: dir.clone(),
            owner,
            pg_bin,
            etcd: None,
            etcd_port: free_port(),
            nodes: Vec::new(),
            reaper: None,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .unwrap(),
        };
        for (i, name) in ["node1", "node2"].into_iter().enumerate() {
            ha.nodes.push(Node {
                name: name.to_string(),
                pg_port: free_port(),
                rest_port: free_port(),
                data: dir.join(format!("data{}", i + 1)),
                config: dir.join(format!("{name}.yml")),
                child: None,
            });
        }
        for n in &ha.nodes {
            std::fs::write(&n.config, ha.patroni_yaml(n)).unwrap();
        }
        if let Some((uid, gid)) = owner {
            let handed = Command::new("chown")
                .args(["-R", &format!("{uid}:{gid}")])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(handed, "cannot hand {} to the postgres user", dir.display());
        }
        // etcd, one member.
        let peer = free_port();
        let (_, out, err) = ha.log_file("etcd.log");
        let etcd = ha
            .command("etcd")
            .args([
                "--name",
                "etcd0",
                "--data-dir",
                &dir.join("etcd").display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", ha.etcd_port),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", ha.etcd_port),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("etcd0=http://127.0.0.1:{peer}"),
            ])
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        ha.etcd = Some(etcd);
        let health = format!("http://127.0.0.1:{}/health", ha.etcd_port);
        ha.wait("etcd did not become healthy", 30, || {
            let (http, health) = (ha.http.clone(), health.clone());
            async move {
                match http.get(&health).send().await {
                    Ok(r) => r.text().await.unwrap_or_default().contains("true"),
                    Err(_) => false,
                }
            }
        })
        .await;
        // node1 bootstraps and leads; node2 then joins as its sync standby.
        ha.spawn_patroni(0);
        ha.wait("node1 did not bootstrap and lead", 90, || async {
            ha.members()
                .await
                .iter()
                .any(|m| m.name == "node1" && m.role == "leader" && m.state == "running")
        })
        .await;
        ha.spawn_patroni(1);
        ha.spawn_reaper();
        ha.wait_healthy(120).await;
        ha
    }

    /// Starts the reaper: once this test process is gone, it kills etcd,
    /// Patroni and the `control-plane` processes listed in `pids` (see
    /// [`Ha::adopt`]), stops the postmasters and removes the directory.
    /// It runs as the test's user (root may kill the service's processes);
    /// `pg_ctl` as the cluster's owner.
    fn spawn_reaper(&mut self) {
        let mut pids: Vec<u32> = self
            .nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect();
        pids.extend(self.etcd.as_ref().map(Child::id));
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let datas: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.data.display().to_string())
            .collect();
        let as_owner = self
            .owner
            .map(|(u, g)| format!("setpriv --reuid={u} --regid={g} --clear-groups "))
            .unwrap_or_default();
        let script = format!(
            "while [ -d /proc/{test} ]; do sleep 1; done; \
             kill -KILL {pids} $(cat {dir}/pids 2>/dev/null) 2>/dev/null; \
             for d in {datas}; do [ -f \"$d/postmaster.pid\" ] && {as_owner}{pg_ctl} -D \"$d\" -m immediate -w -t 20 stop; done; \
             rm -rf {dir}",
            test = std::process::id(),
            pids = pids.join(" "),
            datas = datas.join(" "),
            pg_ctl = self.pg_bin.join("pg_ctl").display(),
            dir = self.dir.display(),
        );
        let reaper = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.reaper = Some(reaper);
    }

    /// Has the reaper kill `process` too if the test process dies.
    fn adopt(&self, process: &Process) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))
            .unwrap();
        writeln!(f, "{}", process.id()).unwrap();
    }

    fn patroni_yaml(&self, n: &Node) -> String {
        let d = self.dir.display();
        format!(
            r#"scope: cpfailover
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    primary_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 100
        fsync: "off"
  initdb:
    - encoding: UTF8
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {d}/pgpass-{name}
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {d}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
"#,
            name = n.name,
            rest = n.rest_port,
            etcd = self.etcd_port,
            pg = n.pg_port,
            data = n.data.display(),
            bin = self.pg_bin.display(),
        )
    }

    fn spawn_patroni(&mut self, i: usize) {
        let (_, out, err) = self.log_file(&format!("{}.log", self.nodes[i].name));
        let child = self
            .command("patroni")
            .arg(&self.nodes[i].config)
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        self.nodes[i].child = Some(child);
    }

    /// The multi-host URL that finds the primary.
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        // FAILOVER_SESSION_ATTRS=any: the URL without the driver's check,
        // to see what the service itself does on a standby.
        let attrs = std::env::var("FAILOVER_SESSION_ATTRS").unwrap_or_else(|_| "read-write".into());
        format!(
            "postgres://postgres@{}/postgres?target_session_attrs={attrs}",
            hosts.join(",")
        )
    }

    /// The members as the first Patroni that answers describes them.
    async fn members(&self) -> Vec<Member> {
        for n in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", n.rest_port);
            let Ok(r) = self.http.get(&url).send().await else {
                continue;
            };
            let Some(v) = r
                .bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            else {
                continue;
            };
            return v["members"]
                .as_array()
                .map(|ms| {
                    ms.iter()
                        .map(|m| Member {
                            name: m["name"].as_str().unwrap_or("").to_string(),
                            role: m["role"].as_str().unwrap_or("").to_string(),
                            state: m["state"].as_str().unwrap_or("").to_string(),
                            timeline: m["timeline"].as_i64(),
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// The running leader's name, if there is one.
    async fn leader(&self) -> Option<String> {
        self.members()
            .await
            .into_iter()
            .find(|m| m.role == "leader" && m.state == "running")
            .map(|m| m.name)
    }

    /// Waits for a running leader and a running sync standby.
    async fn wait_healthy(&self, secs: u64) {
        self.wait(
            "the cluster did not get a running leader and sync standby",
            secs,
            || async {
                let ms = self.members().await;
                let up = |role: &str| ms.iter().any(|m| m.role == role && m.state == "running");
                up("leader") && up("sync_standby")
            },
        )
        .await;
    }

    /// Asks `done` every 200 ms; fails after `secs` with `what`, the members
    /// and the tail of Patroni's logs.
    async fn wait<F, Fut>(&self, what: &str, secs: u64, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while !done().await {
            if start.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "{what} within {secs} s; members: {:?}\n{}",
                    self.members().await,
                    self.tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn tails(&self) -> String {
        let mut out = String::new();
        for name in ["etcd.log", "node1.log", "node2.log"] {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(25);
            out.push_str(&format!(
                "--- last lines of {name}:\n{}\n",
                lines[from..].join("\n")
            ));
        }
        out
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    /// SIGKILLs the postmaster of `name` (its pid from postmaster.pid).
    fn kill_postmaster(&self, name: &str) -> u32 {
        let pidfile = self.node(name).data.join("postmaster.pid");
        let text = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", pidfile.display()));
        let pid: u32 = text.lines().next().unwrap().trim().parse().unwrap();
        let killed = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(killed, "could not SIGKILL the postmaster {pid} of {name}");
        pid
    }

    /// `patronictl switchover` from `leader` to `candidate`.
    fn switchover(&self, leader: &str, candidate: &str) -> String {
        let out = self
            .command("patronictl")
            .arg("-c")
            .arg(&self.node(candidate).config)
            .args([
                "switchover",
                "--leader",
                leader,
                "--candidate",
                candidate,
                "--force",
            ])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "patronictl switchover failed:\n{text}"
        );
        text
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the Patroni cluster in {}:\n{}",
                self.dir.display(),
                self.tails()
            );
        }
        if let Some(mut c) = self.reaper.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Patroni's postmasters outlive a SIGKILLed Patroni: stop them.
        for n in &self.nodes {
            if n.data.join("postmaster.pid").exists() {
                let _ = self
                    .command(self.pg_bin.join("pg_ctl"))
                    .arg("-D")
                    .arg(&n.data)
                    .args(["-m", "immediate", "-w", "-t", "20", "stop"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        if let Some(mut c) = self.etcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var("FAILOVER_KEEP").is_ok_and(|v| v == "1") {
            eprintln!("failover: kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// --------------------------------------------------------------- publishing

/// One publish as the test's client saw it.
#[derive(Clone, Debug)]
struct Publish {
    i: u64,
    /// When it was sent and answered, since the run's start.
    sent: Duration,
    answered: Duration,
    /// The HTTP status, or 0 when no answer came (timeout, connection error).
    status: u16,
    /// The answer's body or the client's error, for the report.
    detail: String,
    delivery: Option<String>,
}

impl Publish {
    fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A `/readyz` answer that differs from the previous one of that process.
#[derive(Clone, Debug)]
struct ReadyChange {
    who: String,
    at: Duration,
    status: u16,
}

/// One event of the run: a failover or a switchover.
#[derive(Clone, Debug)]
struct Event {
    what: &'static str,
    at: Duration,
    /// When Patroni reported the new leader running.
    promoted: Duration,
    /// When the cluster had a sync standby again.
    healthy: Duration,
    from: String,
    to: String,
}

fn ms(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The warnings and errors a process logged, deduplicated by their text
/// without digits, most frequent first, at most `max`.
fn log_summary(log: &str, max: usize) -> String {
    let mut seen: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for line in log.lines() {
        if !(line.contains("WARN") || line.contains("ERROR") || line.contains("panicked")) {
            continue;
        }
        // Drop the timestamp: the key is the rest without digits.
        let body = line.split_once(' ').map_or(line, |(_, rest)| rest).trim();
        // An error id differs on every line: leave it out of the key.
        let body = body.split(" error_id=").next().unwrap_or(body);
        let key: String = body.chars().filter(|c| !c.is_ascii_digit()).collect();
        let e = seen.entry(key).or_insert((0, body.to_string()));
        e.0 += 1;
    }
    let mut items: Vec<(usize, String)> = seen.into_values().collect();
    items.sort_by_key(|b| std::cmp::Reverse(b.0));
    let total: usize = items.iter().map(|i| i.0).sum();
    let mut out = format!("{total} warning/error lines");
    for (n, text) in items.into_iter().take(max) {
        let text: String = text.chars().take(400).collect();
        out.push_str(&format!("\n      {n}x {text}"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failover_and_switchover_under_patroni_lose_no_accepted_publish() {
    let run = Instant::now();
    let rate = env_u64("FAILOVER_RATE", 50).max(1);
    let steady = Duration::from_secs(env_u64("FAILOVER_STEADY", 8));
    let ha = Ha::start().await;
    let first_leader = ha.leader().await.unwrap();
    eprintln!(
        "failover: etcd and two PostgreSQL nodes under Patroni up in {} (leader {first_leader}), URL {}",
        ms(run.elapsed()),
        ha.url()
    );

    // The service: one api, two workers, on the multi-host URL.
    let bin = binary();
    let mut env = postgres_env(&ha.url(), SCHEMA, 8);
    env.extend([
        ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
        (
            "CONTROLPLANE_RETRY_SCHEDULE",
            "1s,1s,1s,1s,1s,1s,1s".to_string(),
        ),
        ("CONTROLPLANE_LEASE", "5s".to_string()),
    ]);
    let mut api = Process::start(&bin, "api", &env);
    ha.adopt(&api);
    let mut workers: Vec<Process> = (0..2)
        .map(|_| Process::start(&bin, "worker", &env))
        .collect();
    for w in &workers {
        ha.adopt(w);
    }
    let base = api.api();
    let (rx, hooks) = Receiver::start(answer_ok()).await;
    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap();
    let r = http
        .post(format!("{base}/v1/accounts/acme/endpoints"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "url": format!("{hooks}/hook") }).to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_eq!(
        status,
        201,
        "endpoint: {}",
        r.text().await.unwrap_or_default()
    );
    let t0 = Instant::now();

    // /readyz of each process, every 250 ms: keep the changes.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(Mutex::new(Vec::<ReadyChange>::new()));
    let mut probes = vec![("api".to_string(), base.clone())];
    for (i, w) in workers.iter().enumerate() {
        if let Some(p) = w.probes() {
            probes.push((format!("worker{}", i + 1), p));
        }
    }
    let poller = {
        let (stop, changes, http) = (stop.clone(), changes.clone(), http.clone());
        tokio::spawn(async move {
            let mut last: HashMap<String, u16> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                for (who, url) in &probes {
                    let status = match http
                        .get(format!("{url}/readyz"))
                        .timeout(Duration::from_secs(4))
                        .send()
                        .await
                    {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    if last.get(who) != Some(&status) {
                        last.insert(who.clone(), status);
                        changes.lock().unwrap().push(ReadyChange {
                            who: who.clone(),
                            at: t0.elapsed(),
                            status,
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // The publisher: `rate` per second, each publish on its own task.
    let published = Arc::new(Mutex::new(Vec::<Publish>::new()));
    let publisher = {
        let (stop, published, http, base) =
            (stop.clone(), published.clone(), http.clone(), base.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tasks = tokio::task::JoinSet::new();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let (published, http, base) = (published.clone(), http.clone(), base.clone());
                tasks.spawn(async move {
                    let sent = t0.elapsed();
                    let r = http
                        .post(format!("{base}/v1/accounts/acme/events"))
                        .bearer_auth(ADMIN)
                        .header("content-type", "application/json")
                        .body(
                            serde_json::json!({"type": "failover", "payload": {"i": i}})
                                .to_string(),
                        )
                        .send()
                        .await;
                    let (status, detail) = match r {
                        Ok(r) => {
                            let s = r.status().as_u16();
                            (s, r.text().await.unwrap_or_else(|e| format!("(body: {e})")))
                        }
                        Err(e) => (0, format!("no answer: {e}")),
                    };
                    let delivery = serde_json::from_str::<serde_json::Value>(&detail)
                        .ok()
                        .and_then(|v| v["deliveries"][0].as_str().map(str::to_string));
                    published.lock().unwrap().push(Publish {
                        i,
                        sent,
                        answered: t0.elapsed(),
                        status,
                        detail,
                        delivery,
                    });
                });
                i += 1;
            }
            while tasks.join_next().await.is_some() {}
        })
    };

    // 1. The unplanned failover.
    tokio::time::sleep(steady).await;
    let mut events = Vec::new();
    let old = ha.leader().await.expect("a leader before the failover");
    let at = t0.elapsed();
    let pid = ha.kill_postmaster(&old);
    eprintln!(
        "failover: t={} SIGKILLed the postmaster {pid} of {old}",
        ms(at)
    );
    ha.wait("Patroni did not promote the standby", 60, || async {
        ha.leader().await.is_some_and(|l| l != old)
    })
    .await;
    let promoted = t0.elapsed();
    let new = ha.leader().await.unwrap();
    ha.wait_healthy(120).await;
    events.push(Event {
        what: "failover (SIGKILL of the primary's postmaster)",
        at,
        promoted,
        healthy: t0.elapsed(),
        from: old.clone(),
        to: new.clone(),
    });
    eprintln!(
        "failover: t={} {new} promoted; t={} {old} back as sync standby",
        ms(promoted),
        ms(t0.elapsed())
    );

    // 2. The planned switchover back.
    tokio::time::sleep(steady).await;
    let at = t0.elapsed();
    let said = tokio::task::block_in_place(|| ha.switchover(&new, &old));
    let last_line = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    eprintln!(
        "failover: t={} patronictl switchover {new} -> {old}: {last_line}",
        ms(at)
    );
    let said = said
        .lines()
        .find(|l| l.contains("Successfully"))
        .unwrap_or(last_line);
    ha.wait(
        "the switchover did not make the old primary lead",
        60,
        || async { ha.leader().await.as_deref() == Some(old.as_str()) },
    )
    .await;
    let promoted = t0.elapsed();
    ha.wait_healthy(120).await;
    events.push(Event {
        what: "switchover (patronictl)",
        at,
        promoted,
        healthy: t0.elapsed(),
        from: new.clone(),
        to: old.clone(),
    });
    eprintln!(
        "failover: switchover said {said:?}; t={} {old} leads",
        ms(promoted)
    );

    // Steady again, then stop publishing and let every accepted publish arrive.
    tokio::time::sleep(steady).await;
    stop.store(true, Ordering::SeqCst);
    publisher.await.unwrap();
    poller.await.unwrap();
    let end_publish = t0.elapsed();
    let mut publishes = published.lock().unwrap().clone();
    publishes.sort_by_key(|p| p.i);
    let accepted: Vec<&Publish> = publishes.iter().filter(|p| p.accepted()).collect();
    let drain = Instant::now();
    let missing = loop {
        let heard = rx.hits_by_id();
        let missing: Vec<&Publish> = accepted
            .iter()
            .copied()
            .filter(|p| p.delivery.as_ref().is_none_or(|d| !heard.contains_key(d)))
            .collect();
        if missing.is_empty() || drain.elapsed() > Duration::from_secs(90) {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // ------------------------------------------------------------ report
    let arrivals: Vec<(String, Duration)> = rx
        .arrivals()
        .into_iter()
        .map(|(id, at)| (id, at.saturating_duration_since(t0)))
        .collect();
    let first_arrival: HashMap<&str, Duration> = {
        let mut m = HashMap::new();
        for (id, at) in &arrivals {
            m.entry(id.as_str()).or_insert(*at);
        }
        m
    };
    let by_delivery: HashMap<&str, &Publish> = accepted
        .iter()
        .filter_map(|p| p.delivery.as_deref().map(|d| (d, *p)))
        .collect();
    // Events the service refused but stored anyway (delivered though the
    // publisher was told no): their payload names the publish.
    let refused_is: HashSet<u64> = publishes
        .iter()
        .filter(|p| !p.accepted())
        .map(|p| p.i)
        .collect();
    let refused_but_delivered: HashSet<u64> = rx
        .all()
        .iter()
        .filter_map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v["data"]["i"].as_u64())
        })
        .filter(|i| refused_is.contains(i))
        .collect();
    let latency_in = |from: Duration, to: Duration| {
        let v: Vec<f64> = accepted
            .iter()
            .filter(|p| p.sent >= from && p.sent < to)
            .filter_map(|p| {
                let d = p.delivery.as_deref()?;
                let a = first_arrival.get(d)?;
                Some(a.saturating_sub(p.sent).as_secs_f64() * 1000.0)
            })
            .collect();
        (percentile(v.clone(), 0.5), percentile(v, 0.99))
    };
    let resume_limit = Duration::from_secs(TTL + 10);
    let mut windows = Vec::new();
    let mut failures = Vec::new();
    let bounds: Vec<Duration> = events
        .iter()
        .map(|e| e.at)
        .skip(1)
        .chain([end_publish])
        .collect();
    eprintln!(
        "failover: {} publishes at {rate}/s over {}: {} accepted, {} refused ({} of those delivered anyway)",
        publishes.len(),
        ms(end_publish),
        accepted.len(),
        refused_is.len(),
        refused_but_delivered.len()
    );
    let (p50, p99) = latency_in(Duration::ZERO, events[0].at);
    eprintln!(
        "failover: publish-to-delivery before the failover: p50 {p50:.0} ms, p99 {p99:.0} ms"
    );
    for (e, until) in events.iter().zip(bounds) {
        // Publishes answered after the event, sent before the next one.
        let around: Vec<&Publish> = publishes
            .iter()
            .filter(|p| p.answered >= e.at && p.sent < until)
            .collect();
        let refused: Vec<&&Publish> = around.iter().filter(|p| !p.accepted()).collect();
        let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
        for p in &refused {
            *statuses.entry(p.status).or_default() += 1;
        }
        // The publishers' outage: from the first refusal to the answer of the
        // first publish accepted after the last refusal.
        let last_refused = refused.iter().map(|p| p.sent).max();
        let back = around
            .iter()
            .filter(|p| p.accepted() && last_refused.is_none_or(|last| p.sent > last))
            .map(|p| p.answered)
            .min();
        let outage = match (refused.first(), back) {
            (Some(first), Some(back)) => format!(
                "refused from t={} to t={} ({} refused, gap {}; accepted again {} after the event)",
                ms(first.sent),
                ms(back),
                refused.len(),
                ms(back.saturating_sub(first.sent)),
                ms(back.saturating_sub(e.at))
            ),
            (Some(first), None) => format!(
                "refused from t={} and never accepted again ({} refused)",
                ms(first.sent),
                refused.len()
            ),
            (None, _) => "none refused".to_string(),
        };
        let slowest = |accepted: bool| {
            around
                .iter()
                .filter(|p| p.accepted() == accepted)
                .map(|p| p.answered - p.sent)
                .max()
                .unwrap_or_default()
        };
        if let Some(p) = refused.first() {
            eprintln!(
                "failover: {}: the first refused publish, #{} sent t={}, answered {} after {}: {}",
                e.what,
                p.i,
                ms(p.sent),
                p.status,
                ms(p.answered - p.sent),
                p.detail.chars().take(300).collect::<String>()
            );
        }
        // Deliveries resumed: the first arrival of a publish sent after the
        // last refusal (after the event when none was refused), from the
        // event; and the longest silence between arrivals around it.
        let since = last_refused.unwrap_or(e.at).max(e.at);
        let resumed = arrivals
            .iter()
            .filter(|(id, at)| {
                *at >= since
                    && by_delivery
                        .get(id.as_str())
                        .is_some_and(|p| p.sent >= since)
            })
            .map(|(_, at)| *at)
            .min()
            .map(|at| at - e.at);
        let mut times: Vec<Duration> = arrivals
            .iter()
            .map(|(_, at)| *at)
            .filter(|at| *at + Duration::from_secs(1) >= e.at && *at < until)
            .collect();
        times.sort();
        let silence = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        let (p50, p99) = latency_in(e.healthy, until);
        eprintln!(
            "failover: {} {} -> {} at t={}: Patroni promoted after {}, sync standby back after {}; \
             publishers: {} {:?}, slowest answer: accepted {}, refused {}; \
             deliveries resumed {} after, longest silence between deliveries {}; \
             publish-to-delivery after it: p50 {p50:.0} ms, p99 {p99:.0} ms",
            e.what,
            e.from,
            e.to,
            ms(e.at),
            ms(e.promoted - e.at),
            ms(e.healthy - e.at),
            outage,
            statuses,
            ms(slowest(true)),
            ms(slowest(false)),
            resumed.map_or("never".to_string(), ms),
            ms(silence)
        );
        match resumed {
            Some(r) if r <= resume_limit => {}
            other => failures.push(format!(
                "{}: deliveries did not resume within the TTL plus 10 s ({}): resumed {:?}",
                e.what,
                ms(resume_limit),
                other
            )),
        }
        let reach = resumed.unwrap_or(until - e.at) + REACH;
        windows.push((e.at.saturating_sub(REACH), e.at + reach));
    }
    // Every refusal: 503 only, and always an answer.
    let mut wrong: BTreeMap<u16, Vec<&Publish>> = BTreeMap::new();
    for p in publishes
        .iter()
        .filter(|p| !p.accepted() && p.status != 503)
    {
        wrong.entry(p.status).or_default().push(p);
    }
    for (status, ps) in &wrong {
        let what = if *status == 0 {
            format!(
                "no answer within the client's timeout of {}",
                ms(CLIENT_TIMEOUT)
            )
        } else {
            format!("answered {status}")
        };
        let examples: Vec<String> = ps
            .iter()
            .take(3)
            .map(|p| {
                format!(
                    "#{} sent t={} answered after {}: {}",
                    p.i,
                    ms(p.sent),
                    ms(p.answered - p.sent),
                    p.detail.chars().take(300).collect::<String>()
                )
            })
            .collect();
        failures.push(format!(
            "{} publishes {what} (want 2xx or 503); e.g. {examples:#?}",
            ps.len()
        ));
    }
    // What /readyz said.
    let changes = changes.lock().unwrap().clone();
    for c in &changes {
        eprintln!(
            "failover: t={} /readyz of {} -> {}",
            ms(c.at),
            c.who,
            c.status
        );
    }
    // Duplicates, explained by an expired lease or a failover window.
    let attempts = expired_leases(&ha.url()).await;
    let mut receipts: HashMap<&str, Vec<Duration>> = HashMap::new();
    for (id, at) in &arrivals {
        receipts.entry(id.as_str()).or_default().push(*at);
    }
    let (mut dups, mut by_lease, mut by_window, mut unexplained) = (0u32, 0u32, 0u32, Vec::new());
    for (id, at) in &receipts {
        let again = at.len() as u32 - 1;
        if again == 0 {
            continue;
        }
        dups += again;
        let expired = attempts.get(*id).copied().unwrap_or(0);
        by_lease += again.min(expired);
        let mut left = again.saturating_sub(expired);
        // A POST whose claim or outcome a failover took (the claim or
        // outcome committed without waiting, then lost with the primary's
        // last moments, or the recording failed while no primary was up).
        let caught = at[..at.len() - 1]
            .iter()
            .filter(|t| windows.iter().any(|(from, to)| *from <= **t && **t <= *to))
            .count() as u32;
        let w = left.min(caught);
        by_window += w;
        left -= w;
        if left > 0 {
            unexplained.push((id.to_string(), at.clone(), expired));
        }
    }
    eprintln!(
        "failover: {} deliveries received, duplicate POSTs {dups} (explained by an expired lease {by_lease}, \
         by a failover window {by_window}, unexplained {})",
        receipts.len(),
        unexplained.len()
    );
    if !unexplained.is_empty() {
        failures.push(format!(
            "duplicates explained by neither an expired lease nor a failover window (id, arrivals, expired leases): {:?}",
            &unexplained[..unexplained.len().min(5)]
        ));
    }
    if !missing.is_empty() {
        let examples: Vec<String> = missing
            .iter()
            .take(5)
            .map(|p| format!("#{} sent t={} delivery {:?}", p.i, ms(p.sent), p.delivery))
            .collect();
        failures.push(format!(
            "{} accepted publishes (2xx) never delivered within 90 s after the run: {examples:?}",
            missing.len()
        ));
    }
    // What the processes logged.
    for (who, p) in std::iter::once(("api".to_string(), &api)).chain(
        workers
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("worker{}", i + 1), w)),
    ) {
        eprintln!("failover: {who} logged {}", log_summary(&p.log(), 12));
    }
    if let Some(dir) = std::env::var_os("FAILOVER_LOGS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("api.log"), api.log()).unwrap();
        for (i, w) in workers.iter().enumerate() {
            std::fs::write(dir.join(format!("worker{}.log", i + 1)), w.log()).unwrap();
        }
        for name in ["etcd.log", "node1.log", "node2.log"] {
            let _ = std::fs::copy(ha.dir.join(name), dir.join(name));
        }
        eprintln!("failover: the processes' logs are in {}", dir.display());
    }
    let alive = api.is_running() && workers.iter_mut().all(Process::is_running);
    if !alive {
        failures.push("a control-plane process exited during the run".to_string());
    }
    eprintln!("failover: the run took {} in all", ms(run.elapsed()));
    assert!(failures.is_empty(), "failover: {}", failures.join("\n"));
    drop(ha);
}

/// How many attempts of each delivery ended as an expired lease, read from
/// the primary through the multi-host URL.
async fn expired_leases(url: &str) -> HashMap<String, u32> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query(
            &format!(
                "SELECT delivery_id::text, count(*) FROM {SCHEMA}.attempts \
                 WHERE result = 'lease_expired' GROUP BY 1"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u32))
        .collect()
}
