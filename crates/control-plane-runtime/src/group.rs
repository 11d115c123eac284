//! Group commit: many callers' writes of one kind share a transaction when
//! they wait at the same moment. The API's publishes and the dispatcher's
//! outcomes both go through it.
//!
//! A caller is answered only after the write holding its item returned, so
//! an answer still means what the store's answer means. A writer takes the
//! first waiting item and whatever else is already queued (up to a bound),
//! and writes them with one call. Nothing waits for company unless a
//! [`Linger`] asks for it, and then only while items arrive together.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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

/// How long a writer may wait for company. After a write of more than one
/// item (items are arriving together), the next group waits up to `wait`
/// for more until it holds `fill`; after a write of one item (a quiet
/// moment, or one caller at a time) it is written at once, so a lone
/// caller never waits. [`Linger::NONE`] never waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linger {
    /// The longest wait for company.
    pub wait: Duration,
    /// The group that ends the wait at once.
    pub fill: usize,
}

impl Linger {
    /// Never waits for company.
    pub const NONE: Linger = Linger {
        wait: Duration::ZERO,
        fill: 0,
    };
}

impl<T: Send + 'static, R: Send + 'static> GroupCommit<T, R> {
    /// Starts `writers` writer tasks (in the current runtime) over a queue
    /// of `capacity` items; each takes up to `max` items (waiting for more
    /// as `linger` says) and writes them with `write`, which answers each
    /// item in order (an answer missing at the end is `Unavailable`).
    /// `what` names it in errors.
    pub fn start<W, Fut>(
        what: &'static str,
        writers: usize,
        (capacity, max): (usize, usize),
        linger: Linger,
        write: W,
    ) -> (Self, Vec<tokio::task::JoinHandle<()>>)
    where
        W: Fn(Vec<T>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Vec<StoreResult<R>>> + Send + 'static,
    {
        let (queue, rx) = mpsc::channel::<Item<T, R>>(capacity.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let tasks = (0..writers.max(1))
            .map(|_| {
                let shape = Shape {
                    max: max.max(1),
                    linger,
                };
                tokio::spawn(write_groups(rx.clone(), shape, write.clone(), what))
            })
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

/// The largest group and how long to wait for one.
#[derive(Clone, Copy)]
struct Shape {
    max: usize,
    linger: Linger,
}

/// One writer: the next item and whatever else is queued behind it (or
/// arrives while it lingers), written together, until the queue is closed
/// and empty.
async fn write_groups<T, R, W, Fut>(
    rx: Arc<Mutex<mpsc::Receiver<Item<T, R>>>>,
    shape: Shape,
    write: W,
    what: &'static str,
) where
    W: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Vec<StoreResult<R>>>,
{
    let mut last = 0;
    loop {
        let mut group = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(first) => group.push(first),
                None => return,
            }
            while group.len() < shape.max {
                match rx.try_recv() {
                    Ok(next) => group.push(next),
                    Err(_) => break,
                }
            }
            let fill = shape.linger.fill.min(shape.max);
            if last > 1 && group.len() < fill && !shape.linger.wait.is_zero() {
                let until = tokio::time::Instant::now() + shape.linger.wait;
                while group.len() < fill {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(next)) => group.push(next),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        last = group.len();
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
        let (group, _tasks) = GroupCommit::start(
            "test writer",
            1,
            (64, 8),
            Linger::NONE,
            move |items: Vec<u32>| {
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
            },
        );
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

    /// A lingering writer: a lone caller is written at once; after a write
    /// of several items the next group waits for company until it is full,
    /// or until the wait is over, and then is written as it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lingering_writer_waits_for_company_only_after_a_full_moment() {
        let writes = Arc::new(std::sync::Mutex::new(Vec::<Vec<u32>>::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (seen, held) = (writes.clone(), gate.clone());
        let linger = Linger {
            wait: std::time::Duration::from_millis(300),
            fill: 3,
        };
        let write = move |items: Vec<u32>| {
            let (seen, held) = (seen.clone(), held.clone());
            async move {
                // The write of 3 waits, so that 4 and 5 queue up together.
                if items.contains(&3) {
                    let _ = held.acquire().await;
                }
                seen.lock().unwrap().push(items.clone());
                items.into_iter().map(Ok).collect()
            }
        };
        let (group, _tasks) = GroupCommit::start("test writer", 1, (64, 8), linger, write);
        let submit = |i: u32| {
            let g = group.clone();
            tokio::spawn(async move { g.submit(i).await })
        };
        let pause = || tokio::time::sleep(std::time::Duration::from_millis(50));
        // Alone, twice: neither waits (a lingering write would take 300 ms).
        for i in [1, 2] {
            let answer = tokio::time::timeout(std::time::Duration::from_millis(250), submit(i));
            assert_eq!(
                answer.await.unwrap().unwrap().unwrap(),
                i,
                "a lone caller waited"
            );
        }
        let third = submit(3);
        pause().await;
        let together = [submit(4), submit(5)];
        pause().await;
        gate.add_permits(1);
        third.await.unwrap().unwrap();
        for t in together {
            t.await.unwrap().unwrap();
        }
        // After a write of two, 6 waits for company and shares its write.
        let sixth = submit(6);
        pause().await;
        let rest = [submit(7), submit(8)];
        sixth.await.unwrap().unwrap();
        for t in rest {
            t.await.unwrap().unwrap();
        }
        // A group that never fills is written when the wait is over.
        assert_eq!(submit(9).await.unwrap().unwrap(), 9);
        // Callers queued at the same moment arrive in any order.
        let mut writes = writes.lock().unwrap().clone();
        writes.iter_mut().for_each(|w| w.sort_unstable());
        assert_eq!(
            writes,
            vec![
                vec![1],
                vec![2],
                vec![3],
                vec![4, 5],
                vec![6, 7, 8],
                vec![9]
            ]
        );
    }
}
