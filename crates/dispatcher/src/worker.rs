//! The delivery worker: claims batches for its free slots and a local queue
//! (ADR 0038), sends concurrently with one shared client, records outcomes
//! in batches, and drains on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane_core::{
    custom_header_pairs, ClaimRequest, ClaimedDelivery, DeliveryOutcome, DeliveryState,
    Destination, DynControlPlaneStore, EndpointId, Lease, OutcomeRecorded, StoreError, SystemClock,
    TraceParent, UsageMetric,
};
use control_plane_runtime::UsageMeter;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::classify::{parse_retry_after, SendResult};
use crate::context::SendContext;
use crate::http::Failure;
use crate::metrics::DeliveryMetrics;
use crate::pace::{Answered, Pace, Tracked};
use crate::pump::{Pump, Slot, Work};
use crate::retry::RetryPolicy;
use crate::signing::signature_header;
use crate::turns::in_turns;
use control_plane_runtime::{GroupCommit, Linger};

/// How long the loop may wait for more free send slots before it claims
/// for the few it has (see [`Dispatcher::run`]).
const GATHER: Duration = Duration::from_millis(2);

/// How a dispatcher runs.
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Worker name, recorded on leases.
    pub worker: String,
    /// Send slots. A send running past `slow_answer` gives its slot back
    /// and runs on as parked, up to four times as many (ADR 0019).
    pub concurrency: usize,
    /// Largest claim.
    pub max_batch: u32,
    /// Deliveries claimed beyond the free send slots at most, waiting in a
    /// local queue the slots draw from, while every endpoint answers
    /// quickly (ADR 0038). Claims then stay large when slots are few (one
    /// process of several), and a send's slot goes to the next delivery
    /// while its outcome is recorded. `0` claims for free slots only.
    pub ahead: usize,
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
    pub allowed_targets: Vec<crate::ssrf::Cidr>,
    /// Answers slower than this (and sends running longer) lower the
    /// endpoint's cap (ADR 0019).
    pub slow_answer: Duration,
    /// Bytes of each answer's body kept on its attempt (at most 64 KiB).
    pub response_body_bytes: usize,
    /// While outcomes arrive together, the completion batcher waits up to
    /// this long for [`OUTCOME_FILL`] of them before it records a batch;
    /// a lone outcome is recorded at once. Fewer, larger outcome commits
    /// against endpoint places held that much longer (ADR 0041). Zero never
    /// waits.
    pub outcome_linger: Duration,
    /// The egress proxy HTTP destinations are sent through, if any
    /// (`CONTROLPLANE_HTTP_PROXY`; the address rules still apply to the
    /// destination).
    pub proxy: Option<crate::Proxy>,
    /// Authorities trusted beside the platform's roots, as PEM
    /// certificates: a test's own authority (receivers' and proxies'
    /// certificates are otherwise checked against the platform's roots).
    pub extra_roots_pem: Option<String>,
    /// Runs endpoints' jq programs (ADR 0050); without one, a delivery to
    /// an endpoint that has a program fails its attempt, saying so.
    pub transform: Option<crate::TransformRunner>,
}

/// The batch a lingering completion batcher waits for
/// ([`DispatcherConfig::outcome_linger`]).
pub const OUTCOME_FILL: usize = 64;

/// The default of [`DispatcherConfig::outcome_linger`], and of
/// `CONTROLPLANE_OUTCOME_LINGER`.
pub const OUTCOME_LINGER: Duration = Duration::from_millis(5);

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            worker: "dispatcher".into(),
            concurrency: 64,
            max_batch: 100,
            ahead: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(15),
            grace: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            allowed_targets: Vec::new(),
            slow_answer: Duration::from_secs(1),
            response_body_bytes: 4096,
            outcome_linger: OUTCOME_LINGER,
            proxy: None,
            extra_roots_pem: None,
            transform: None,
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
    /// Leases released unsent: at shutdown, or given back from the local
    /// queue (ADR 0038).
    pub released: u64,
}

/// Sends webhooks for one process. Depends on the port only.
pub struct Dispatcher {
    store: DynControlPlaneStore,
    config: DispatcherConfig,
    ctx: Arc<SendContext>,
}

impl Dispatcher {
    /// A dispatcher over `store`, with one shared HTTP client that follows no
    /// redirects and enforces `request_timeout`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(store: DynControlPlaneStore, config: DispatcherConfig) -> Result<Self, String> {
        if config.slow_answer < Duration::from_millis(10) {
            return Err(format!(
                "slow_answer must be at least 10ms, got {:?}",
                config.slow_answer
            ));
        }
        let client = crate::http::HttpClient::trusting(
            config.request_timeout,
            config.request_timeout.min(Duration::from_secs(10)),
            config.allowed_targets.clone(),
            crate::http::roots_of(config.extra_roots_pem.as_deref())?,
        )
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?
        .keeping_bodies(config.response_body_bytes)
        .through(config.proxy.clone());
        let ctx = Arc::new(SendContext {
            client,
            clock: Arc::new(SystemClock),
            policy: config.retry.clone(),
            metrics: Arc::default(),
            usage: Arc::default(),
            tokens: crate::oauth2::Tokens::default(),
            brokers: crate::broker::Brokers::new(
                config.allowed_targets.clone(),
                config.request_timeout,
            ),
            transform: config.transform.clone(),
            request_timeout: config.request_timeout,
        });
        Ok(Dispatcher { store, config, ctx })
    }

    /// Records attempts into `metrics` (for `/metrics`) and per-account
    /// usage (attempts, bytes sent) into `usage`.
    pub fn with_meters(mut self, metrics: Arc<DeliveryMetrics>, usage: Arc<UsageMeter>) -> Self {
        if let Some(ctx) = Arc::get_mut(&mut self.ctx) {
            ctx.metrics = metrics;
            ctx.usage = usage;
        }
        self
    }

    /// Runs until `stop` is cancelled, then stops claiming, lets in-flight
    /// sends finish within the grace period and releases the leases of the
    /// rest, so another worker takes them at once.
    pub async fn run(&self, stop: CancellationToken) -> DispatchReport {
        let (recorder, batcher) = Recorder::start(self.store.clone(), self.config.outcome_linger);
        let sends = Sends {
            store: self.store.clone(),
            ctx: self.ctx.clone(),
            recorder,
            worker: self.config.worker.clone(),
            lease: self.config.lease,
            pace: Arc::new(Pace::new(self.config.concurrency, self.config.slow_answer)),
        };
        // Idle connections close after their idle time even when nothing
        // is sent.
        let reaper = {
            let (ctx, stop) = (self.ctx.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(crate::http::REAP_EVERY) => ctx.client.reap_idle(),
                        () = stop.cancelled() => return,
                    }
                }
            })
        };
        let mut report = DispatchReport::default();
        self.pump()
            .run(&sends, stop, |sent| match sent {
                Sent::Delivered => report.delivered += 1,
                Sent::Failed => report.failed += 1,
                Sent::Released => report.released += 1,
                Sent::NotRecorded => {}
            })
            .await;
        drop(sends);
        let _ = batcher.await;
        let _ = reaper.await;
        report
    }

    /// The loop's settings: with fewer free places than half a full claim
    /// (a quarter of the slots when not claiming ahead) and sends
    /// finishing, it waits for more: while deliveries are queued, until
    /// they free up; otherwise up to [`GATHER`]. Half rather than a quarter:
    /// measured, four processes of 16 slots cost 0.080 commits per delivery
    /// with a quarter (one run) and 0.067 to 0.071 with half (three runs),
    /// and drained faster (ADR 0038). A queued delivery is given back once it could no longer be
    /// sent within its lease.
    fn pump(&self) -> Pump {
        let c = &self.config;
        let full = u32::try_from(c.concurrency.saturating_add(c.ahead))
            .unwrap_or(u32::MAX)
            .min(c.max_batch);
        Pump {
            concurrency: c.concurrency,
            ahead: c.ahead,
            stale_after: Some(c.lease.saturating_sub(c.request_timeout)),
            max_batch: c.max_batch,
            poll_interval: c.poll_interval,
            grace: c.grace,
            gather_below: (full / 2).max(1),
            gather: GATHER,
            park_after: Some(c.slow_answer),
        }
    }
}

/// The dispatcher's work for the loop: claim deliveries, send each.
struct Sends {
    store: DynControlPlaneStore,
    ctx: Arc<SendContext>,
    recorder: Recorder,
    worker: String,
    lease: Duration,
    pace: Arc<Pace>,
}

impl Work for Sends {
    type Item = ClaimedDelivery;
    type Ended = Sent;

    fn claim(&self, limit: u32) -> impl Future<Output = Vec<ClaimedDelivery>> + Send {
        let req = ClaimRequest::new(self.worker.clone(), limit, self.lease)
            .and_then(|r| r.throttled(self.pace.throttle(Instant::now())));
        async move {
            let claimed = match req {
                Ok(req) => self.store.delivery_claim(req).await,
                Err(e) => Err(e),
            };
            let claimed = claimed.unwrap_or_else(|e| {
                tracing::warn!("claim failed: {e}");
                Vec::new()
            });
            let now = Instant::now();
            for c in &claimed {
                self.pace
                    .claimed(c.delivery.endpoint_id, c.delivery.id, now);
            }
            in_turns(claimed, |c| c.delivery.endpoint_id)
        }
    }

    fn run(
        &self,
        c: ClaimedDelivery,
        halt: CancellationToken,
        slot: Slot,
    ) -> impl Future<Output = Sent> + Send + 'static {
        let (store, ctx, recorder) = (self.store.clone(), self.ctx.clone(), self.recorder.clone());
        let pace = self.pace.clone();
        async move {
            let lease = c.lease.clone();
            pace.started(c.delivery.endpoint_id, c.delivery.id, Instant::now());
            // Halted, the send is dropped with its tracking: nothing learned.
            let tracked = Tracked::new(pace, c.delivery.endpoint_id, c.delivery.id);
            tokio::select! {
                sent = deliver(&ctx, &recorder, c, tracked, slot) => sent,
                () = halt.cancelled() => release(&store, &lease).await,
            }
        }
    }

    fn give_back(&self, c: ClaimedDelivery) -> impl Future<Output = Sent> + Send + 'static {
        let store = self.store.clone();
        // Never sent: nothing learned, and no longer in flight.
        let tracked = Tracked::new(self.pace.clone(), c.delivery.endpoint_id, c.delivery.id);
        async move {
            drop(tracked);
            release(&store, &c.lease).await
        }
    }

    fn lost(&self) -> Sent {
        Sent::NotRecorded
    }

    fn wakeups(&self) -> Option<Box<dyn control_plane_core::Wakeups>> {
        Some(self.store.delivery_wakeups())
    }

    fn may_run_ahead(&self) -> bool {
        self.pace.calm(Instant::now())
    }
}

/// Releases `lease` unsent: halted at shutdown, or given back from the
/// local queue.
async fn release(store: &DynControlPlaneStore, lease: &Lease) -> Sent {
    match store.delivery_release(lease).await {
        Ok(()) => Sent::Released,
        Err(_) => Sent::NotRecorded,
    }
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
    /// Halted at shutdown and its lease released.
    Released,
}

/// Sends one claimed delivery and records its outcome, logging in a span
/// that names the account, endpoint, delivery and attempt (never the URL,
/// whose query may hold a credential, nor the secret). Pacing learns from
/// the attempt itself, before it is recorded: the store's time is not the
/// receiver's, and a lost lease does not make an answer unseen.
async fn deliver(
    ctx: &SendContext,
    recorder: &Recorder,
    c: ClaimedDelivery,
    tracked: Tracked,
    mut slot: Slot,
) -> Sent {
    // A `debug` span: at the default `info` level it is never built, which
    // matters at thousands of sends a second; the dead-letter line names the
    // delivery itself.
    //
    // With spans exported (README: Tracing) it is the attempt's span, a
    // child of the publish that created the event, and the request carries
    // its context; without, the request carries the publish's context.
    let span = tracing::debug_span!(
        "delivery",
        otel.kind = "client",
        account = %c.delivery.account,
        endpoint_id = %c.delivery.endpoint_id,
        delivery_id = %c.delivery.id,
        attempt = c.lease.attempt,
        result = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = &c.traceparent {
        control_plane_runtime::trace::join(parent, &span);
    }
    let traceparent = control_plane_runtime::trace::of(&span).or_else(|| c.traceparent.clone());
    async move {
        tracing::debug!("sending");
        let outcome = attempt(ctx, &c, traceparent.as_ref()).await;
        let (result, report) = (outcome.kind(), outcome.report().clone());
        let current = tracing::Span::current();
        current.record("result", result);
        if let Some(status) = report.status_code {
            current.record("http.response.status_code", status);
        }
        let delivered = outcome.is_success();
        tracked.finish(
            if delivered {
                Answered::Success
            } else {
                Answered::Failure
            },
            Duration::from_millis(report.latency_ms),
        );
        // Recording needs no send slot: the next delivery takes it.
        slot.free();
        record(recorder, &c, outcome).await
    }
    .instrument(span)
    .await
}

/// Records `outcome` of `c` and logs it: a dead letter at `warn`, other
/// attempts at `debug`.
async fn record(recorder: &Recorder, c: &ClaimedDelivery, outcome: DeliveryOutcome) -> Sent {
    let (result, report) = (outcome.kind(), outcome.report().clone());
    let delivered = outcome.is_success();
    match recorder.record(c.lease.clone(), outcome).await {
        Ok(r) => {
            let state = r.state.as_str();
            let (status, latency_ms) = (report.status_code, report.latency_ms);
            if r.state == DeliveryState::Dead {
                tracing::warn!(
                    account = %c.delivery.account,
                    endpoint_id = %c.delivery.endpoint_id,
                    delivery_id = %c.delivery.id,
                    attempt = c.lease.attempt,
                    result,
                    status,
                    latency_ms,
                    error = report.error,
                    "delivery is dead"
                );
            } else {
                tracing::debug!(
                    result,
                    state,
                    status,
                    latency_ms,
                    error = report.error,
                    "attempt recorded"
                );
            }
            if delivered {
                Sent::Delivered
            } else {
                Sent::Failed
            }
        }
        Err(StoreError::LeaseLost) => {
            tracing::debug!("the lease was lost; another worker owns the delivery");
            Sent::NotRecorded
        }
        Err(e) => {
            tracing::warn!("cannot record the outcome: {e}");
            Sent::NotRecorded
        }
    }
}

/// One attempt and its classified outcome. A delivery that cannot be
/// signed, or whose destination is refused (its URL, or every address it is
/// or resolves to, outside the allowed targets), gives up without a request.
async fn attempt(
    ctx: &SendContext,
    c: &ClaimedDelivery,
    traceparent: Option<&TraceParent>,
) -> DeliveryOutcome {
    let refuse = |error: String| {
        let outcome = DeliveryOutcome::GiveUp(control_plane_core::AttemptReport {
            status_code: None,
            error: Some(error),
            latency_ms: 0,
            response_body: None,
        });
        ctx.metrics
            .record(&c.delivery.account, outcome.kind(), None);
        outcome
    };
    // The endpoint's program first: the body it gives is what is signed.
    let transformed;
    let c = match crate::outcome::transform(ctx, c).await {
        Ok(None) => c,
        Ok(Some(body)) => {
            transformed = ClaimedDelivery { body, ..c.clone() };
            &transformed
        }
        Err(outcome) => return outcome,
    };
    let now = ctx.clock.now();
    let id = c.delivery.id.to_string();
    let timestamp = now.as_millis().div_euclid(1000);
    let signature = match signature_header(
        &c.secrets.signing_at(now),
        &id,
        timestamp,
        c.body.as_bytes(),
    ) {
        Ok(s) => s,
        Err(e) => return refuse(e.to_string()),
    };
    let account = &c.delivery.account;
    let (result, took) = match send(ctx, c, &id, timestamp, signature, traceparent).await {
        Ok(result) => {
            ctx.usage.add(account, UsageMetric::Attempts, 1);
            ctx.usage.add(
                account,
                UsageMetric::BytesSent,
                u64::try_from(c.body.len()).unwrap_or(u64::MAX),
            );
            let took = Duration::from_millis(result.latency_ms);
            (result, Some(took))
        }
        // No token (or no usable client certificate), no request: a failed
        // attempt, retried on the schedule, that sent nothing (not counted
        // as sent, and no latency).
        Err(Unsent::Failed(failed)) => (failed, None),
        Err(Unsent::Refused(refused)) => return refuse(refused),
    };
    crate::outcome::settle(ctx, c, result, took)
}

/// Why a request was not made.
enum Unsent {
    /// Its destination (or its OAuth2 token URL) is refused.
    Refused(String),
    /// Its OAuth2 token could not be had, or its client certificate cannot
    /// be used: the attempt failed, as this says.
    Failed(SendResult),
}

impl From<String> for Unsent {
    fn from(why: String) -> Self {
        Unsent::Refused(why)
    }
}

/// An OAuth2 endpoint's token, fetched first: without one there is no
/// request. Getting it takes at most half the request timeout, so the token
/// and the send together stay inside the lease (twice the request timeout).
async fn oauth2_token(ctx: &SendContext, c: &ClaimedDelivery) -> Result<Option<String>, Unsent> {
    let Some(settings) = &c.oauth2 else {
        return Ok(None);
    };
    let within = ctx.client.timeout() / 2;
    match ctx
        .tokens
        .bearer(&ctx.client, c.delivery.endpoint_id, settings, within)
        .await
    {
        Ok(t) => Ok(Some(t)),
        Err(Failure::Refused(why)) => Err(Unsent::Refused(why)),
        Err(Failure::Failed(error)) => Err(unsent_failed(error)),
    }
}

/// An attempt that failed before its request was made, as `error` says.
fn unsent_failed(error: String) -> Unsent {
    Unsent::Failed(crate::outcome::unsent_result(error))
}

/// The endpoint's custom headers, opened.
fn custom_of(c: &ClaimedDelivery) -> Result<Vec<(String, String)>, Unsent> {
    Ok(match &c.headers {
        Some(h) => custom_header_pairs(h).map_err(|e| e.to_string())?,
        None => Vec::new(),
    })
}

/// The headers of a delivery's request or message: the endpoint's own
/// (`custom`) first; they cannot replace these four
/// (`control_plane_core::RESERVED_HEADERS`); an event's trace context
/// replaces a custom `traceparent`, and an OAuth2 token a custom
/// `authorization`.
fn headers_of<'a>(
    custom: &'a [(String, String)],
    id: &str,
    timestamp: i64,
    signature: String,
    traceparent: Option<&TraceParent>,
    token: Option<&str>,
) -> Vec<(&'a str, String)> {
    let mut headers: Vec<(&str, String)> = custom
        .iter()
        .filter(|(n, _)| traceparent.is_none() || n != "traceparent")
        .filter(|(n, _)| token.is_none() || n != "authorization")
        .map(|(n, v)| (n.as_str(), v.clone()))
        .collect();
    if let Some(t) = token {
        headers.push(("authorization", format!("Bearer {t}")));
    }
    headers.extend([
        ("content-type", "application/json".to_string()),
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]);
    if let Some(t) = traceparent {
        headers.push(("traceparent", t.as_str().to_string()));
    }
    headers
}

/// The message of a delivery to a broker destination, signed as `signed`
/// (id, timestamp, signature, trace context): the broker's ack, or the
/// error.
async fn send_to_broker(
    ctx: &SendContext,
    c: &ClaimedDelivery,
    dest: &Destination,
    signed: (&str, i64, String, Option<&TraceParent>),
) -> Result<SendResult, Unsent> {
    let (id, timestamp, signature, traceparent) = signed;
    // A broker's `authorization` header authenticates the connection and
    // is not sent with the message.
    let (auth, custom): (Vec<_>, Vec<_>) = custom_of(c)?
        .into_iter()
        .partition(|(n, _)| n == "authorization");
    let creds = auth
        .first()
        .map(|(_, v)| crate::broker::Credentials::from_authorization(v))
        .transpose()
        .map_err(|f| match f {
            Failure::Refused(why) | Failure::Failed(why) => Unsent::Refused(why),
        })?;
    let headers = headers_of(&custom, id, timestamp, signature, traceparent, None);
    let msg = crate::broker::Message {
        id,
        headers: &headers,
        body: c.body.as_bytes(),
    };
    publish(ctx, dest, creds.as_ref(), c.delivery.endpoint_id, &msg).await
}

/// The signed request itself, or the message to a broker: status and
/// `Retry-After` (or the broker's ack), or the error; or, as `Err`, why it
/// was not made.
async fn send(
    ctx: &SendContext,
    c: &ClaimedDelivery,
    id: &str,
    timestamp: i64,
    signature: String,
    traceparent: Option<&TraceParent>,
) -> Result<SendResult, Unsent> {
    let dest = Destination::parse(&c.url).map_err(|e| Unsent::Refused(e.to_string()))?;
    if !matches!(dest, Destination::Http { .. }) {
        let signed = (id, timestamp, signature, traceparent);
        return send_to_broker(ctx, c, &dest, signed).await;
    }
    // The endpoint's client certificate, if any (ADR 0048).
    let identity = ctx
        .client
        .identity(c.delivery.endpoint_id, c.client_tls.as_ref())
        .map_err(unsent_failed)?;
    let token = oauth2_token(ctx, c).await?;
    let custom = custom_of(c)?;
    let headers = headers_of(
        &custom,
        id,
        timestamp,
        signature,
        traceparent,
        token.as_deref(),
    );
    // The receiver's latency: from the request, not from the token fetch.
    let started = Instant::now();
    let sent = ctx
        .client
        .post(&c.url, identity.as_ref(), &headers, c.body.as_bytes())
        .await;
    if let (Some(t), Ok(answer)) = (&token, &sent) {
        if answer.status == 401 {
            // The receiver refused the token: the next attempt fetches another.
            ctx.tokens.forget(c.delivery.endpoint_id, t).await;
        }
    }
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(match sent {
        Ok(answer) => SendResult {
            status: Some(answer.status),
            retry_after: answer
                .retry_after
                .and_then(|v| parse_retry_after(&v, std::time::SystemTime::now())),
            error: None,
            latency_ms,
            response_body: (!answer.body.is_empty())
                .then(|| String::from_utf8_lossy(&answer.body).into_owned()),
            acked: false,
        },
        Err(Failure::Failed(error)) => SendResult {
            status: None,
            retry_after: None,
            error: Some(error),
            latency_ms,
            response_body: None,
            acked: false,
        },
        Err(Failure::Refused(why)) => return Err(Unsent::Refused(why)),
    })
}

/// Publishes to a broker: an ack delivers; a failure is a failed attempt
/// with the broker's error; a refused destination sends nothing.
async fn publish(
    ctx: &SendContext,
    dest: &Destination,
    creds: Option<&crate::broker::Credentials>,
    endpoint: EndpointId,
    msg: &crate::broker::Message<'_>,
) -> Result<SendResult, Unsent> {
    let started = Instant::now();
    let sent = ctx.brokers.publish(dest, creds, endpoint, msg).await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let (acked, error) = match sent {
        Ok(()) => (true, None),
        Err(Failure::Failed(e)) => (false, Some(e)),
        Err(Failure::Refused(why)) => return Err(Unsent::Refused(why)),
    };
    Ok(SendResult {
        status: None,
        retry_after: None,
        error,
        latency_ms,
        response_body: None,
        acked,
    })
}

/// The completion batcher: sends report their outcomes here, and one writer
/// records whatever has accumulated as one batch (`delivery_record_outcomes`,
/// through `control_plane_runtime::GroupCommit`), so under load many
/// outcomes share a transaction (waiting up to `outcome_linger` for
/// [`OUTCOME_FILL`] of them), and when idle each is recorded at once.
#[derive(Clone)]
struct Recorder {
    group: GroupCommit<(Lease, DeliveryOutcome), OutcomeRecorded>,
}

impl Recorder {
    fn start(
        store: DynControlPlaneStore,
        linger: Duration,
    ) -> (Recorder, tokio::task::JoinHandle<()>) {
        let linger = Linger {
            wait: linger,
            fill: OUTCOME_FILL,
        };
        let (group, mut tasks) = GroupCommit::start(
            "completion batcher",
            1,
            (1024, 200),
            linger,
            move |batch: Vec<(Lease, DeliveryOutcome)>| {
                let store = store.clone();
                async move {
                    match store.delivery_record_outcomes(batch.clone()).await {
                        Ok(results) => results,
                        // The batch changed nothing: record the items one by one.
                        Err(_) => {
                            let mut out = Vec::with_capacity(batch.len());
                            for (lease, outcome) in batch {
                                out.push(store.delivery_record_outcome(&lease, outcome).await);
                            }
                            out
                        }
                    }
                }
            },
        );
        let task = tasks.pop().unwrap_or_else(|| tokio::spawn(async {}));
        (Recorder { group }, task)
    }

    async fn record(
        &self,
        lease: Lease,
        outcome: DeliveryOutcome,
    ) -> control_plane_core::StoreResult<OutcomeRecorded> {
        self.group.submit((lease, outcome)).await
    }
}
