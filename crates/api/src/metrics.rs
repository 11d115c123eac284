//! `/metrics`: the process's registry (the dispatcher's attempt metrics
//! among it) and the store's gauges, read at each scrape, in the
//! OpenMetrics text format.

use std::collections::BTreeMap;

use control_plane_core::{
    AccountId, DeliveryState, DynControlPlaneStore, StoreResult, OTHER_ACCOUNTS,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Accounts shown one by one in `controlplane_account_deliveries`: the ones
/// with the most deliveries not yet delivered; the rest are summed under
/// [`OTHER_ACCOUNTS`].
pub const TOP_ACCOUNTS: usize = 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountStateLabels {
    account: String,
    state: &'static str,
}

/// The registry `/metrics` renders, with the store gauges it refreshes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    deliveries: Family<StateLabel, Gauge>,
    account_deliveries: Family<AccountStateLabels, Gauge>,
    open_circuits: Gauge,
    disabled_endpoints: Gauge,
    scrape: tokio::sync::Mutex<()>,
}

impl Default for Metrics {
    /// The store gauges alone.
    fn default() -> Self {
        Metrics::new(Registry::default())
    }
}

impl Metrics {
    /// Renders `registry` (what other components registered) and the store
    /// gauges, which it registers in it.
    pub fn new(mut registry: Registry) -> Self {
        let m = Metrics {
            registry: Registry::default(),
            deliveries: Family::default(),
            account_deliveries: Family::default(),
            open_circuits: Gauge::default(),
            disabled_endpoints: Gauge::default(),
            scrape: tokio::sync::Mutex::new(()),
        };
        registry.register(
            "controlplane_deliveries",
            "Deliveries by state, across accounts (queue depth)",
            m.deliveries.clone(),
        );
        registry.register(
            "controlplane_account_deliveries",
            "Deliveries by account and state: the 20 accounts with the most undelivered, the rest as (other)",
            m.account_deliveries.clone(),
        );
        registry.register(
            "controlplane_open_circuits",
            "Endpoints whose circuit is open or half-open",
            m.open_circuits.clone(),
        );
        registry.register(
            "controlplane_disabled_endpoints",
            "Endpoints that are disabled",
            m.disabled_endpoints.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Reads the store's gauges, then renders everything.
    ///
    /// # Errors
    /// The store's error.
    pub async fn render(&self, store: &DynControlPlaneStore) -> StoreResult<String> {
        let groups = store.delivery_count_by_account_and_state().await?;
        let open = store.circuit_count_open().await?;
        let disabled = store.endpoint_count_disabled().await?;
        let _one_at_a_time = self.scrape.lock().await;
        self.deliveries.clear();
        for (state, n) in by_state(&groups) {
            self.deliveries
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(gauge(n));
        }
        self.account_deliveries.clear();
        for ((account, state), n) in busiest_accounts(&groups, TOP_ACCOUNTS) {
            let labels = AccountStateLabels {
                account,
                state: state.as_str(),
            };
            self.account_deliveries.get_or_create(&labels).set(gauge(n));
        }
        self.open_circuits.set(gauge(open));
        self.disabled_endpoints.set(gauge(disabled));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| control_plane_core::StoreError::Backend(format!("metrics: {e}")))?;
        Ok(out)
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Counts summed over accounts.
fn by_state(groups: &[(AccountId, DeliveryState, u64)]) -> BTreeMap<DeliveryState, u64> {
    let mut out = BTreeMap::new();
    for (_, state, n) in groups {
        *out.entry(*state).or_default() += n;
    }
    out
}

/// Counts by account and state for the `top` accounts with the most
/// deliveries not yet delivered (ties by name); every other account's counts
/// summed under [`OTHER_ACCOUNTS`]. At most `top + 1` accounts, whatever
/// the number of accounts in the store.
fn busiest_accounts(
    groups: &[(AccountId, DeliveryState, u64)],
    top: usize,
) -> BTreeMap<(String, DeliveryState), u64> {
    let mut undelivered: BTreeMap<&str, u64> = BTreeMap::new();
    for (account, state, n) in groups {
        let e = undelivered.entry(account.as_str()).or_default();
        if *state != DeliveryState::Delivered {
            *e += n;
        }
    }
    let mut ranked: Vec<(&str, u64)> = undelivered.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: std::collections::BTreeSet<&str> =
        ranked.iter().take(top).map(|(a, _)| *a).collect();
    let mut out = BTreeMap::new();
    for (account, state, n) in groups {
        let label = if shown.contains(account.as_str()) {
            account.as_str()
        } else {
            OTHER_ACCOUNTS
        };
        *out.entry((label.to_string(), *state)).or_default() += n;
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn g(a: &str, s: DeliveryState, n: u64) -> (AccountId, DeliveryState, u64) {
        (AccountId::new(a).unwrap(), s, n)
    }

    #[test]
    fn the_busiest_accounts_are_shown_and_the_rest_summed() {
        use DeliveryState::*;
        let groups = vec![
            g("a", Delivered, 1000),
            g("a", Pending, 1),
            g("b", Pending, 5),
            g("b", Dead, 2),
            g("c", Pending, 3),
            g("d", Leased, 3),
        ];
        let shown = busiest_accounts(&groups, 2);
        let key = |a: &str, s| (a.to_string(), s);
        assert_eq!(shown[&key("b", Pending)], 5);
        assert_eq!(shown[&key("b", Dead)], 2);
        assert_eq!(
            shown[&key("c", Pending)],
            3,
            "c ties d and comes first by name"
        );
        assert_eq!(
            shown[&key("(other)", Pending)],
            1,
            "a: many delivered, one undelivered"
        );
        assert_eq!(shown[&key("(other)", Delivered)], 1000);
        assert_eq!(shown[&key("(other)", Leased)], 3);
        assert_eq!(shown.len(), 6);
        let accounts: std::collections::BTreeSet<&str> =
            shown.keys().map(|(a, _)| a.as_str()).collect();
        assert_eq!(accounts.len(), 3, "top 2 plus (other)");
        assert_eq!(by_state(&groups)[&Pending], 9);
    }
}
