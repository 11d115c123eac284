//! Wake-ups for idle workers: a counter that moves whenever new work may be
//! due. A store owns the [`Wakeup`]; `DeliveryStore::delivery_wakeups` hands
//! out its receivers as the port's [`Wakeups`].

use async_trait::async_trait;
use control_plane_core::Wakeups;
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

    /// A receiver; a notification sent between two waits is not lost.
    pub fn subscribe(&self) -> Box<dyn Wakeups> {
        Box::new(Receiver(self.0.subscribe()))
    }
}

/// One subscriber's side.
struct Receiver(watch::Receiver<u64>);

#[async_trait]
impl Wakeups for Receiver {
    fn seen(&mut self) -> bool {
        let unseen = self.0.has_changed().unwrap_or(false);
        self.0.borrow_and_update();
        unseen
    }

    async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notification_before_the_wait_is_not_lost() {
        let w = Wakeup::default();
        let mut rx = w.subscribe();
        assert!(!rx.seen(), "nothing sent yet");
        w.notify();
        assert!(rx.seen(), "the notification is unseen until looked at");
        assert!(!rx.seen(), "and seen after");
        w.notify();
        let woken = tokio::time::timeout(std::time::Duration::from_secs(1), rx.changed())
            .await
            .expect("woken");
        assert!(woken);
        assert!(!rx.seen(), "changed() marks it seen");
        drop(w);
        assert!(!rx.changed().await, "a closed channel says so");
    }
}
