//! Wake-ups for idle workers: a counter that moves whenever new work may be due.

use tokio::sync::watch;

/// The sending side, owned by a store. Cheap to call after every commit that
/// makes work due.
#[derive(Debug)]
pub struct Wakeup(watch::Sender<u64>);

impl Default for Wakeup {
    fn default() -> Self {
        Wakeup(watch::channel(0).0)
    }
}

impl Wakeup {
    /// Tells every subscriber that work may be due.
    pub fn notify(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver; `changed().await` returns once per notification burst, and
    /// a notification sent between two waits is not lost.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notification_before_the_wait_is_not_lost() {
        let w = Wakeup::default();
        let mut rx = w.subscribe();
        w.notify();
        tokio::time::timeout(std::time::Duration::from_secs(1), rx.changed())
            .await
            .expect("woken")
            .expect("open");
    }
}
