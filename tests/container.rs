//! The container image and the compose file, run as users run them (issue
//! 56). `cargo xtask container` (part of `cargo xtask ci`) builds the image
//! first and runs these with `--ignored`, naming it in
//! `CONTROLPLANE_TEST_IMAGE`; every container joins the host's network, so
//! it reaches this test's receiver and the test database on loopback.
// Test code: a failed helper is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use workspace_tests::{
    answer_ok, api_call, database_url, pg_client, signature_is_valid, unique, wait_until, Receiver,
    Schema,
};

const ADMIN: &str = "cpa_container_test_admin_token_0123456789";
/// The user the image runs as.
const IMAGE_UID: u32 = 65532;

fn image() -> String {
    std::env::var("CONTROLPLANE_TEST_IMAGE")
        .expect("CONTROLPLANE_TEST_IMAGE is not set: run these through `cargo xtask container`")
}

/// The docker client `cargo xtask container` chose.
fn docker_bin() -> String {
    std::env::var("CONTROLPLANE_TEST_DOCKER").unwrap_or_else(|_| "docker".into())
}

fn run(program: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut c = Command::new(program);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// `docker args…`, which must succeed; its standard output, trimmed.
fn docker(args: &[&str]) -> String {
    let out = run(&docker_bin(), args, &[]);
    assert!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The API of a running service, by its base address.
struct Api {
    base: String,
}

impl Api {
    /// Waits until `/readyz` answers 200; how long that took from `since`.
    /// `logs` says why not, past 60 s.
    async fn wait_ready(&self, since: Instant, logs: impl Fn() -> String) -> Duration {
        let http = reqwest::Client::new();
        loop {
            let ready = http
                .get(format!("{}/readyz", self.base))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                return since.elapsed();
            }
            assert!(
                since.elapsed() < Duration::from_secs(60),
                "not ready within 60 s:\n{}",
                logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        api_call(
            &reqwest::Client::new(),
            &self.base,
            ADMIN,
            method,
            path,
            body,
        )
        .await
    }
}

/// A container of the image on the host's network, removed when dropped.
struct Container {
    id: String,
    api: Api,
}

impl Container {
    /// `docker run -d` with `args` before the image, the API on a free
    /// loopback port, then the image's default command.
    fn run(args: &[&str], env: &[(&str, String)]) -> Container {
        let port = free_port();
        // As README's `docker run` and the Compose file run it: a read-only
        // root filesystem, no capability, no privilege escalation.
        let mut all: Vec<String> = [
            "run",
            "-d",
            "--network",
            "host",
            "--health-interval",
            "1s",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        for (k, v) in env {
            all.extend(["-e".to_string(), format!("{k}={v}")]);
        }
        all.extend([
            "-e".to_string(),
            format!("CONTROLPLANE_LISTEN=127.0.0.1:{port}"),
            image(),
        ]);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        Container {
            id: docker(&refs),
            api: Api {
                base: format!("http://127.0.0.1:{port}"),
            },
        }
    }

    fn inspect(&self, format: &str) -> String {
        docker(&["inspect", "--format", format, &self.id])
    }

    fn logs(&self) -> String {
        let out = run(&docker_bin(), &["logs", &self.id], &[]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    async fn wait_ready(&self, since: Instant) -> Duration {
        self.api.wait_ready(since, || self.logs()).await
    }

    /// `docker stop` (SIGTERM, SIGKILL after 10 s): how long it took and
    /// the exit code.
    fn stop(&self) -> (Duration, i64) {
        let start = Instant::now();
        docker(&["stop", "--time", "10", &self.id]);
        let took = start.elapsed();
        (took, self.inspect("{{.State.ExitCode}}").parse().unwrap())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run(&docker_bin(), &["rm", "--force", &self.id], &[]);
    }
}

/// A named volume, removed when dropped.
struct Volume(String);

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = run(&docker_bin(), &["volume", "rm", "--force", &self.0], &[]);
    }
}

/// The effective user id of a container's main process, read from the host.
fn uid_of(c: &Container) -> u32 {
    let pid = c.inspect("{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Creates an endpoint for `event_type` at `url`: its id and secret.
async fn endpoint(c: &Api, url: &str, event_type: &str) -> (String, String) {
    let (s, v) = c
        .call(
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(json!({"url": url, "event_types": [event_type]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let text = |k: &str| v[k].as_str().unwrap().to_string();
    (text("id"), text("secret"))
}

/// Publishes one event: its id and its deliveries' ids.
async fn publish(c: &Api, event_type: &str, n: u64) -> (String, Vec<String>) {
    let (s, v) = c
        .call(
            "POST",
            "/v1/accounts/acme/events",
            Some(json!({"type": event_type, "payload": {"n": n}})),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let ids = v["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    (v["id"].as_str().unwrap().to_string(), ids)
}

async fn wait_delivered(c: &Api, delivery: &str) -> Value {
    let path = format!("/v1/accounts/acme/deliveries/{delivery}");
    let start = Instant::now();
    loop {
        let (s, d) = c.call("GET", &path, None).await;
        if s == 200 && d["state"] == "delivered" {
            return d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "delivery {delivery} not delivered within 60 s: {d}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
#[ignore = "needs the image: run by `cargo xtask container`"]
fn the_image_answers_its_version_and_help() {
    let version = docker(&["run", "--rm", &image(), "--version"]);
    assert!(version.starts_with("control-plane "), "{version}");
    let help = docker(&["run", "--rm", &image(), "--help"]);
    assert!(help.contains("healthcheck"), "{help}");
}

#[tokio::test]
#[ignore = "needs the image: run by `cargo xtask container`"]
async fn embedded_keeps_its_volume_runs_as_non_root_and_stops_on_sigterm() {
    let (rx, hooks) = Receiver::start(answer_ok()).await;
    let volume = Volume(unique("cp-test-state"));
    let mount = format!("{}:/var/lib/control-plane", volume.0);
    let env = [
        ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
    ];
    let started = Instant::now();
    let c = Container::run(&["-v", &mount], &env);
    let ready_after = c.wait_ready(started).await;
    println!(
        "embedded: ready {} ms after `docker run`",
        ready_after.as_millis()
    );
    assert_eq!(uid_of(&c), IMAGE_UID, "the process must not run as root");
    wait_until(
        "the image's health check turns healthy",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { c.inspect("{{.State.Health.Status}}") == "healthy" },
    )
    .await;

    let (endpoint_id, secret) =
        endpoint(&c.api, &format!("{hooks}/embedded"), "order.created").await;
    let (event, deliveries) = publish(&c.api, "order.created", 1).await;
    assert_eq!(deliveries.len(), 1);
    wait_delivered(&c.api, &deliveries[0]).await;
    assert_eq!(rx.requests("embedded").len(), 1);
    assert!(signature_is_valid(&secret, &rx.requests("embedded")[0]));

    let (took, code) = c.stop();
    println!("embedded: stopped {} ms after SIGTERM", took.as_millis());
    assert_eq!(code, 0, "exit code after SIGTERM:\n{}", c.logs());
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    drop(c);

    // A new container on the same volume: the store and the key survived.
    let again = Container::run(&["-v", &mount], &env);
    again.wait_ready(Instant::now()).await;
    let (s, v) = again
        .api
        .call("GET", &format!("/v1/accounts/acme/events/{event}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    let d = wait_delivered(&again.api, &deliveries[0]).await;
    assert_eq!(d["endpoint_id"], endpoint_id.as_str(), "{d}");
    // The endpoint's sealed secret opens and signs with the kept key.
    let (_, second) = publish(&again.api, "order.created", 2).await;
    wait_delivered(&again.api, &second[0]).await;
    let sent = rx.requests("embedded");
    assert_eq!(sent.len(), 2);
    assert!(signature_is_valid(&secret, &sent[1]));
}

/// A copy of the tests' key file that the image's user can read.
fn key_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chown_to_image_user(dir.path());
    let key = std::fs::read(workspace_tests::key_file()).unwrap();
    write_secret(&dir.path().join("secret-key"), &key);
    dir
}

/// Writes a secret file as README says to: mode 0600 from the start, owned
/// by the image's user, the only one that reads it.
fn write_secret(path: &Path, contents: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(contents).unwrap();
    chown_to_image_user(path);
}

fn chown_to_image_user(path: &Path) {
    std::os::unix::fs::chown(path, Some(IMAGE_UID), Some(IMAGE_UID)).unwrap_or_else(|e| {
        panic!(
            "cannot hand {} to uid {IMAGE_UID} (the tests run as root in CI): {e}",
            path.display()
        )
    });
}

#[tokio::test]
#[ignore = "needs the image: run by `cargo xtask container`"]
async fn postgres_runs_with_the_key_passed_in() {
    let (rx, hooks) = Receiver::start(answer_ok()).await;
    let schema = Schema::new("cp_container");
    let keys = key_dir();
    // The database URL as a secret file too, as the manifests pass it.
    write_secret(&keys.path().join("database-url"), database_url().as_bytes());
    let mount = format!("{}:/run/secrets/control-plane:ro", keys.path().display());
    let mut env: Vec<(&str, String)> = schema
        .env(4)
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                *k,
                "CONTROLPLANE_SECRET_KEY_FILE" | "CONTROLPLANE_DATABASE_URL"
            )
        })
        .collect();
    env.extend([
        (
            "CONTROLPLANE_SECRET_KEY_FILE",
            "/run/secrets/control-plane/secret-key".to_string(),
        ),
        (
            "CONTROLPLANE_DATABASE_URL_FILE",
            "/run/secrets/control-plane/database-url".to_string(),
        ),
        ("CONTROLPLANE_ADMIN_TOKEN", ADMIN.to_string()),
        ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
    ]);
    let started = Instant::now();
    let c = Container::run(&["-v", &mount], &env);
    let ready_after = c.wait_ready(started).await;
    println!(
        "postgres: ready {} ms after `docker run`",
        ready_after.as_millis()
    );
    let (_, secret) = endpoint(&c.api, &format!("{hooks}/pg"), "order.created").await;
    let (_, deliveries) = publish(&c.api, "order.created", 1).await;
    wait_delivered(&c.api, &deliveries[0]).await;
    assert!(signature_is_valid(&secret, &rx.requests("pg")[0]));
    // The stores' rows are where the variables said.
    let n: i64 = pg_client()
        .await
        .query_one(&format!("SELECT count(*) FROM {}.events", schema.0), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let (_, code) = c.stop();
    assert_eq!(code, 0, "{}", c.logs());
}

/// `docker-compose` with the repository's file and the external-PostgreSQL
/// override, as project `project`, with `env`.
fn compose(project: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    // This test belongs to crates/control-plane; the workspace is two up.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = root.join("deploy").join("docker-compose.yml");
    let external = root.join("deploy").join("compose.external-postgres.yml");
    let (file, external) = (file.to_string_lossy(), external.to_string_lossy());
    let mut all = vec!["-f", &*file, "-f", &*external, "-p", project];
    all.extend_from_slice(args);
    let program =
        std::env::var("CONTROLPLANE_TEST_COMPOSE").unwrap_or_else(|_| "docker-compose".into());
    run(&program, &all, env)
}

fn compose_ok(project: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let out = compose(project, args, env);
    assert!(
        out.status.success(),
        "docker-compose {} failed:\n{}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops and removes a compose project when dropped.
struct Project {
    name: String,
    env: Vec<(&'static str, String)>,
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = compose(
            &self.name,
            &["down", "--volumes", "--timeout", "5"],
            &self.env,
        );
    }
}

#[tokio::test]
#[ignore = "needs the image: run by `cargo xtask container`"]
async fn compose_runs_two_workers_and_loses_nothing_when_one_is_killed() {
    const EVENTS: u64 = 300;
    // Slow enough that the kill lands mid-run: an endpoint's default cap
    // of 16 in flight at 400 ms a send is about 8 s for the whole run.
    let (rx, hooks) = Receiver::start(workspace_tests::answer_after(
        Duration::from_millis(400),
        200,
    ))
    .await;
    let schema = Schema::new("cp_compose");
    let secrets = key_dir();
    write_secret(
        &secrets.path().join("admin-token"),
        format!("{ADMIN}\n").as_bytes(),
    );
    // The URL reaches the services as a secret file, never in their
    // environment; the gate asks the server's address alone.
    write_secret(
        &secrets.path().join("database-url"),
        format!("{}\n", database_url()).as_bytes(),
    );
    let server: tokio_postgres::Config = database_url().parse().unwrap();
    let host = match server.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("the compose test needs a TCP host in the database URL, got {other:?}"),
    };
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let api_port = free_port();
    let env: Vec<(&'static str, String)> = vec![
        ("CONTROLPLANE_IMAGE", image()),
        ("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8".to_string()),
        ("CONTROLPLANE_PG_HOST", host),
        ("CONTROLPLANE_PG_PORT", port.to_string()),
        ("CONTROLPLANE_DATABASE_SCHEMA", schema.0.clone()),
        (
            "CONTROLPLANE_SECRETS_DIR",
            secrets.path().display().to_string(),
        ),
        ("CONTROLPLANE_PORT", api_port.to_string()),
        ("CONTROLPLANE_WORKER_1_PORT", free_port().to_string()),
        ("CONTROLPLANE_WORKER_2_PORT", free_port().to_string()),
        (
            "CONTROLPLANE_PG_GATE_IMAGE",
            std::env::var("CONTROLPLANE_TEST_PG_GATE_IMAGE").unwrap(),
        ),
    ];
    let project = Project {
        name: unique("cpcompose").replace('_', ""),
        env: env.clone(),
    };
    // The file validates as Compose reads it.
    let config = compose_ok(&project.name, &["config"], &env);
    for service in ["postgres:", "migrate:", "api:", "worker-1:", "worker-2:"] {
        assert!(config.contains(service), "{service} missing:\n{config}");
    }
    assert!(
        config.contains("/run/secrets") || config.contains("secrets:"),
        "{config}"
    );
    assert!(
        !config.contains(&database_url()),
        "the database URL is in the configuration in clear:\n{config}"
    );

    compose_ok(&project.name, &["up", "-d", "--no-build"], &env);
    // The worker's container id now, so that the kill itself is quick
    // (docker-compose takes a second or more to start).
    let worker_1 = compose_ok(&project.name, &["ps", "-q", "worker-1"], &env)
        .trim()
        .to_string();
    assert!(!worker_1.is_empty(), "worker-1 is not running");
    // It runs as the file says: read-only, no capability, no escalation,
    // and the database URL is not in its environment.
    let host_config = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}}",
        &worker_1,
    ]);
    assert_eq!(
        host_config, "true [ALL] [no-new-privileges:true]",
        "worker-1's host configuration"
    );
    let environment = docker(&["inspect", "--format", "{{.Config.Env}}", &worker_1]);
    assert!(
        environment.contains("CONTROLPLANE_DATABASE_URL_FILE=")
            && !environment.contains("CONTROLPLANE_DATABASE_URL="),
        "{environment}"
    );
    let api = Api {
        base: format!("http://127.0.0.1:{api_port}"),
    };
    api.wait_ready(Instant::now(), || {
        String::from_utf8_lossy(&compose(&project.name, &["logs", "--no-color"], &env).stdout)
            .into_owned()
    })
    .await;
    let (s, v) = api
        .call(
            "POST",
            "/v1/accounts/acme/endpoints",
            Some(json!({"url": format!("{hooks}/compose"), "event_types": ["order.created"]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let mut deliveries = Vec::new();
    // In batches of 100, so that publishing takes a moment, not seconds
    // the workers would spend delivering.
    for first in (0..EVENTS).step_by(100) {
        let events: Vec<Value> = (first..first + 100)
            .map(|n| json!({"type": "order.created", "payload": {"n": n}}))
            .collect();
        let (s, v) = api
            .call(
                "POST",
                "/v1/accounts/acme/events/batch",
                Some(json!({ "events": events })),
            )
            .await;
        assert_eq!(s, 202, "{v}");
        for e in v["events"].as_array().unwrap() {
            let ids = e["deliveries"].as_array().unwrap();
            deliveries.extend(ids.iter().map(|d| d.as_str().unwrap().to_string()));
        }
    }
    assert_eq!(deliveries.len() as u64, EVENTS);
    // One worker dies (SIGKILL) while the two deliver.
    let start = Instant::now();
    while rx.count() < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "deliveries did not begin within 60 s:\n{}",
            String::from_utf8_lossy(&compose(&project.name, &["logs", "--no-color"], &env).stdout)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    docker(&["kill", "--signal", "KILL", &worker_1]);
    let killed_at = rx.count();
    assert!(
        (killed_at as u64) < EVENTS / 2,
        "{killed_at} deliveries were done before the kill: make the receiver slower"
    );
    // The other worker (and the lease) finish the rest: nothing is lost.
    wait_until(
        "every event reaches the receiver",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let ids: std::collections::HashSet<String> = rx
                .requests("compose")
                .iter()
                .map(|r| r.webhook_id().to_string())
                .collect();
            ids.len() as u64 >= EVENTS
        },
    )
    .await;
    for d in &deliveries {
        wait_delivered(&api, d).await;
    }
    println!(
        "compose: {EVENTS} events delivered by two workers, one killed after {killed_at} POSTs; {} POSTs in all",
        rx.count()
    );
}
