//! The store behind a connection pooler and on a server that takes no
//! writes (issue 74): Debian's PgBouncer in session mode works, in
//! transaction mode the store refuses to start naming the mode and the fix,
//! and a read-only server is not ready and answers writes as unavailable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{database_url, fresh_schema, open_in, test_keys, SchemaGuard};
use control_plane_core::*;
use control_plane_store_kit::DatabaseUrl;
use serde_json::json;
use store_postgres::{PostgresConfig, PostgresStore};

/// A PgBouncer of this test's own in front of the test database.
struct Bouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

impl Bouncer {
    /// Starts PgBouncer with `pool_mode`, forwarding to the test database.
    fn start(pool_mode: &str) -> Bouncer {
        assert!(
            Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: install Debian's pgbouncer (apt-get install pgbouncer; .ci/run does)"
        );
        let upstream: tokio_postgres::Config = database_url().expose().parse().unwrap();
        let host = match &upstream.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[allow(unreachable_patterns)]
            _ => "127.0.0.1".to_string(),
        };
        let port = upstream.get_ports().first().copied().unwrap_or(5432);
        let db = upstream.get_dbname().unwrap_or("postgres").to_string();
        let user = upstream.get_user().unwrap_or("postgres").to_string();
        let listen = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(
            d.join("pgbouncer.ini"),
            format!(
                "[databases]\n{db} = host={host} port={port} dbname={db}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {pool_mode}\n\
                 default_pool_size = 4\nmax_client_conn = 200\n\
                 logfile = {log}\npidfile = {pid}\n",
                users = d.join("users.txt").display(),
                log = d.join("pgbouncer.log").display(),
                pid = d.join("pgbouncer.pid").display(),
            ),
        )
        .unwrap();
        // PgBouncer will not run as root: as root, it runs as postgres.
        let mut cmd = Command::new(PGBOUNCER);
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if root {
            Command::new("chmod")
                .args(["-R", "a+rwX"])
                .arg(d)
                .status()
                .unwrap();
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(d.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", listen)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {listen}: {}",
                std::fs::read_to_string(d.join("pgbouncer.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Bouncer {
            child,
            port: listen,
            _dir: dir,
        }
    }

    fn url(&self) -> DatabaseUrl {
        let upstream: tokio_postgres::Config = database_url().expose().parse().unwrap();
        let db = upstream.get_dbname().unwrap_or("postgres");
        let user = upstream.get_user().unwrap_or("postgres");
        DatabaseUrl::new(format!("postgres://{user}@127.0.0.1:{}/{db}", self.port))
    }
}

fn config(url: DatabaseUrl, schema: &str) -> PostgresConfig {
    let mut config = PostgresConfig::new(url);
    config.schema = Some(schema.to_string());
    config.pool_size = 2;
    config.keys = test_keys();
    config
}

fn hook(account: &AccountId) -> Checked<EndpointCreateRequest> {
    EndpointCreateRequest::new(
        account.clone(),
        "https://example.com/hook",
        Secret::new("whsec_cnJycnJycnJycnJycnJycnJycnJycnJy"),
    )
    .checked()
    .unwrap()
}

/// Through PgBouncer in session mode the store opens in its own schema and
/// a delivery goes round: published, claimed, delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_session_mode_carries_the_whole_delivery_path() {
    let bouncer = Bouncer::start("session");
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let store = PostgresStore::open(config(bouncer.url(), &schema), Arc::new(SystemClock))
        .await
        .unwrap_or_else(|e| panic!("through PgBouncer in session mode: {e}"));
    let account = AccountId::new("a").unwrap();
    store.endpoint_create(hook(&account)).await.unwrap();
    let published = store
        .event_publish(
            PublishRequest::new(account.clone(), "t", json!({"n": 1}))
                .checked()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(published.deliveries.len(), 1);
    let claimed = store
        .delivery_claim(ClaimRequest::new("w", 10, Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // The tables are in the store's schema, not in the pooler's default.
    let direct = open_in(&schema, StoreOptions::default(), Arc::new(SystemClock), 1).await;
    let listed = direct
        .delivery_list(DeliveryListRequest::all(account, PageRequest::first(10)))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

/// Through PgBouncer in transaction mode the store refuses to start, with
/// an error that names the mode and the fix, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_transaction_mode_is_refused_at_start() {
    let bouncer = Bouncer::start("transaction");
    let schema = fresh_schema();
    let _guard = SchemaGuard(schema.clone());
    let refused = PostgresStore::open(config(bouncer.url(), &schema), Arc::new(SystemClock))
        .await
        .expect_err("a pooler in transaction mode is refused");
    let text = refused.to_string();
    assert!(
        matches!(refused, StoreError::InvalidInput(_)),
        "{refused:?}"
    );
    assert!(
        text.contains("transaction") && text.contains("pool_mode = session"),
        "{text}"
    );
}

/// A server that takes no writes (a standby, a primary being demoted) is
/// not ready, and a write on it is `Unavailable` (the API's 503), never a
/// backend error. The store's role is made read-only and its connection
/// cut: the pool reconnects, and the new session takes no writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_not_ready_and_refuses_writes_as_unavailable() {
    let admin = workspace_tests::pg_client().await;
    let upstream: tokio_postgres::Config = database_url().expose().parse().unwrap();
    let db = upstream.get_dbname().unwrap_or("postgres").to_string();
    let port = upstream.get_ports().first().copied().unwrap_or(5432);
    let role = format!("cp_ro_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE {db} TO {role}"
        ))
        .await
        .unwrap();
    let schema = fresh_schema();
    let url = DatabaseUrl::new(format!("postgres://{role}@127.0.0.1:{port}/{db}"));
    let store = PostgresStore::open(config(url, &schema), Arc::new(SystemClock))
        .await
        .unwrap();
    store.ping().await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER ROLE {role} SET default_transaction_read_only = on; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        ))
        .await
        .unwrap();
    // The cut connection may answer first; the next is a read-only session.
    let mut not_ready = store.ping().await.unwrap_err();
    for _ in 0..5 {
        if matches!(&not_ready, StoreError::Unavailable(m) if m.contains("read-only")) {
            break;
        }
        not_ready = store.ping().await.unwrap_err();
    }
    assert!(
        matches!(&not_ready, StoreError::Unavailable(m) if m.contains("read-only")),
        "{not_ready:?}"
    );
    let refused = store
        .endpoint_create(hook(&AccountId::new("a").unwrap()))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::Unavailable(m) if m.contains("read-only")),
        "{refused:?}"
    );
    assert!(refused.is_retryable());
    drop(store);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"
        ))
        .await
        .unwrap();
}
