//! The binary resolves its profile fail-closed and runs the embedded default.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_control-plane"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CONTROLPLANE_")) {
        c.env_remove(k);
    }
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
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
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("CONTROLPLANE_STROE"), "{}", stderr(&o));
}

#[test]
fn postgres_without_url_names_the_missing_variable() {
    let o = bin()
        .arg("status")
        .env("CONTROLPLANE_STORE", "postgres")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("CONTROLPLANE_DATABASE_URL"),
        "{}",
        stderr(&o)
    );
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
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("CONTROLPLANE_STORE=postgres"),
            "{}",
            stderr(&o)
        );
    }
    assert!(!dir.path().join("s.duckdb").exists(), "nothing was opened");
}

#[test]
fn unknown_command_prints_usage() {
    let o = bin().arg("frobnicate").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("usage: control-plane"));
    let o = bin().output().unwrap();
    assert_eq!(o.status.code(), Some(2));
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
    assert!(
        dir.path().join("control-plane.duckdb").exists(),
        "the default path is ./control-plane.duckdb"
    );
}

#[test]
fn serve_runs_until_sigterm_and_releases_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.duckdb");
    let mut child = bin()
        .arg("serve")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.contains("ready on the embedded store"), "{ready}");
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
    let after = bin()
        .arg("status")
        .env("CONTROLPLANE_EMBEDDED_PATH", &path)
        .output()
        .unwrap();
    assert!(after.status.success(), "{}", stderr(&after));
}

fn test_database_url() -> String {
    std::env::var("CONTROLPLANE_TEST_DATABASE_URL").expect(
        "CONTROLPLANE_TEST_DATABASE_URL is not set: run the tests through `cargo xtask test`, which provides a database",
    )
}

#[test]
fn postgres_profile_migrates_and_reports_status() {
    let schema = format!("cp_cli_{}", std::process::id());
    let run = |cmd: &str| {
        bin()
            .arg(cmd)
            .env("CONTROLPLANE_STORE", "postgres")
            .env("CONTROLPLANE_DATABASE_URL", test_database_url())
            .env("CONTROLPLANE_DATABASE_SCHEMA", &schema)
            .env("CONTROLPLANE_POOL_SIZE", "2")
            .output()
            .unwrap()
    };
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
