//! The one claim/run/drain loop behind both workers: the webhook dispatcher
//! and the workflow task runner. It claims as many items as it has free
//! slots, runs each in its own task, and on stop claims no more, gives the
//! running items the grace period, then halts the rest (each gives its claim
//! back) and waits for them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::Wakeups;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What the loop claims and runs.
pub(crate) trait Work: Send + Sync {
    /// One claimed item.
    type Item: Send + 'static;
    /// How running one item ended.
    type Ended: Send + 'static;

    /// Claims up to `limit` items; an error is logged by the implementation
    /// and given as none.
    fn claim(&self, limit: u32) -> impl Future<Output = Vec<Self::Item>> + Send;

    /// Runs one item. When `halt` is cancelled (the grace period ended) the
    /// run stops its work, gives its claim back and ends.
    fn run(
        &self,
        item: Self::Item,
        halt: CancellationToken,
    ) -> impl Future<Output = Self::Ended> + Send + 'static;

    /// How an item that did not end normally (it panicked) is counted.
    fn lost(&self) -> Self::Ended;

    /// Wake-ups that make an idle loop claim before its poll interval.
    fn wakeups(&self) -> Option<Box<dyn Wakeups>> {
        None
    }
}

/// Parked items per slot at most: a parked send is an open socket and a
/// small future (about 10 KiB), so a worker of 64 slots keeps at most 256
/// parked sends, and new receivers that never answer can take the slots
/// again (until they are parked too) four times over before slots stay held.
pub(crate) const PARKED_PER_SLOT: usize = 4;

/// How the loop runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pump {
    /// Items running at most.
    pub concurrency: usize,
    /// Largest claim.
    pub max_batch: u32,
    /// Wait between empty claims when no wake-up arrives.
    pub poll_interval: Duration,
    /// On stop, how long running items may finish before they are halted.
    pub grace: Duration,
    /// With fewer free slots than this and items running, wait up to
    /// `gather` for more to free up before claiming: one claim costs the
    /// store a scan whatever its size. `0` never waits.
    pub gather_below: u32,
    /// The longest such wait.
    pub gather: Duration,
    /// An item still running after this long gives its slot back and runs
    /// on as parked, while fewer than [`PARKED_PER_SLOT`] × `concurrency`
    /// items are parked (ADR 0019): slow items then never hold every slot.
    /// `None` never parks.
    pub park_after: Option<Duration>,
}

impl Pump {
    /// Runs `work` until `stop`, then drains; `ended` sees how each item ended.
    pub(crate) async fn run<W: Work>(
        &self,
        work: &W,
        stop: CancellationToken,
        mut ended: impl FnMut(W::Ended),
    ) {
        let permits = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let parking = Arc::new(Semaphore::new(
            self.concurrency.max(1).saturating_mul(PARKED_PER_SLOT),
        ));
        let freed = Arc::new(Notify::new());
        let halt = CancellationToken::new();
        let mut running: JoinSet<W::Ended> = JoinSet::new();
        let mut wake = work.wakeups();
        let mut gathering: Option<Instant> = None;
        let mut tally = |done: Option<Result<W::Ended, tokio::task::JoinError>>| match done {
            Some(Ok(e)) => ended(e),
            Some(Err(_)) => ended(work.lost()),
            None => {}
        };
        while !stop.is_cancelled() {
            while let Some(done) = running.try_join_next() {
                tally(Some(done));
            }
            let free = match self
                .room(&permits, &mut running, &freed, &stop, &mut gathering)
                .await
            {
                Ok(free) => free,
                Err(done) => {
                    tally(done);
                    continue;
                }
            };
            if let Some(w) = wake.as_mut() {
                w.seen();
            }
            let claimed = work.claim(free.min(self.max_batch).max(1)).await;
            if claimed.is_empty() {
                // A finished item frees a slot (and, for deliveries, a slot of
                // its endpoint's in-flight cap): worth a claim as much as a
                // wake-up is.
                tokio::select! {
                    done = running.join_next(), if !running.is_empty() => tally(done),
                    _ = changed(&mut wake) => {}
                    _ = tokio::time::sleep(self.poll_interval) => {}
                    _ = stop.cancelled() => {}
                }
                continue;
            }
            for item in claimed {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                // Boxed: an async block that awaits a future it captured
                // holds it twice (the capture and the awaited state), and
                // with thousands in flight that doubling is most of the
                // process's memory (ADR 0017).
                let run = Box::pin(work.run(item, halt.clone()));
                running.spawn(hold_or_park(
                    run,
                    permit,
                    self.park_after,
                    parking.clone(),
                    freed.clone(),
                ));
            }
        }
        drain(&mut running, self.grace, &halt, &mut tally).await;
    }
}

/// Gives what is `running` `grace` to end, then tells it to `halt` and
/// waits for it; `tally` sees each end.
async fn drain<E: 'static>(
    running: &mut JoinSet<E>,
    grace: Duration,
    halt: &CancellationToken,
    mut tally: impl FnMut(Option<Result<E, tokio::task::JoinError>>),
) {
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    while !running.is_empty() {
        tokio::select! {
            done = running.join_next() => tally(done),
            _ = &mut deadline => break,
        }
    }
    halt.cancel();
    while let Some(done) = running.join_next().await {
        tally(Some(done));
    }
}

impl Pump {
    /// The free slots to claim for now; or, when none is free or fewer than
    /// `gather_below` while items run (for up to `gather`), a wait for one
    /// to free up, with the item that ended during it, if any.
    async fn room<E: 'static>(
        &self,
        permits: &Semaphore,
        running: &mut JoinSet<E>,
        freed: &Notify,
        stop: &CancellationToken,
        gathering: &mut Option<Instant>,
    ) -> Result<u32, Option<Result<E, tokio::task::JoinError>>> {
        let free = u32::try_from(permits.available_permits()).unwrap_or(u32::MAX);
        if free == 0 {
            return Err(tokio::select! {
                done = running.join_next() => done,
                () = freed.notified() => None,
                _ = stop.cancelled() => None,
            });
        }
        if free < self.gather_below && !running.is_empty() {
            let since = *gathering.get_or_insert_with(Instant::now);
            let left = self.gather.saturating_sub(since.elapsed());
            if !left.is_zero() {
                return Err(tokio::select! {
                    done = running.join_next() => done,
                    () = freed.notified() => None,
                    _ = tokio::time::sleep(left) => None,
                    _ = stop.cancelled() => None,
                });
            }
        }
        *gathering = None;
        Ok(free)
    }
}

/// Runs one item in `slot`. After `park_after` it gives the slot back
/// (waking the claim loop through `freed`) and runs on parked, when a
/// parking place is free (ADR 0019).
async fn hold_or_park<F: Future>(
    mut run: std::pin::Pin<Box<F>>,
    slot: OwnedSemaphorePermit,
    park_after: Option<Duration>,
    parking: Arc<Semaphore>,
    freed: Arc<Notify>,
) -> F::Output {
    let mut slot = Some(slot);
    let mut parked = None;
    if let Some(after) = park_after {
        tokio::select! {
            e = &mut run => return e,
            () = tokio::time::sleep(after) => {}
        }
        if let Ok(p) = parking.try_acquire_owned() {
            parked = Some(p);
            drop(slot.take());
            freed.notify_one();
        }
    }
    let e = run.await;
    drop((slot, parked));
    e
}

/// Resolves when `wake` changes; never without one.
async fn changed(wake: &mut Option<Box<dyn Wakeups>>) {
    match wake {
        Some(w) => {
            if !w.changed().await {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Items 0 and 1 run until halted; every later one ends at once.
    struct TwoStuck {
        next: AtomicU32,
    }

    impl Work for TwoStuck {
        type Item = u32;
        type Ended = bool;

        fn claim(&self, limit: u32) -> impl Future<Output = Vec<u32>> + Send {
            let start = self.next.fetch_add(limit, Ordering::SeqCst);
            async move { (start..start + limit).collect() }
        }

        // Not `async fn`: the loop needs a future that does not borrow `self`.
        #[allow(clippy::manual_async_fn)]
        fn run(
            &self,
            item: u32,
            halt: CancellationToken,
        ) -> impl Future<Output = bool> + Send + 'static {
            async move {
                if item < 2 {
                    halt.cancelled().await;
                    false
                } else {
                    true
                }
            }
        }

        fn lost(&self) -> bool {
            false
        }
    }

    async fn quick_items_run(park_after: Option<Duration>) -> u32 {
        let pump = Pump {
            concurrency: 2,
            max_batch: 2,
            poll_interval: Duration::from_millis(10),
            grace: Duration::ZERO,
            gather_below: 0,
            gather: Duration::ZERO,
            park_after,
        };
        let work = TwoStuck {
            next: AtomicU32::new(0),
        };
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            stopper.cancel();
        });
        let mut quick = 0;
        pump.run(&work, stop, |ok| quick += u32::from(ok)).await;
        quick
    }

    #[tokio::test]
    async fn items_running_past_park_after_give_their_slots_back() {
        assert_eq!(
            quick_items_run(None).await,
            0,
            "without parking two stuck items hold both slots"
        );
        assert!(
            quick_items_run(Some(Duration::from_millis(50))).await > 10,
            "parked, they leave both slots to quick items"
        );
    }
}
