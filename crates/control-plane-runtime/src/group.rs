//! Group commit: many callers' writes of one kind share a transaction when
//! they wait at the same moment. The API's publishes and the dispatcher's
//! outcomes both go through it.
//!
//! A caller is answered only after the write holding its item returned, so
//! an answer still means what the store's answer means. Nothing waits for
//! company: a writer takes the first waiting item and whatever else is
//! already queued (up to a bound), and writes them with one call.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};

use control_plane_core::{StoreError, StoreResult};

type Item<T, R> = (T, oneshot::Sender<StoreResult<R>>);

/// The queue callers submit to; dropped, its writers stop after the last
/// queued group.
pub struct GroupCommit<T, R> {
    queue: mpsc::Sender<Item<T, R>>,
    what: &'static str,
}

impl<T, R> Clone for GroupCommit<T, R> {
    fn clone(&self) -> Self {
        GroupCommit {
            queue: self.queue.clone(),
            what: self.what,
        }
    }
}

impl<T: Send + 'static, R: Send + 'static> GroupCommit<T, R> {
    /// Starts `writers` writer tasks (in the current runtime) over a queue
    /// of `capacity` items; each takes up to `max` items and writes them
    /// with `write`, which answers each item in order (an answer missing at
    /// the end is `Unavailable`). `what` names it in errors.
    pub fn start<W, Fut>(
        what: &'static str,
        writers: usize,
        capacity: usize,
        max: usize,
        write: W,
    ) -> (Self, Vec<tokio::task::JoinHandle<()>>)
    where
        W: Fn(Vec<T>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Vec<StoreResult<R>>> + Send + 'static,
    {
        let (queue, rx) = mpsc::channel::<Item<T, R>>(capacity.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let tasks = (0..writers.max(1))
            .map(|_| tokio::spawn(write_groups(rx.clone(), max.max(1), write.clone(), what)))
            .collect();
        (GroupCommit { queue, what }, tasks)
    }

    /// Submits `item` and waits for its answer.
    ///
    /// # Errors
    /// The store's answer for the item; `Unavailable` when the writers
    /// stopped.
    pub async fn submit(&self, item: T) -> StoreResult<R> {
        let stopped = || StoreError::Unavailable(format!("the {} stopped", self.what));
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((item, reply))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// One writer: the next item and whatever else is queued behind it, written
/// together, until the queue is closed and empty.
async fn write_groups<T, R, W, Fut>(
    rx: Arc<Mutex<mpsc::Receiver<Item<T, R>>>>,
    max: usize,
    write: W,
    what: &'static str,
) where
    W: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Vec<StoreResult<R>>>,
{
    loop {
        let mut group = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(first) => group.push(first),
                None => return,
            }
            while group.len() < max {
                match rx.try_recv() {
                    Ok(next) => group.push(next),
                    Err(_) => break,
                }
            }
        }
        let (items, replies): (Vec<T>, Vec<_>) = group.into_iter().unzip();
        let mut answers = write(items).await.into_iter();
        for reply in replies {
            let answer = answers.next().unwrap_or_else(|| {
                Err(StoreError::Unavailable(format!(
                    "the {what} answered fewer items than it wrote"
                )))
            });
            let _ = reply.send(answer);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Items waiting together are written in one call and each caller gets
    /// its own answer, in order; a short answer is `Unavailable`, not a hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_items_share_a_write_and_each_gets_its_answer() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let held = gate.clone();
        let (group, _tasks) =
            GroupCommit::start("test writer", 1, 64, 8, move |items: Vec<u32>| {
                let counted = counted.clone();
                let held = held.clone();
                async move {
                    // The first write waits so that the next ones queue up.
                    if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                        let _ = held.acquire().await;
                    }
                    items
                        .into_iter()
                        .filter(|i| *i != 99)
                        .map(|i| Ok(i * 10))
                        .collect()
                }
            });
        let first = tokio::spawn({
            let g = group.clone();
            async move { g.submit(1).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let rest: Vec<_> = (2..=5)
            .map(|i| {
                let g = group.clone();
                tokio::spawn(async move { g.submit(i).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        gate.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), 10);
        for (i, r) in rest.into_iter().enumerate() {
            assert_eq!(r.await.unwrap().unwrap(), (i as u32 + 2) * 10);
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "one write alone, then one for the four"
        );
        let short = group.submit(99).await;
        assert!(
            matches!(short, Err(StoreError::Unavailable(_))),
            "{short:?}"
        );
    }
}
