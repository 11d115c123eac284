//! The binary resolves its profile fail-closed and runs the embedded default.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use workspace_tests::Schema;

mod serving;
use serving::read_request;

fn bin() -> Command {
    isolated(Command::new(env!("CARGO_BIN_EXE_control-plane")))
}

/// `c` without the shell's `CONTROLPLANE_*` settings, its API on a free port
/// (tests run in parallel).
fn isolated(mut c: Command) -> Command {
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        c.env_remove(k);
    }
    c.env("CONTROLPLANE_LISTEN", "127.0.0.1:0");
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The process stopped as on a configuration error (exit code 2), and its
/// error names `what`.
fn refused_naming(o: &Output, what: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains(what), "{what} is not named: {e}");
}

#[test]
fn unknown_store_fails_closed_naming_what_is_accepted() {
    let o = bin()
        .arg("status")
        .env("CONTROLPLANE_STORE", "sqlite")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("CONTROLPLANE_STORE") && e.contains("embedded") && e.contains("postgres"),
        "{e}"
    );
}

#[test]
fn unknown_controlplane_variable_fails_closed() {
    let o = bin()
        .arg("status")
        .env("CONTROLPLANE_STROE", "embedded")
        .output()
        .unwrap();
    refused_naming(&o, "CONTROLPLANE_STROE");
}

#[test]
fn postgres_without_url_names_the_missing_variable() {
    let o = bin()
        .arg("status")
        .env("CONTROLPLANE_STORE", "postgres")
        .output()
        .unwrap();
    refused_naming(&o, "CONTROLPLANE_DATABASE_URL");
}

#[test]
fn split_roles_on_embedded_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    for role in ["api", "worker"] {
        let o = bin()
            .arg(role)
            .env("CONTROLPLANE_EMBEDDED_PATH", dir.path().join("s.duckdb"))
            .output()
            .unwrap();
        refused_naming(&o, "CONTROLPLANE_STORE=postgres");
    }
    assert!(!dir.path().join("s.duckdb").exists(), "nothing was opened");
    // `api` without a shared admin token: refused before the store is opened
    // (the database URL points nowhere).
    let o = bin()
        .arg("api")
        .env("CONTROLPLANE_STORE", "postgres")
        .env("CONTROLPLANE_SECRET_KEY_FILE", "/nonexistent/key")
        .env("CONTROLPLANE_DATABASE_URL", "postgres://app@127.0.0.1:1/db")
        .output()
        .unwrap();
    refused_naming(&o, "CONTROLPLANE_ADMIN_TOKEN");
}

#[test]
fn unknown_command_prints_usage() {
    let o = bin().arg("frobnicate").output().unwrap();
    refused_naming(&o, "Usage: control-plane");
    let o = bin().output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn help_and_version_describe_every_command_and_its_variables() {
    let o = bin().arg("--help").output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    for command in ["serve", "api", "worker", "migrate", "status"] {
        assert!(help.contains(command), "{command} missing from:\n{help}");
    }
    let o = bin().arg("--version").output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("control-plane {}", env!("CARGO_PKG_VERSION"))
    );
    let o = bin().args(["serve", "--help"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let serve = String::from_utf8_lossy(&o.stdout).into_owned();
    for (var, default) in [
        ("CONTROLPLANE_CONCURRENCY", "[64]"),
        ("CONTROLPLANE_STORE", "[embedded]"),
        ("CONTROLPLANE_RETENTION", "[30d]"),
        ("CONTROLPLANE_LOG_FORMAT", "[text]"),
    ] {
        let line = serve.lines().find(|l| l.trim_start().starts_with(var));
        assert!(
            line.is_some_and(|l| l.contains(default)),
            "{var} {default} missing from:\n{serve}"
        );
    }
    let o = bin().args(["migrate", "--help"]).output().unwrap();
    let migrate = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(migrate.contains("CONTROLPLANE_DATABASE_URL"), "{migrate}");
    assert!(
        !migrate.contains("CONTROLPLANE_CONCURRENCY"),
        "migrate lists only what it reads:\n{migrate}"
    );
}

#[test]
fn a_malformed_log_filter_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .arg("status")
        .current_dir(dir.path())
        .env("CONTROLPLANE_LOG", "info,=[")
        .output()
        .unwrap();
    refused_naming(&o, "CONTROLPLANE_LOG");
}

/// With `CONTROLPLANE_AUTO_MIGRATE=false`, a store whose schema is behind
/// refuses to start and names `control-plane migrate`; `migrate` applies the
/// migrations whatever the setting, and then the store opens.
fn operator_owned_migrations(env: &[(String, String)]) {
    let run = |cmd: &str| {
        bin()
            .arg(cmd)
            .envs(env.iter().cloned())
            .env("CONTROLPLANE_AUTO_MIGRATE", "false")
            .output()
            .unwrap()
    };
    let refused = run("status");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("run `control-plane migrate`"),
        "{}",
        stderr(&refused)
    );
    let m = run("migrate");
    assert!(m.status.success(), "{}", stderr(&m));
    let s = run("status");
    assert!(s.status.success(), "{}", stderr(&s));
}

#[test]
fn embedded_store_behind_its_schema_refuses_to_start_without_auto_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    operator_owned_migrations(&[(
        "CONTROLPLANE_EMBEDDED_PATH".into(),
        path.to_string_lossy().into_owned(),
    )]);
}

#[test]
fn postgres_store_behind_its_schema_refuses_to_start_without_auto_migrate() {
    let schema = Schema::new("cp_cli_mig");
    let env: Vec<(String, String)> = schema
        .env(2)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    operator_owned_migrations(&env);
}

#[test]
fn status_reports_counts_on_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .arg("status")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["store"], "embedded");
    assert!(v["deliveries"].as_object().unwrap().is_empty());
    assert_eq!(
        (
            v["open_circuits"].as_u64(),
            v["disabled_endpoints"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert!(
        dir.path().join("control-plane.duckdb").exists(),
        "the default path is ./control-plane.duckdb"
    );
}

/// The service raises its soft limit of open files to the hard limit (here
/// started with a soft limit of 256).
#[test]
fn serve_raises_its_open_files_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = isolated(Command::new("bash"))
        .args([
            "-c",
            "ulimit -S -n 256 && exec \"$0\" serve",
            env!("CARGO_BIN_EXE_control-plane"),
        ])
        .env("CONTROLPLANE_EMBEDDED_PATH", dir.path().join("s.duckdb"))
        .env(
            "CONTROLPLANE_ADMIN_TOKEN",
            "cpa_limits_admin_token_0123456789abcdef",
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open to the end: the child logs to it.
    let _stderr = ready_on_the_embedded_store(&mut child);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers.len(), 2, "{line}");
    assert_ne!(numbers[0], "256", "the soft limit was not raised: {line}");
    assert_eq!(
        numbers[0], numbers[1],
        "soft limit below the hard one: {line}"
    );
}

/// The "ready on" line `child` logs, which must name the embedded store (the
/// first start logs the key file it created before it), and its log lines
/// after it.
fn ready_on_the_embedded_store(
    child: &mut std::process::Child,
) -> (String, std::io::Lines<BufReader<std::process::ChildStderr>>) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.contains("ready on"))
        .unwrap();
    assert!(ready.contains("ready on the embedded store"), "{ready}");
    (ready, lines)
}

#[test]
fn serve_runs_until_sigterm_and_releases_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let mut child = bin()
        .arg("serve")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ready, mut lines) = ready_on_the_embedded_store(&mut child);
    // No CONTROLPLANE_ADMIN_TOKEN: the generated token is in a file of this
    // user's only, beside the store (also 0600), and the log names the file.
    let told = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.contains("admin token"))
        .unwrap();
    let token_file = dir.path().join("control-plane.admin-token");
    assert!(told.contains(&token_file.display().to_string()), "{told}");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(token.starts_with("cpa_") && token.len() >= 32, "{token}");
    use std::os::unix::fs::PermissionsExt;
    for file in [&token_file, &path] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    let api = ready
        .split("API on http://")
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    let mut s = std::net::TcpStream::connect(&api).unwrap();
    std::io::Write::write_all(
        &mut s,
        format!(
            "GET /v1/accounts/acme/endpoints HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the file's token works: {answer}"
    );
    let busy = bin()
        .arg("status")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .output()
        .unwrap();
    assert!(!busy.status.success());
    assert!(
        stderr(&busy).contains("in use by another process"),
        "{}",
        stderr(&busy)
    );
    let kill = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut said).unwrap();
    for line in lines {
        said.push_str(&line.unwrap());
    }
    assert!(!said.contains(&token), "the token was written out: {said}");
    let after = bin()
        .arg("status")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .output()
        .unwrap();
    assert!(after.status.success(), "{}", stderr(&after));
}

#[test]
fn postgres_profile_migrates_and_reports_status() {
    let schema = Schema::new("cp_cli");
    let run = |cmd: &str| bin().arg(cmd).envs(schema.env(2)).output().unwrap();
    let m = run("migrate");
    assert!(m.status.success(), "{}", stderr(&m));
    assert!(String::from_utf8_lossy(&m.stdout).contains("postgres"));
    let s = run("status");
    assert!(s.status.success(), "{}", stderr(&s));
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(v["store"], "postgres");
}

#[test]
fn unreachable_postgres_is_a_clear_error_without_the_password() {
    let o = bin()
        .arg("status")
        .env("CONTROLPLANE_STORE", "postgres")
        .env("CONTROLPLANE_SECRET_KEY_FILE", workspace_tests::key_file())
        .env(
            "CONTROLPLANE_DATABASE_URL",
            "postgres://app:sekrit-pw@127.0.0.1:1/db",
        )
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("cannot open the postgres store"), "{e}");
    assert!(!e.contains("sekrit-pw"), "the password leaked: {e}");
}

/// The embedded store at `path`, with the default settings.
async fn open_embedded(path: &std::path::Path) -> store_embedded::EmbeddedStore {
    store_embedded::EmbeddedStore::open(
        store_embedded::EmbeddedConfig::new(path),
        std::sync::Arc::new(control_plane_core::SystemClock),
    )
    .await
    .unwrap()
}

fn acme() -> control_plane_core::AccountId {
    control_plane_core::AccountId::new("acme").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_delivers_a_signed_webhook_end_to_end() {
    use control_plane_core::*;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let delivery = {
        // Until the HTTP API lands, the test writes the endpoint and the event through the store.
        let (store, acct) = (open_embedded(&path).await, acme());
        store
            .endpoint_create(
                EndpointCreateRequest::new(acct.clone(), url, secret.clone())
                    .checked()
                    .unwrap(),
            )
            .await
            .unwrap();
        let p = store
            .event_publish(
                PublishRequest::new(acct, "order.created", serde_json::json!({"id": 7}))
                    .checked()
                    .unwrap(),
            )
            .await
            .unwrap();
        p.deliveries[0]
    };
    let mut serve = tokio::process::Command::from(bin());
    let mut child = serve
        .arg("serve")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .env("CONTROLPLANE_ALLOWED_TARGETS", "127.0.0.0/8")
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (mut sock, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
        .await
        .expect("a webhook arrives")
        .unwrap();
    let (headers, body) = read_request(&mut sock).await;
    sock.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    drop(sock);
    assert_eq!(headers["webhook-id"], delivery.to_string());
    let ts: i64 = headers["webhook-timestamp"].parse().unwrap();
    assert!(dispatcher::signing::verify(
        &secret,
        &headers["webhook-signature"],
        &headers["webhook-id"],
        ts,
        body.as_bytes()
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    serving::stop(&mut child).await;
    let out = bin()
        .arg("status")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["deliveries"]["delivered"], 1, "{v}");
}

/// The embedded default creates its key file (0600) beside the store;
/// `rotate-key` seals the plain secrets written before; without that key
/// the store refuses to start, naming the key id; given it back, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_file_is_created_and_rotate_key_seals_what_was_plain() {
    use control_plane_core::*;
    use control_plane_store_kit::SecretKey;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    {
        // Written as a version before sealing would: plain text.
        let (store, acct) = (open_embedded(&path).await, acme());
        store
            .endpoint_create(
                EndpointCreateRequest::new(
                    acct,
                    "https://example.com/hook",
                    Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                )
                .checked()
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let run = |cmd: &str, key: Option<&std::path::Path>| {
        let mut c = bin();
        c.arg(cmd).env("CONTROLPLANE_EMBEDDED_PATH", &path);
        if let Some(k) = key {
            c.env("CONTROLPLANE_SECRET_KEY_FILE", k);
        }
        c.output().unwrap()
    };
    let o = run("rotate-key", None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("the secrets of 1 endpoints"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let key_file = dir.path().join("s.duckdb.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let key = SecretKey::parse(&std::fs::read_to_string(&key_file).unwrap()).unwrap();
    assert!(stderr(&o).contains(key.id()), "the new key's id is logged");
    assert!(
        !stderr(&o).contains(&key.to_text()),
        "the key itself is not"
    );
    // Rotating again finds nothing left.
    let o = run("rotate-key", None);
    assert!(String::from_utf8_lossy(&o.stdout).contains("the secrets of 0 endpoints"));
    // The key moved away: a new one is made, the store refuses it, and the
    // new one goes again.
    let kept = dir.path().join("kept.key");
    std::fs::rename(&key_file, &kept).unwrap();
    let o = run("status", None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(key.id()), "{}", stderr(&o));
    assert!(
        !key_file.exists(),
        "the key made for a store that did not open is not left where the right one belongs"
    );
    // Given back, it starts.
    let o = run("status", Some(&kept));
    assert!(o.status.success(), "{}", stderr(&o));
}
