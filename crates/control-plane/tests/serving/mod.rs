//! What the tests that run `serve` share: a webhook read off a socket, and
//! stopping the service as an operator does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::time::Duration;

/// One HTTP request read off a socket: (headers, body).
pub async fn read_request(
    sock: &mut tokio::net::TcpStream,
) -> (std::collections::HashMap<String, String>, String) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = sock.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed early");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let headers: std::collections::HashMap<String, String> = head
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            let len: usize = headers["content-length"].parse().unwrap();
            while buf.len() < end + len {
                let n = sock.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            return (
                headers,
                String::from_utf8_lossy(&buf[end..end + len]).to_string(),
            );
        }
    }
}

/// Stops `serve` with SIGTERM, as an operator or an orchestrator does, and
/// asserts it exits cleanly within 20 s.
pub async fn stop(child: &mut tokio::process::Child) {
    let kill = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().unwrap().to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("serve stops")
        .unwrap();
    assert!(status.success());
}
