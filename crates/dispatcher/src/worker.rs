//! The delivery worker: claims batches sized to free capacity, sends
//! concurrently with one shared client, records outcomes, and drains on
//! shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::{
    ClaimRequest, ClaimedDelivery, Clock, DeliveryId, DeliveryOutcome, DynControlPlaneStore, Lease,
    OutcomeRecorded, StoreError, SystemClock, Telemetry, UsageMeter, UsageMetric,
};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::classify::{classify, parse_retry_after, RetryPolicy, SendResult};
use crate::signing::signature_header;

/// How long the loop may wait for more free send slots before it claims
/// for the few it has (see [`Dispatcher::run`]).
const GATHER: Duration = Duration::from_millis(2);

/// How a dispatcher runs.
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Worker name, recorded on leases.
    pub worker: String,
    /// Sends in flight at most.
    pub concurrency: usize,
    /// Largest claim.
    pub max_batch: u32,
    /// Lease per claimed delivery; longer than `request_timeout`.
    pub lease: Duration,
    /// Poll when no wake-up arrives.
    pub poll_interval: Duration,
    /// Whole-request timeout.
    pub request_timeout: Duration,
    /// On shutdown, how long in-flight sends may finish before their leases are released.
    pub grace: Duration,
    /// Retry schedule.
    pub retry: RetryPolicy,
    /// Private networks destinations may resolve to (all others are refused).
    pub allowed_targets: Vec<control_plane_core::config::Cidr>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            worker: "dispatcher".into(),
            concurrency: 64,
            max_batch: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(15),
            grace: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            allowed_targets: Vec::new(),
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchReport {
    /// Deliveries accepted by receivers.
    pub delivered: u64,
    /// Attempts that failed (retry, gone, give up).
    pub failed: u64,
    /// Leases released at shutdown.
    pub released: u64,
}

/// Sends webhooks for one process. Depends on the port only.
pub struct Dispatcher {
    store: DynControlPlaneStore,
    config: DispatcherConfig,
    ctx: Arc<SendContext>,
}

/// What every send needs, shared by the in-flight tasks.
struct SendContext {
    client: reqwest::Client,
    clock: Arc<dyn Clock>,
    policy: RetryPolicy,
    allowed: Vec<control_plane_core::config::Cidr>,
    telemetry: Arc<Telemetry>,
    usage: Arc<UsageMeter>,
}

impl Dispatcher {
    /// A dispatcher over `store`, with one shared HTTP client that follows no
    /// redirects and enforces `request_timeout`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(store: DynControlPlaneStore, config: DispatcherConfig) -> Result<Self, String> {
        // One process-wide TLS provider; a second install is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_secs(10)))
            .user_agent("control-plane-dispatcher")
            .dns_resolver(Arc::new(crate::ssrf::GuardedResolver::new(
                config.allowed_targets.clone(),
            )))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let ctx = Arc::new(SendContext {
            client,
            clock: Arc::new(SystemClock),
            policy: config.retry.clone(),
            allowed: config.allowed_targets.clone(),
            telemetry: Arc::default(),
            usage: Arc::default(),
        });
        Ok(Dispatcher { store, config, ctx })
    }

    /// Records attempts into `telemetry` (for `/metrics`) and per-account
    /// usage (attempts, bytes sent) into `usage`.
    pub fn with_meters(mut self, telemetry: Arc<Telemetry>, usage: Arc<UsageMeter>) -> Self {
        if let Some(ctx) = Arc::get_mut(&mut self.ctx) {
            ctx.telemetry = telemetry;
            ctx.usage = usage;
        }
        self
    }

    /// Runs until `stop` turns true, then stops claiming, lets in-flight sends
    /// finish within the grace period and releases the rest.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> DispatchReport {
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let leases: Arc<Mutex<HashMap<DeliveryId, Lease>>> = Arc::default();
        let mut inflight: JoinSet<Sent> = JoinSet::new();
        let mut wake = self.store.delivery_wakeups();
        let mut report = DispatchReport::default();
        let mut gathering: Option<Instant> = None;
        let (recorder, batcher) = Recorder::start(self.store.clone());
        let tally = |report: &mut DispatchReport, r: Sent| match r {
            Sent::Delivered => report.delivered += 1,
            Sent::Failed => report.failed += 1,
            Sent::NotRecorded => {}
        };
        while !*stop.borrow() {
            while let Some(done) = inflight.try_join_next() {
                tally(&mut report, done.unwrap_or(Sent::NotRecorded));
            }
            let free = permits.available_permits() as u32;
            if free == 0 {
                tokio::select! {
                    done = inflight.join_next() => tally(&mut report, done.and_then(|d| d.ok()).unwrap_or(Sent::NotRecorded)),
                    _ = stop.changed() => {}
                }
                continue;
            }
            // With only a few slots free and sends finishing, let more free
            // up for a moment: a claim costs the store a scan whatever its
            // size, so one claim for many slots beats many for one.
            if free < self.gather_below() && !inflight.is_empty() {
                let since = *gathering.get_or_insert_with(Instant::now);
                let left = GATHER.saturating_sub(since.elapsed());
                if !left.is_zero() {
                    tokio::select! {
                        done = inflight.join_next() => tally(&mut report, done.and_then(|d| d.ok()).unwrap_or(Sent::NotRecorded)),
                        _ = tokio::time::sleep(left) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
            }
            gathering = None;
            wake.borrow_and_update();
            let req = ClaimRequest {
                worker: self.config.worker.clone(),
                limit: free.min(self.config.max_batch).max(1),
                lease_for: self.config.lease,
            };
            let claimed = match self.store.delivery_claim(req).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("dispatcher: claim failed: {e}");
                    Vec::new()
                }
            };
            if claimed.is_empty() {
                // A finished send frees a slot of its endpoint's in-flight
                // cap, so it is worth a new claim as much as a publish is.
                tokio::select! {
                    done = inflight.join_next(), if !inflight.is_empty() => tally(&mut report, done.and_then(|d| d.ok()).unwrap_or(Sent::NotRecorded)),
                    _ = wake.changed() => {}
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            for c in claimed {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                self.spawn_send(&mut inflight, &leases, &recorder, permit, c);
            }
        }
        // Shutdown: no more claims; in-flight sends get the grace period.
        let deadline = tokio::time::sleep(self.config.grace);
        tokio::pin!(deadline);
        while !inflight.is_empty() {
            tokio::select! {
                done = inflight.join_next() => tally(&mut report, done.and_then(|d| d.ok()).unwrap_or(Sent::NotRecorded)),
                _ = &mut deadline => break,
            }
        }
        inflight.abort_all();
        while inflight.join_next().await.is_some() {}
        drop(recorder);
        let _ = batcher.await;
        report.released += self.release_all(&leases).await;
        report
    }

    /// Below this many free slots (a quarter of a full claim) the loop waits
    /// up to [`GATHER`] for more before it claims.
    fn gather_below(&self) -> u32 {
        let full = u32::try_from(self.config.concurrency)
            .unwrap_or(u32::MAX)
            .min(self.config.max_batch);
        (full / 4).max(1)
    }

    /// Sends one claimed delivery in its own task, holding a send slot and
    /// keeping its lease known until it is recorded.
    fn spawn_send(
        &self,
        inflight: &mut JoinSet<Sent>,
        leases: &Arc<Mutex<HashMap<DeliveryId, Lease>>>,
        recorder: &Recorder,
        permit: tokio::sync::OwnedSemaphorePermit,
        c: ClaimedDelivery,
    ) {
        if let Ok(mut l) = leases.lock() {
            l.insert(c.delivery.id, c.lease.clone());
        }
        let (ctx, leases, recorder) = (self.ctx.clone(), leases.clone(), recorder.clone());
        inflight.spawn(async move {
            let id = c.delivery.id;
            let r = deliver(&ctx, &recorder, c).await;
            if let Ok(mut l) = leases.lock() {
                l.remove(&id);
            }
            drop(permit);
            r
        });
    }

    /// Releases the leases of sends that did not finish within the grace
    /// period, so another worker takes them at once; returns how many.
    async fn release_all(&self, leases: &Mutex<HashMap<DeliveryId, Lease>>) -> u64 {
        let left: Vec<Lease> = leases
            .lock()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        let mut released = 0;
        for lease in left {
            if self.store.delivery_release(&lease).await.is_ok() {
                released += 1;
            }
        }
        released
    }
}

/// A stable seed for a delivery's jitter.
fn seed(id: DeliveryId) -> u64 {
    let b = id.0.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// How one send ended, for the dispatcher's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    /// Delivered, and recorded.
    Delivered,
    /// Failed (retry, give up, gone), and recorded.
    Failed,
    /// Not recorded: the lease was lost or the store refused.
    NotRecorded,
}

/// Sends one claimed delivery and records its outcome.
async fn deliver(ctx: &SendContext, recorder: &Recorder, c: ClaimedDelivery) -> Sent {
    let outcome = attempt(ctx, &c).await;
    let delivered = outcome.is_success();
    match recorder.record(c.lease.clone(), outcome).await {
        Ok(_) if delivered => Sent::Delivered,
        Ok(_) => Sent::Failed,
        Err(StoreError::LeaseLost) => Sent::NotRecorded,
        Err(e) => {
            eprintln!(
                "dispatcher: cannot record the outcome of delivery {}: {e}",
                c.delivery.id
            );
            Sent::NotRecorded
        }
    }
}

/// One attempt and its classified outcome. A destination outside the
/// allowed targets, or a delivery that cannot be signed, gives up without
/// a request.
async fn attempt(ctx: &SendContext, c: &ClaimedDelivery) -> DeliveryOutcome {
    let refuse = |error: String| {
        DeliveryOutcome::GiveUp(control_plane_core::AttemptReport {
            status_code: None,
            error: Some(error),
            latency_ms: 0,
        })
    };
    let now = ctx.clock.now();
    let id = c.delivery.id.to_string();
    let timestamp = now.as_millis().div_euclid(1000);
    if let Err(e) = crate::ssrf::check_destination(&c.url, &ctx.allowed).await {
        return refuse(e);
    }
    let signature = match signature_header(
        &c.secrets.signing_at(now),
        &id,
        timestamp,
        c.body.as_bytes(),
    ) {
        Ok(s) => s,
        Err(e) => return refuse(e.to_string()),
    };
    let started = Instant::now();
    let result = send(ctx, c, &id, timestamp, signature).await;
    let took = started.elapsed();
    let account = &c.delivery.account;
    ctx.usage.add(account, UsageMetric::Attempts, 1);
    ctx.usage.add(
        account,
        UsageMetric::BytesSent,
        u64::try_from(c.body.len()).unwrap_or(u64::MAX),
    );
    let outcome = classify(
        &result,
        c.lease.attempt,
        seed(c.delivery.id),
        &ctx.policy,
        ctx.clock.now(),
    );
    ctx.telemetry.record_attempt(outcome.kind(), took);
    outcome
}

/// The signed request itself: status and `Retry-After`, or the error.
async fn send(
    ctx: &SendContext,
    c: &ClaimedDelivery,
    id: &str,
    timestamp: i64,
    signature: String,
) -> SendResult {
    let started = Instant::now();
    let sent = ctx
        .client
        .post(&c.url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(c.body.clone())
        .send()
        .await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match sent {
        Ok(r) => SendResult {
            status: Some(r.status().as_u16()),
            retry_after: r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now())),
            error: None,
            latency_ms,
        },
        Err(e) => SendResult {
            status: None,
            retry_after: None,
            error: Some(describe(&e)),
            latency_ms,
        },
    }
}

type Completion = (
    Lease,
    DeliveryOutcome,
    tokio::sync::oneshot::Sender<control_plane_core::StoreResult<OutcomeRecorded>>,
);

/// The completion batcher: sends report their outcomes here, and one task
/// records whatever has accumulated as one batch
/// (`delivery_record_outcomes`), so under load many outcomes share a
/// transaction, and when idle each is recorded at once.
#[derive(Clone)]
struct Recorder {
    tx: tokio::sync::mpsc::Sender<Completion>,
}

impl Recorder {
    fn start(store: DynControlPlaneStore) -> (Recorder, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Completion>(1024);
        let task = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut items = vec![first];
                while items.len() < 200 {
                    match rx.try_recv() {
                        Ok(item) => items.push(item),
                        Err(_) => break,
                    }
                }
                let (batch, replies): (Vec<_>, Vec<_>) =
                    items.into_iter().map(|(l, o, r)| ((l, o), r)).unzip();
                match store.delivery_record_outcomes(batch.clone()).await {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(result);
                        }
                    }
                    // The batch changed nothing: record the items one by one.
                    Err(_) => {
                        for ((lease, outcome), reply) in batch.into_iter().zip(replies) {
                            let _ =
                                reply.send(store.delivery_record_outcome(&lease, outcome).await);
                        }
                    }
                }
            }
        });
        (Recorder { tx }, task)
    }

    async fn record(
        &self,
        lease: Lease,
        outcome: DeliveryOutcome,
    ) -> control_plane_core::StoreResult<OutcomeRecorded> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send((lease, outcome, reply))
            .await
            .map_err(|_| StoreError::Unavailable("the completion batcher stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the completion batcher stopped".into()))?
    }
}

/// A transport error in words, without the URL (it may carry credentials).
fn describe(e: &reqwest::Error) -> String {
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        let text = inner.to_string();
        if text.contains("CONTROLPLANE_ALLOWED_TARGETS") {
            return text;
        }
        source = inner.source();
    }
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        "request failed".into()
    }
}
