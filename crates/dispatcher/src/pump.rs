//! The one claim/run/drain loop behind both workers: the webhook dispatcher
//! and the workflow task runner. It claims for its free slots and, with
//! `ahead`, for a local queue beyond them that the slots draw from in claim
//! order (ADR 0038), runs each item in its own task, and on stop claims no
//! more, gives the queued items back, gives the running items the grace
//! period, then halts the rest (each gives its claim back) and waits for
//! them.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::Wakeups;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
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

    /// Runs one item in `slot`. When `halt` is cancelled (the grace period
    /// ended) the run stops its work, gives its claim back and ends. A run
    /// whose remaining work needs no slot (recording an outcome) calls
    /// [`Slot::free`]: the next item starts while it ends.
    fn run(
        &self,
        item: Self::Item,
        halt: CancellationToken,
        slot: Slot,
    ) -> impl Future<Output = Self::Ended> + Send + 'static;

    /// Gives an item back without running it: it waited in the local queue
    /// until the loop stopped, or until its claim would not outlast a run.
    fn give_back(&self, item: Self::Item) -> impl Future<Output = Self::Ended> + Send + 'static;

    /// How an item that did not end normally (it panicked) is counted.
    fn lost(&self) -> Self::Ended;

    /// Wake-ups that make an idle loop claim before its poll interval.
    fn wakeups(&self) -> Option<Box<dyn Wakeups>> {
        None
    }

    /// Whether claims may run `ahead` of the free slots now.
    fn may_run_ahead(&self) -> bool {
        true
    }
}

/// A running item's send slot, which it may give back before it ends.
pub(crate) struct Slot(Option<oneshot::Sender<()>>);

impl Slot {
    /// Gives the slot back now; the item still counts as claimed by this
    /// loop (it holds a place of `concurrency + ahead`) until it ends.
    pub(crate) fn free(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
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
    /// Items claimed beyond the free slots at most: they wait in a local
    /// queue, and count until they end, so claims need not shrink to the
    /// slots that happen to be free. `0` claims for free slots only.
    pub ahead: usize,
    /// Largest claim.
    pub max_batch: u32,
    /// Wait between empty claims when no wake-up arrives.
    pub poll_interval: Duration,
    /// On stop, how long running items may finish before they are halted.
    pub grace: Duration,
    /// With fewer free places than this and items in hand, wait for more to
    /// free up before claiming (up to `gather` while the local queue is
    /// empty): one claim costs the store a scan whatever its size. `0`
    /// never waits.
    pub gather_below: u32,
    /// The longest such wait with nothing queued.
    pub gather: Duration,
    /// An item still running after this long gives its slot back and runs
    /// on as parked, while fewer than [`PARKED_PER_SLOT`] × `concurrency`
    /// items are parked (ADR 0019): slow items then never hold every slot.
    /// `None` never parks.
    pub park_after: Option<Duration>,
    /// A queued item that waited this long is given back instead of run:
    /// its claim would not outlast its run. `None` never.
    pub stale_after: Option<Duration>,
}

/// A claimed item waiting for a slot, with its place and when it was claimed.
struct Queued<I> {
    item: I,
    place: OwnedSemaphorePermit,
    claimed: Instant,
}

/// What the loop holds while it runs.
struct Loop<I, E> {
    slots: Arc<Semaphore>,
    places: Arc<Semaphore>,
    parking: Arc<Semaphore>,
    freed: Arc<Notify>,
    halt: CancellationToken,
    running: JoinSet<E>,
    queue: VecDeque<Queued<I>>,
}

impl Pump {
    /// Runs `work` until `stop`, then drains; `ended` sees how each item ended.
    pub(crate) async fn run<W: Work>(
        &self,
        work: &W,
        stop: CancellationToken,
        mut ended: impl FnMut(W::Ended),
    ) {
        let slots = self.concurrency.max(1);
        let mut l: Loop<W::Item, W::Ended> = Loop {
            slots: Arc::new(Semaphore::new(slots)),
            places: Arc::new(Semaphore::new(slots.saturating_add(self.ahead))),
            parking: Arc::new(Semaphore::new(slots.saturating_mul(PARKED_PER_SLOT))),
            freed: Arc::new(Notify::new()),
            halt: CancellationToken::new(),
            running: JoinSet::new(),
            queue: VecDeque::new(),
        };
        let mut wake = work.wakeups();
        let mut gathering: Option<Instant> = None;
        let mut tally = |done: Option<Result<W::Ended, tokio::task::JoinError>>| match done {
            Some(Ok(e)) => ended(e),
            Some(Err(_)) => ended(work.lost()),
            None => {}
        };
        while !stop.is_cancelled() {
            while let Some(done) = l.running.try_join_next() {
                tally(Some(done));
            }
            // Without places beyond the slots there is nothing to run ahead
            // with: the slots' own gathering rule applies.
            let ahead = self.ahead > 0 && work.may_run_ahead();
            if !ahead {
                // A receiver turned slow: the queue goes back, to be claimed
                // again fairly for free slots, rather than wait behind it.
                give_back_queued(work, &mut l);
            }
            self.start(work, &mut l);
            let free = match self.room(&mut l, ahead, &stop, &mut gathering).await {
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
                // wake-up is; a freed slot starts a queued item.
                tokio::select! {
                    done = l.running.join_next(), if !l.running.is_empty() => tally(done),
                    () = l.freed.notified(), if !l.queue.is_empty() => {}
                    _ = changed(&mut wake) => {}
                    _ = tokio::time::sleep(self.poll_interval) => {}
                    _ = stop.cancelled() => {}
                }
                continue;
            }
            let claimed_at = Instant::now();
            for item in claimed {
                match l.places.clone().try_acquire_owned() {
                    Ok(place) => l.queue.push_back(Queued {
                        item,
                        place,
                        claimed: claimed_at,
                    }),
                    // More than asked for: given back at once.
                    Err(_) => {
                        l.running.spawn(work.give_back(item));
                    }
                }
            }
            self.start(work, &mut l);
        }
        give_back_queued(work, &mut l);
        drain(&mut l.running, self.grace, &l.halt, &mut tally).await;
    }

    /// Starts queued items, oldest first, on the free slots; gives back
    /// those that waited past `stale_after`.
    fn start<W: Work>(&self, work: &W, l: &mut Loop<W::Item, W::Ended>) {
        while let Some(front) = l.queue.front() {
            let stale = self
                .stale_after
                .is_some_and(|after| front.claimed.elapsed() >= after);
            if stale {
                if let Some(q) = l.queue.pop_front() {
                    l.running.spawn(holding(work.give_back(q.item), q.place));
                }
                continue;
            }
            let Ok(slot) = l.slots.clone().try_acquire_owned() else {
                return;
            };
            let Some(q) = l.queue.pop_front() else { return };
            let (tx, rx) = oneshot::channel();
            // Boxed: an async block that awaits a future it captured
            // holds it twice (the capture and the awaited state), and
            // with thousands in flight that doubling is most of the
            // process's memory (ADR 0017).
            let run = Box::pin(work.run(q.item, l.halt.clone(), Slot(Some(tx))));
            l.running.spawn(hold_or_park(
                run,
                Held {
                    slot,
                    place: q.place,
                    freed_early: rx,
                },
                self.park_after,
                l.parking.clone(),
                l.freed.clone(),
            ));
        }
    }
}

/// Gives back every queued item, unrun.
fn give_back_queued<W: Work>(work: &W, l: &mut Loop<W::Item, W::Ended>) {
    for q in std::mem::take(&mut l.queue) {
        l.running.spawn(holding(work.give_back(q.item), q.place));
    }
}

/// Runs `f` holding `place`.
async fn holding<F: Future>(f: F, place: OwnedSemaphorePermit) -> F::Output {
    let e = f.await;
    drop(place);
    e
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
    /// The free places to claim for now (only as many as the free slots
    /// unless `ahead`); or a wait for one to free up, with the item that
    /// ended during it, if any: when none is free; when fewer than
    /// `gather_below` (unless `ahead`, at most a quarter of the slots) are
    /// free and items are queued (they keep the slots busy meanwhile); or,
    /// with fewer free and items running, for up to `gather`. A wait ends
    /// early when the oldest queued item goes stale, so that it is given
    /// back.
    async fn room<I, E: 'static>(
        &self,
        l: &mut Loop<I, E>,
        ahead: bool,
        stop: &CancellationToken,
        gathering: &mut Option<Instant>,
    ) -> Result<u32, Option<Result<E, tokio::task::JoinError>>> {
        // Not running ahead, the places beyond the slots stay unused.
        let (kept, open) = if ahead {
            (0, self.concurrency.max(1).saturating_add(self.ahead))
        } else {
            (self.ahead, self.concurrency.max(1))
        };
        let free = l.places.available_permits().saturating_sub(kept);
        let free = u32::try_from(free).unwrap_or(u32::MAX);
        let below = if ahead {
            self.gather_below
        } else {
            self.gather_below
                .min(u32::try_from(open / 4).unwrap_or(u32::MAX).max(1))
        };
        let running = !l.running.is_empty();
        let wait = if free == 0 || (free < below && !l.queue.is_empty()) {
            None
        } else if free < below && running {
            let since = *gathering.get_or_insert_with(Instant::now);
            let left = self.gather.saturating_sub(since.elapsed());
            if left.is_zero() {
                *gathering = None;
                return Ok(free);
            }
            Some(left)
        } else {
            *gathering = None;
            return Ok(free);
        };
        // The oldest queued item going stale wakes the loop too.
        let stale = l.queue.front().and_then(|q| {
            self.stale_after
                .map(|after| after.saturating_sub(q.claimed.elapsed()))
        });
        let until = async {
            match [wait, stale].into_iter().flatten().min() {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending::<()>().await,
            }
        };
        Err(tokio::select! {
            done = l.running.join_next(), if running => done,
            () = l.freed.notified() => None,
            () = until => None,
            _ = stop.cancelled() => None,
        })
    }
}

/// What a started item holds: its send slot, its place among the items in
/// hand, and the signal that it gave its slot back early ([`Slot::free`]).
struct Held {
    slot: OwnedSemaphorePermit,
    place: OwnedSemaphorePermit,
    freed_early: oneshot::Receiver<()>,
}

/// Runs one item in its slot. It gives the slot back (waking the claim
/// loop through `freed`) when the item frees it early; or after
/// `park_after`, when a parking place is free, together with its place,
/// and runs on parked (ADR 0019).
async fn hold_or_park<F: Future>(
    mut run: std::pin::Pin<Box<F>>,
    held: Held,
    park_after: Option<Duration>,
    parking: Arc<Semaphore>,
    freed: Arc<Notify>,
) -> F::Output {
    let Held {
        slot,
        place,
        mut freed_early,
    } = held;
    let mut place = Some(place);
    let mut parked = None;
    let (mut early, mut may_park) = (true, park_after.is_some());
    let park = tokio::time::sleep(park_after.unwrap_or(Duration::ZERO));
    tokio::pin!(park);
    loop {
        tokio::select! {
            e = &mut run => return e,
            given = &mut freed_early, if early => {
                early = false;
                if given.is_ok() {
                    break;
                }
            }
            () = &mut park, if may_park => {
                may_park = false;
                if let Ok(p) = parking.clone().try_acquire_owned() {
                    parked = Some(p);
                    place = None;
                    break;
                }
            }
        }
    }
    drop(slot);
    freed.notify_one();
    let e = run.await;
    drop((place, parked));
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
    use std::sync::Mutex;

    /// How the test items run.
    #[derive(Clone, Copy)]
    enum Runs {
        /// Items 0 and 1 run until halted; every later one ends at once.
        TwoStuck,
        /// Every item runs until halted.
        UntilHalted,
        /// Every item frees its slot at once, then runs until halted.
        FreeThenUntilHalted,
    }

    struct Items {
        runs: Runs,
        /// Claims may run ahead for this long after the start (always when `None`).
        calm_for: Option<Duration>,
        born: Instant,
        next: AtomicU32,
        asked: Mutex<Vec<u32>>,
        started: AtomicU32,
        given_back: AtomicU32,
    }

    /// How an item ended.
    #[derive(Debug, PartialEq, Eq)]
    enum End {
        Quick,
        Halted,
        GivenBack,
    }

    impl Work for Items {
        type Item = u32;
        type Ended = End;

        fn claim(&self, limit: u32) -> impl Future<Output = Vec<u32>> + Send {
            self.asked.lock().unwrap().push(limit);
            let start = self.next.fetch_add(limit, Ordering::SeqCst);
            async move { (start..start + limit).collect() }
        }

        // Not `async fn`: the loop needs a future that does not borrow `self`.
        #[allow(clippy::manual_async_fn)]
        fn run(
            &self,
            item: u32,
            halt: CancellationToken,
            mut slot: Slot,
        ) -> impl Future<Output = End> + Send + 'static {
            self.started.fetch_add(1, Ordering::SeqCst);
            let runs = self.runs;
            async move {
                match runs {
                    Runs::TwoStuck if item >= 2 => return End::Quick,
                    Runs::FreeThenUntilHalted => slot.free(),
                    _ => {}
                }
                halt.cancelled().await;
                End::Halted
            }
        }

        fn give_back(&self, _: u32) -> impl Future<Output = End> + Send + 'static {
            self.given_back.fetch_add(1, Ordering::SeqCst);
            async { End::GivenBack }
        }

        fn lost(&self) -> End {
            End::Halted
        }

        fn may_run_ahead(&self) -> bool {
            self.calm_for.is_none_or(|d| self.born.elapsed() < d)
        }
    }

    fn pump(concurrency: usize, ahead: usize, max_batch: u32) -> Pump {
        Pump {
            concurrency,
            ahead,
            max_batch,
            poll_interval: Duration::from_millis(10),
            grace: Duration::ZERO,
            gather_below: 0,
            gather: Duration::ZERO,
            park_after: None,
            stale_after: None,
        }
    }

    /// Runs `pump` over items that run as `runs` for `for_ms`; how each ended.
    async fn run_for(pump: Pump, runs: Runs, for_ms: u64) -> (Items, Vec<End>) {
        run_calm_for(pump, runs, for_ms, None).await
    }

    async fn run_calm_for(
        pump: Pump,
        runs: Runs,
        for_ms: u64,
        calm_for: Option<Duration>,
    ) -> (Items, Vec<End>) {
        let work = Items {
            runs,
            calm_for,
            born: Instant::now(),
            next: AtomicU32::new(0),
            asked: Mutex::default(),
            started: AtomicU32::new(0),
            given_back: AtomicU32::new(0),
        };
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(for_ms)).await;
            stopper.cancel();
        });
        let mut ends = Vec::new();
        pump.run(&work, stop, |e| ends.push(e)).await;
        (work, ends)
    }

    #[tokio::test]
    async fn items_running_past_park_after_give_their_slots_back() {
        let quick = |ends: &[End]| ends.iter().filter(|e| **e == End::Quick).count();
        let (_, ends) = run_for(pump(2, 0, 2), Runs::TwoStuck, 500).await;
        assert_eq!(
            quick(&ends),
            0,
            "without parking two stuck items hold both slots"
        );
        let parking = Pump {
            park_after: Some(Duration::from_millis(50)),
            ..pump(2, 0, 2)
        };
        let (_, ends) = run_for(parking, Runs::TwoStuck, 500).await;
        assert!(
            quick(&ends) > 10,
            "parked, they leave both slots to quick items"
        );
    }

    #[tokio::test]
    async fn claims_run_ahead_of_the_slots_and_the_queue_goes_back_unrun_at_stop() {
        let (work, ends) = run_for(pump(2, 8, 100), Runs::UntilHalted, 200).await;
        assert_eq!(
            *work.asked.lock().unwrap(),
            vec![10],
            "one claim for the slots and the queue; none while every place is held"
        );
        assert_eq!(work.started.load(Ordering::SeqCst), 2, "two slots");
        assert_eq!(work.given_back.load(Ordering::SeqCst), 8);
        assert_eq!(ends.iter().filter(|e| **e == End::GivenBack).count(), 8);
        assert_eq!(ends.iter().filter(|e| **e == End::Halted).count(), 2);
        let (work, _) = run_for(pump(2, 0, 100), Runs::UntilHalted, 200).await;
        assert_eq!(
            *work.asked.lock().unwrap(),
            vec![2],
            "without `ahead`, the free slots"
        );
        assert_eq!(work.given_back.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_item_that_frees_its_slot_lets_the_next_start_but_keeps_its_place() {
        let (work, ends) = run_for(pump(1, 3, 100), Runs::FreeThenUntilHalted, 200).await;
        assert_eq!(
            work.started.load(Ordering::SeqCst),
            4,
            "one slot ran all four places' items, each freeing it"
        );
        assert_eq!(
            *work.asked.lock().unwrap(),
            vec![4],
            "places, not slots, bound the claims"
        );
        assert_eq!(ends.len(), 4);
        let (work, _) = run_for(pump(1, 3, 100), Runs::UntilHalted, 200).await;
        assert_eq!(
            work.started.load(Ordering::SeqCst),
            1,
            "a held slot starts nothing"
        );
    }

    #[tokio::test]
    async fn queued_items_that_wait_too_long_go_back_unrun() {
        let stale = Pump {
            stale_after: Some(Duration::from_millis(20)),
            ..pump(1, 2, 100)
        };
        let (work, _) = run_for(stale, Runs::UntilHalted, 300).await;
        assert_eq!(
            work.started.load(Ordering::SeqCst),
            1,
            "the one slot stays held"
        );
        assert!(
            work.given_back.load(Ordering::SeqCst) > 4,
            "stale items are given back and their places claimed again, not only the two queued at stop: {}",
            work.given_back.load(Ordering::SeqCst)
        );
    }

    #[tokio::test]
    async fn when_claims_may_no_longer_run_ahead_the_queue_goes_back() {
        let parking = Pump {
            park_after: Some(Duration::from_millis(50)),
            ..pump(1, 5, 100)
        };
        let calm = Some(Duration::from_millis(30));
        let (work, _) = run_calm_for(parking, Runs::UntilHalted, 300, calm).await;
        let asked = work.asked.lock().unwrap().clone();
        assert_eq!(asked[0], 6, "calm at first: the slot and five ahead");
        assert!(
            asked[1..].iter().all(|n| *n == 1),
            "then for the free slot only: {asked:?}"
        );
        assert!(asked.len() > 1, "the parked item freed its slot: {asked:?}");
        assert!(
            work.given_back.load(Ordering::SeqCst) >= 5,
            "the five queued went back"
        );
    }

    #[tokio::test]
    async fn without_places_ahead_the_gathering_is_the_slots_own() {
        // Gathering until 8 places are free would wait out the long gather
        // after the first claim; with nothing ahead it is a quarter of the
        // 8 slots, so the quick items are claimed again and again.
        let gathering = Pump {
            gather_below: 8,
            gather: Duration::from_secs(10),
            ..pump(8, 0, 100)
        };
        let (work, _) = run_for(gathering, Runs::TwoStuck, 300).await;
        let asked = work.asked.lock().unwrap().clone();
        assert!(asked.len() > 2, "claims: {asked:?}");
    }
}
