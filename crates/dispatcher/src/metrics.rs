//! What this process's delivery attempts did, as Prometheus metrics:
//! attempts by result, attempts by account and result (bounded), and the
//! request-time histogram. The binary registers them in the registry the
//! API renders at `/metrics`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use control_plane_core::{AccountId, OTHER_ACCOUNTS};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the request-time histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Accounts that get a label of their own in per-account metrics; attempts
/// of any further account are counted under [`OTHER_ACCOUNTS`]. Endpoints
/// never get a label: their number is unbounded.
pub const ACCOUNT_LABELS: usize = 100;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountResultLabels {
    account: String,
    result: &'static str,
}

/// The delivery metrics of one process.
#[derive(Debug)]
pub struct DeliveryMetrics {
    attempts: Family<ResultLabel, Counter>,
    by_account: Family<AccountResultLabels, Counter>,
    duration: Histogram,
    labelled: Mutex<HashSet<String>>,
}

impl Default for DeliveryMetrics {
    /// Metrics that no registry renders (a dispatcher without `/metrics`).
    fn default() -> Self {
        DeliveryMetrics {
            attempts: Family::default(),
            by_account: Family::default(),
            duration: Histogram::new(LATENCY_BUCKETS),
            labelled: Mutex::default(),
        }
    }
}

impl DeliveryMetrics {
    /// New metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = DeliveryMetrics::default();
        registry.register(
            "controlplane_attempts",
            "Delivery attempts of this process by result",
            m.attempts.clone(),
        );
        registry.register(
            "controlplane_account_attempts",
            "Delivery attempts of this process by account (the first 100 accounts seen; the rest as (other)) and result",
            m.by_account.clone(),
        );
        registry.register(
            "controlplane_delivery_duration_seconds",
            "Time from sending a webhook to its answer",
            m.duration.clone(),
        );
        m
    }

    /// Counts one attempt of `account` with its result (as
    /// `DeliveryOutcome::kind` names it) and how long its request took (none
    /// for an attempt given up without a request: a refused destination).
    pub fn record(&self, account: &AccountId, result: &'static str, took: Option<Duration>) {
        self.attempts.get_or_create(&ResultLabel { result }).inc();
        let account = self.account_label(account);
        self.by_account
            .get_or_create(&AccountResultLabels { account, result })
            .inc();
        if let Some(took) = took {
            self.duration.observe(took.as_secs_f64());
        }
    }

    /// Attempts counted with `result`.
    pub fn attempts(&self, result: &'static str) -> u64 {
        self.attempts.get_or_create(&ResultLabel { result }).get()
    }

    /// The account's own name while fewer than [`ACCOUNT_LABELS`] accounts
    /// have one, [`OTHER_ACCOUNTS`] after.
    fn account_label(&self, account: &AccountId) -> String {
        let name = account.as_str();
        let Ok(mut labelled) = self.labelled.lock() else {
            return OTHER_ACCOUNTS.to_string();
        };
        if labelled.contains(name) {
            return name.to_string();
        }
        if labelled.len() < ACCOUNT_LABELS {
            labelled.insert(name.to_string());
            return name.to_string();
        }
        OTHER_ACCOUNTS.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn render(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn attempts_are_counted_by_result_and_timed() {
        let mut registry = Registry::default();
        let m = DeliveryMetrics::register(&mut registry);
        let a = AccountId::new("acme").unwrap();
        m.record(&a, "delivered", Some(Duration::from_millis(3)));
        m.record(&a, "retry", Some(Duration::from_millis(700)));
        m.record(&a, "retry", Some(Duration::from_secs(40)));
        assert_eq!(m.attempts("retry"), 2);
        let text = render(&registry);
        assert!(
            text.contains("controlplane_attempts_total{result=\"retry\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "controlplane_account_attempts_total{account=\"acme\",result=\"delivered\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("controlplane_delivery_duration_seconds_count 3"),
            "{text}"
        );
        assert!(
            text.contains("controlplane_delivery_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("controlplane_delivery_duration_seconds_bucket{le=\"+Inf\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn accounts_beyond_the_bound_share_one_label() {
        let mut registry = Registry::default();
        let m = DeliveryMetrics::register(&mut registry);
        for i in 0..ACCOUNT_LABELS + 5 {
            let a = AccountId::new(format!("acct-{i}")).unwrap();
            m.record(&a, "delivered", Some(Duration::ZERO));
        }
        m.record(
            &AccountId::new("acct-0").unwrap(),
            "delivered",
            Some(Duration::ZERO),
        );
        let text = render(&registry);
        let series = text
            .lines()
            .filter(|l| l.starts_with("controlplane_account_attempts_total{"))
            .count();
        assert_eq!(series, ACCOUNT_LABELS + 1, "{text}");
        assert!(
            text.contains("account=\"(other)\",result=\"delivered\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("account=\"acct-0\",result=\"delivered\"} 2"),
            "{text}"
        );
    }
}
