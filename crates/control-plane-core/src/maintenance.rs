//! Maintenance driven by a single-flight tick.

use crate::TickClaimRequest;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::{StoreError, StoreResult};
use crate::store::ControlPlaneStore;

/// The tick maintenance runs under.
pub const MAINTENANCE_TICK: &str = "maintenance";

/// Runs one maintenance pass if no replica ran one in the last `every`:
/// claims the tick, purges in batches of `batch` until a batch finds nothing
/// (at most 1,000 batches), stores the report as the tick's state and frees
/// the tick. `None` when another replica holds it or it is not due.
///
/// # Errors
/// What the store returns; the tick then expires after its lease.
pub async fn run_maintenance(
    store: &dyn ControlPlaneStore,
    retention: Duration,
    batch: PurgeBatch,
    every: Duration,
) -> StoreResult<Option<PurgeReport>> {
    let Some(lease) = store
        .tick_claim(&TickClaimRequest::new(
            MAINTENANCE_TICK,
            Duration::from_secs(300),
            every,
        )?)
        .await?
    else {
        return Ok(None);
    };
    let mut total = PurgeReport::default();
    for _ in 0..1000 {
        let r = store.maintenance_purge(retention, batch).await?;
        total.add(&r);
        if r.total() == 0 {
            break;
        }
    }
    let state = serde_json::to_value(total).unwrap_or_default();
    store.tick_complete(&lease, state).await?;
    Ok(Some(total))
}

/// What one purge statement removes. Each adapter keeps one statement per
/// kind, `DELETE`s at most `$2` rows whose age column is at or before `$1`,
/// and `$1` is [`Purged::cutoff`]: the rule is written once, here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purged {
    /// Delivered deliveries, by their last update.
    Deliveries,
    /// Attempt-log rows, by when they were recorded.
    Attempts,
    /// Attempt rollup rows, by their minute: kept for the retention or
    /// [`crate::ROLLUP_HORIZON`], whichever is shorter.
    AttemptRollups,
    /// Events that no delivery refers to, by creation.
    Events,
    /// Completed workflow tasks, by their last update.
    Tasks,
    /// Alerts, by creation.
    Alerts,
    /// Usage windows, by their start: an hour before the cutoff, so a window
    /// goes only once it ended before the cutoff.
    UsageWindows,
    /// Usage batch ids, by when they were recorded.
    UsageBatches,
    /// Idempotency records, by their expiry: the cutoff is now.
    IdempotencyRecords,
    /// Rotated-out signing secrets, by the end of their grace: the cutoff is
    /// now. The endpoint stays; its `previous_secret` is cleared.
    PreviousSecrets,
    /// Dashboard sessions, by their expiry: the cutoff is now.
    Sessions,
    /// Portal links, by their expiry: the cutoff is now.
    PortalLinks,
}

impl Purged {
    /// `$1` of the purge statement, in milliseconds.
    pub fn cutoff(self, now: Timestamp, retention: Duration) -> i64 {
        let age = now.minus(retention).as_millis();
        match self {
            Purged::IdempotencyRecords
            | Purged::PreviousSecrets
            | Purged::Sessions
            | Purged::PortalLinks => now.as_millis(),
            Purged::UsageWindows => age.saturating_sub(3_600_000),
            Purged::AttemptRollups => now
                .minus(retention.min(crate::ROLLUP_HORIZON))
                .as_millis()
                .saturating_sub(crate::ROLLUP_MINUTE_MS),
            _ => age,
        }
    }
}

/// How many rows one purge removes at most, per table: 1 to 10,000, built
/// checked ([`PurgeBatch::new`]), so an adapter never checks it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurgeBatch(u32);

impl PurgeBatch {
    /// What the service's maintenance loop purges per table and batch.
    pub const DEFAULT: PurgeBatch = PurgeBatch(500);

    /// A batch of `rows` rows per table.
    ///
    /// # Errors
    /// `InvalidInput` outside 1..=10000.
    pub fn new(rows: u32) -> StoreResult<Self> {
        if !(1..=10_000).contains(&rows) {
            return Err(StoreError::InvalidInput(format!(
                "purge batch must be 1 to 10000, got {rows}"
            )));
        }
        Ok(PurgeBatch(rows))
    }

    /// Its rows per table.
    pub fn rows(self) -> u32 {
        self.0
    }
}

/// Rows removed by one maintenance batch, per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PurgeReport {
    /// Delivered deliveries older than the retention.
    pub deliveries: u64,
    /// Attempt-log rows older than the retention.
    pub attempts: u64,
    /// Attempt rollup rows past the rollup's horizon or the retention.
    pub rollups: u64,
    /// Events older than the retention that no delivery refers to.
    pub events: u64,
    /// Completed workflow tasks older than the retention.
    pub tasks: u64,
    /// Alerts older than the retention.
    pub alerts: u64,
    /// Usage windows that ended before the cutoff, and usage batch ids
    /// recorded before it.
    pub usage: u64,
    /// Expired idempotency records.
    pub idempotency_records: u64,
    /// Rotated-out signing secrets cleared after their grace.
    pub previous_secrets: u64,
    /// Expired dashboard sessions.
    pub sessions: u64,
    /// Expired portal links.
    pub portal_links: u64,
}

impl PurgeReport {
    /// Total rows removed.
    pub fn total(&self) -> u64 {
        self.deliveries
            + self.attempts
            + self.rollups
            + self.events
            + self.tasks
            + self.alerts
            + self.usage
            + self.idempotency_records
            + self.previous_secrets
            + self.sessions
            + self.portal_links
    }

    /// Counts `n` rows removed by a statement of kind `what`.
    pub fn count(&mut self, what: Purged, n: u64) {
        let field = match what {
            Purged::Deliveries => &mut self.deliveries,
            Purged::Attempts => &mut self.attempts,
            Purged::AttemptRollups => &mut self.rollups,
            Purged::Events => &mut self.events,
            Purged::Tasks => &mut self.tasks,
            Purged::Alerts => &mut self.alerts,
            Purged::UsageWindows | Purged::UsageBatches => &mut self.usage,
            Purged::IdempotencyRecords => &mut self.idempotency_records,
            Purged::PreviousSecrets => &mut self.previous_secrets,
            Purged::Sessions => &mut self.sessions,
            Purged::PortalLinks => &mut self.portal_links,
        };
        *field += n;
    }

    /// Adds another batch's counts to this one.
    pub fn add(&mut self, other: &PurgeReport) {
        self.deliveries += other.deliveries;
        self.attempts += other.attempts;
        self.rollups += other.rollups;
        self.events += other.events;
        self.tasks += other.tasks;
        self.alerts += other.alerts;
        self.usage += other.usage;
        self.idempotency_records += other.idempotency_records;
        self.previous_secrets += other.previous_secrets;
        self.sessions += other.sessions;
        self.portal_links += other.portal_links;
    }
}
