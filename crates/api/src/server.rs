//! The API's HTTP/1 server, with the limits a server open to the network
//! needs (README "Server limits"):
//!
//! - **header timeout**: a connection that has not sent a whole request head
//!   within it is closed. The clock starts whenever the connection waits for
//!   a head, so it is also the idle timeout of a kept-alive connection.
//! - **body timeout** (`ApiConfig::body_timeout`, applied by the router): a
//!   request whose body has not arrived within it is answered `408`.
//! - **connection bound**: past it, new connections wait in the listen
//!   backlog until one closes.
//! - **shutdown deadline**: on stop, no connection is accepted, idle ones
//!   close at once, requests in progress may finish within the deadline, and
//!   whatever is still open then (a half-sent head, a slow body) is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::error::ApiError;

/// The server's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Time to send a whole request head, and to start the next request on a
    /// kept-alive connection.
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long requests in progress may finish after a stop.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    /// 10 s for a head (and idle), 16,384 connections, 5 s
    /// to finish at shutdown (within README's 10 s).
    fn default() -> Self {
        ServerLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 16_384,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `stop` is cancelled,
/// then drains as [`ServerLimits::shutdown_grace`] says.
///
/// # Errors
/// Never today: a failed `accept` (out of descriptors, say) is logged and
/// retried after a pause rather than ending the server.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: CancellationToken,
    limits: ServerLimits,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    // Asked to finish: idle connections close, busy ones after their answer.
    let finish = CancellationToken::new();
    // Past the deadline: whatever is still open is dropped.
    let force = CancellationToken::new();
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "api: accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let (finish, force) = (finish.clone(), force.clone());
        connections.spawn(async move {
            let _permit = permit;
            serve_connection(stream, peer, router, limits.header_timeout, (finish, force)).await;
        });
    }
    drop(listener);
    finish.cancel();
    connections.close();
    if tokio::time::timeout(limits.shutdown_grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.len(),
            "api: connections still open after the shutdown deadline are dropped"
        );
        force.cancel();
        connections.wait().await;
    }
    Ok(())
}

/// One connection, until the client closes it, a limit closes it, or the
/// server finishes: on `finish` it closes once idle, on `force` at once.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
    header_timeout: Duration,
    (finish, force): (CancellationToken, CancellationToken),
) {
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        router.clone().oneshot(req.map(Body::new))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "api: connection ended");
            }
            return;
        }
        () = finish.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "api: connection ended at shutdown");
            }
        }
        () = force.cancelled() => {}
    }
}

/// Reads the request's body before the handler runs, within `timeout`:
/// `408` when the client is slower, `413` past `limit` (the extractors'
/// own limit is the same one), `400` when the client broke off.
pub(crate) async fn read_body_within(
    axum::extract::State((timeout, limit)): axum::extract::State<(Duration, usize)>,
    req: Request<Body>,
    next: Next,
) -> Response {
    use axum::body::HttpBody;
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) if is_over_limit(&e) => ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over the limit of {limit} bytes"),
        )
        .into_response(),
        Ok(Err(_)) => ApiError::bad_request("the request body could not be read").into_response(),
        Err(_) => ApiError::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        )
        .into_response(),
    }
}

/// Whether reading a body failed because it was over the limit.
fn is_over_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}
