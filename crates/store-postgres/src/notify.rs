//! LISTEN/NOTIFY wake-ups across replicas.
//!
//! A commit that makes work due sends one `pg_notify` after it commits (so the
//! publishing transaction never takes NOTIFY's commit-time lock), and wakes
//! local workers at once. Each store keeps one dedicated connection outside
//! the pool that LISTENs and turns notifications from other replicas into
//! local wake-ups; it reconnects on its own. Polling remains the fallback, so
//! a lost notification only delays work.

use std::sync::Arc;
use std::time::Duration;

use control_plane_store_kit::Wakeup;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};

/// The channel for a schema: fixed length, whatever the schema's name.
pub(crate) fn channel_for(schema: &str) -> String {
    let h = control_plane_core::fnv1a(schema.bytes());
    format!("cp_wakeup_{h:016x}")
}

/// Aborts the listener when the last store handle goes.
#[derive(Debug)]
pub(crate) struct Listener(JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The first wait before connecting again after the listener's connection
/// dropped; it doubles while connecting fails, up to [`RECONNECT_MAX`]. A
/// failover's new primary is heard about within this of its promotion, and
/// the workers woken (issue 74's failover test: they resumed 1 s after the
/// API with a fixed 1 s wait).
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between attempts while the server is away.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Starts the listener task.
pub(crate) fn spawn(pg: tokio_postgres::Config, channel: String, wakeup: Arc<Wakeup>) -> Listener {
    Listener(tokio::spawn(async move {
        let mut wait = RECONNECT_FIRST;
        loop {
            let listened = listen_once(&pg, &channel, &wakeup).await;
            wait = if listened {
                RECONNECT_FIRST
            } else {
                (wait * 2).min(RECONNECT_MAX)
            };
            tokio::time::sleep(wait).await;
        }
    }))
}

/// One connection's life: LISTEN, forward notifications until it drops.
/// Whether it got as far as listening.
async fn listen_once(pg: &tokio_postgres::Config, channel: &str, wakeup: &Wakeup) -> bool {
    let Ok((client, mut conn)) = pg.connect(NoTls).await else {
        return false;
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(_) = m {
                if tx.send(()).is_err() {
                    break;
                }
            }
        }
    });
    let listened = client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .is_ok();
    if listened {
        // Work may have arrived while no one was listening.
        wakeup.notify();
        while rx.recv().await.is_some() {
            wakeup.notify();
        }
    }
    driver.abort();
    listened
}
