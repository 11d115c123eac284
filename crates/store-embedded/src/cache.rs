//! What the writer remembers between transactions besides the live index
//! ([`crate::live`]): each cache is filled and emptied on the writer thread
//! alone, forgotten where the rows it copies change, and emptied when a
//! transaction that changed it fails (it may have read a change that did
//! not commit).

use std::collections::HashMap;
use std::sync::Arc;

use control_plane_core::Circuit;
use control_plane_core::{
    AccountId, DeliveryId, Endpoint, EndpointId, EndpointRetry, EventId, RateBudget, Timestamp,
};

/// The sequence numbers of deliveries this writer leased, by id. A
/// delivery's `seq` never changes, so an entry is never wrong; it spares the
/// outcome path a lookup by id. Bounded: emptied when full.
#[derive(Default)]
pub(crate) struct SeqCache(HashMap<DeliveryId, i64>);

impl SeqCache {
    const MAX: usize = 1_000_000;

    /// Remembers the seq of `id`.
    pub fn insert(&mut self, id: DeliveryId, seq: i64) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(id, seq);
    }

    /// The seq of `id`, forgotten.
    pub fn take(&mut self, id: DeliveryId) -> Option<i64> {
        self.0.remove(&id)
    }
}

/// A bounded map the writer keeps between transactions, counting its
/// changes so that a failed transaction empties only the caches it changed
/// (one that was only read still matches the committed tables). Emptied
/// when full.
struct Kept<K, V> {
    map: HashMap<K, V>,
    changes: u64,
}

impl<K: std::hash::Hash + Eq, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept {
            map: HashMap::new(),
            changes: 0,
        }
    }
}

impl<K: std::hash::Hash + Eq, V> Kept<K, V> {
    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    fn insert(&mut self, k: K, v: V, max: usize) {
        if self.map.len() >= max {
            self.map.clear();
        }
        self.map.insert(k, v);
        self.changes += 1;
    }

    fn forget(&mut self, k: &K) {
        self.map.remove(k);
        self.changes += 1;
    }

    fn clear(&mut self) {
        self.map.clear();
        self.changes += 1;
    }
}

/// The schema of each (account, event type) a publish has looked up: `None`
/// for a type that is not registered or has no schema. The embedded store
/// is one process with one writer, so a put or a delete (which forgets its
/// entry) is the only way an entry changes. It spares each publish a
/// statement (ADR 0025).
#[derive(Default)]
pub(crate) struct SchemaCache(Kept<(AccountId, String), Option<String>>);

impl SchemaCache {
    const MAX: usize = 100_000;

    /// The entry of `account`'s `name`: `None` when not looked up yet.
    pub fn get(&self, account: &AccountId, name: &str) -> Option<&Option<String>> {
        self.0.get(&(account.clone(), name.to_string()))
    }

    /// Remembers what the store holds for `account`'s `name`.
    pub fn insert(&mut self, account: &AccountId, name: &str, schema: Option<String>) {
        self.0
            .insert((account.clone(), name.to_string()), schema, Self::MAX);
    }

    /// Forgets `account`'s `name` (it was put or deleted).
    pub fn forget(&mut self, account: &AccountId, name: &str) {
        self.0.forget(&(account.clone(), name.to_string()));
    }
}

/// The live endpoints of each account as fan-out reads them (ids,
/// subscriptions and filters; secrets left sealed): a publish asks for them
/// in every transaction, and they change only when an endpoint of the
/// account is created, updated or removed, which forgets the account's
/// entry. Other columns copied here (enabled, circuit) may be stale: fan-out
/// does not read them.
#[derive(Default)]
pub(crate) struct FanOutCache(Kept<AccountId, Arc<[Endpoint]>>);

impl FanOutCache {
    const MAX: usize = 10_000;

    /// The endpoints of `account`, when looked up since they last changed.
    pub fn get(&self, account: &AccountId) -> Option<Arc<[Endpoint]>> {
        self.0.get(account).cloned()
    }

    /// Remembers the endpoints of `account`.
    pub fn insert(&mut self, account: &AccountId, endpoints: Arc<[Endpoint]>) {
        self.0.insert(account.clone(), endpoints, Self::MAX);
    }

    /// Forgets the endpoints of `account` (one of them changed).
    pub fn forget(&mut self, account: &AccountId) {
        self.0.forget(account);
    }
}

/// The circuit of each endpoint a transition has read: only
/// `endpoint::save_circuit` writes circuits, and it updates its entry, so
/// an entry is what the table holds. It spares every outcome batch a
/// statement per endpoint.
#[derive(Default)]
pub(crate) struct CircuitCache(Kept<EndpointId, Circuit>);

impl CircuitCache {
    const MAX: usize = 100_000;

    /// The circuit of `endpoint`, when read or written since the cache was
    /// last emptied.
    pub fn get(&self, endpoint: EndpointId) -> Option<&Circuit> {
        self.0.get(&endpoint)
    }

    /// Remembers the circuit of `endpoint`.
    pub fn insert(&mut self, endpoint: EndpointId, circuit: Circuit) {
        self.0.insert(endpoint, circuit, Self::MAX);
    }
}

/// What a claim reads of an endpoint: its flow settings and what a send
/// needs, with the credentials as stored (sealed).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sender {
    pub account: String,
    /// Enabled, not removed, and not a poll endpoint: claims send to it.
    pub live: bool,
    pub cap: Option<u32>,
    pub rate: Option<u32>,
    /// The stored rate budget.
    pub budget: Option<RateBudget>,
    pub ordered: bool,
    pub url: String,
    pub secrets: (String, Option<String>, Option<Timestamp>),
    pub headers: Option<String>,
    pub oauth2: Option<String>,
    pub retry: Option<EndpointRetry>,
    pub client_tls: Option<String>,
    pub transform: Option<control_plane_core::Transform>,
}

/// What a claim reads of each endpoint it serves ([`Sender`]): every write
/// of an endpoint row forgets its entry ([`crate::endpoint`]), except the
/// circuit (kept in [`CircuitCache`], not here) and the rate budget, which
/// the claim that spends it updates here. It spares each claim the read of
/// its endpoints' flow settings and, with [`EventCache`], the read-back of
/// what it leased (ADR 0028).
#[derive(Default)]
pub(crate) struct SenderCache(Kept<EndpointId, Sender>);

impl SenderCache {
    const MAX: usize = 100_000;

    /// The entry of `endpoint`, when read since it last changed.
    pub fn get(&self, endpoint: EndpointId) -> Option<&Sender> {
        self.0.get(&endpoint)
    }

    /// Remembers what the table holds for `endpoint`.
    pub fn insert(&mut self, endpoint: EndpointId, sender: Sender) {
        self.0.insert(endpoint, sender, Self::MAX);
    }

    /// Forgets `endpoint` (its row changed).
    pub fn forget(&mut self, endpoint: EndpointId) {
        self.0.forget(&endpoint);
    }

    /// Forgets every endpoint (a statement changed rows of several).
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The rate budget of `endpoint` is now `budget`.
    pub fn set_budget(&mut self, endpoint: EndpointId, budget: RateBudget) {
        if let Some(s) = self.0.map.get_mut(&endpoint) {
            s.budget = Some(budget);
            self.0.changes += 1;
        }
    }
}

/// What a send needs of an event: its type, body and trace context.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SentEvent {
    pub event_type: String,
    pub body: String,
    pub traceparent: Option<String>,
}

/// The events this writer published or claimed lately, as a send needs
/// them, so that a claim reads no event row. Events never change and their
/// ids are never reused, so an entry is never wrong: one left by a
/// transaction that rolled back names an event no delivery points at, and
/// is never asked for. Bounded by the bytes it holds: emptied when full.
#[derive(Default)]
pub(crate) struct EventCache {
    map: HashMap<EventId, Arc<SentEvent>>,
    bytes: usize,
}

impl EventCache {
    /// Bytes of event text kept at most.
    const MAX_BYTES: usize = 32 << 20;
    /// What an entry costs besides its text.
    const ENTRY_BYTES: usize = 96;

    /// The event `id`, when kept.
    pub fn get(&self, id: EventId) -> Option<Arc<SentEvent>> {
        self.map.get(&id).cloned()
    }

    /// Keeps event `id`; one too big for the whole budget is not kept.
    pub fn insert(&mut self, id: EventId, event: SentEvent) {
        let size = Self::ENTRY_BYTES
            + event.event_type.len()
            + event.body.len()
            + event.traceparent.as_ref().map_or(0, String::len);
        if size > Self::MAX_BYTES / 4 {
            return;
        }
        if self.bytes + size > Self::MAX_BYTES {
            self.map.clear();
            self.bytes = 0;
        }
        if self.map.insert(id, Arc::new(event)).is_none() {
            self.bytes += size;
        }
    }
}

/// The change counts of the writer's caches, taken when a transaction
/// begins: after it fails, a cache whose count moved is emptied.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marks([u64; 4]);

/// The caches a transaction may fill or change (the event cache needs no
/// mark: see [`EventCache`]).
#[derive(Default)]
pub(crate) struct Caches {
    pub schemas: SchemaCache,
    pub fan_out: FanOutCache,
    pub circuits: CircuitCache,
    pub senders: SenderCache,
}

impl Caches {
    /// Their change counts now.
    pub fn marks(&self) -> Marks {
        Marks([
            self.schemas.0.changes,
            self.fan_out.0.changes,
            self.circuits.0.changes,
            self.senders.0.changes,
        ])
    }

    /// Empties each cache that changed since `before`.
    pub fn reset_changed(&mut self, before: Marks) {
        let now = self.marks();
        if now.0[0] != before.0[0] {
            self.schemas.0.clear();
        }
        if now.0[1] != before.0[1] {
            self.fan_out.0.clear();
        }
        if now.0[2] != before.0[2] {
            self.circuits.0.clear();
        }
        if now.0[3] != before.0[3] {
            self.senders.0.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body_bytes: usize) -> SentEvent {
        SentEvent {
            event_type: "t".into(),
            body: "x".repeat(body_bytes),
            traceparent: None,
        }
    }

    /// The event cache holds what fits its byte budget, starts over when the
    /// next event would not fit, and never keeps an event too big for it.
    #[test]
    fn the_event_cache_stays_within_its_bytes() {
        let mut c = EventCache::default();
        let quarter = EventCache::MAX_BYTES / 4 - EventCache::ENTRY_BYTES - 1;
        let ids: Vec<EventId> = (0..5).map(|_| EventId::new()).collect();
        for id in &ids[..3] {
            c.insert(*id, event(quarter));
        }
        assert!(ids[..3].iter().all(|id| c.get(*id).is_some()));
        assert!(c.bytes <= EventCache::MAX_BYTES);
        // The fourth fits; the fifth does not, and empties the cache first.
        c.insert(ids[3], event(quarter));
        assert!(c.get(ids[0]).is_some());
        c.insert(ids[4], event(quarter));
        assert!(c.get(ids[0]).is_none());
        assert_eq!(c.get(ids[4]).map(|e| e.body.len()), Some(quarter));
        assert!(c.bytes <= EventCache::MAX_BYTES);
        // Too big for a quarter of the budget: not kept, nothing dropped.
        let big = EventId::new();
        c.insert(big, event(EventCache::MAX_BYTES / 4));
        assert!(c.get(big).is_none());
        assert!(c.get(ids[4]).is_some());
    }

    /// A rate budget is updated only in an entry the cache holds, and counts
    /// as a change (a failed claim that spent it empties the cache).
    #[test]
    fn a_spent_budget_updates_only_a_kept_sender() {
        let mut c = SenderCache::default();
        let (kept, other) = (EndpointId::new(), EndpointId::new());
        c.insert(
            kept,
            Sender {
                account: "a".into(),
                live: true,
                cap: None,
                rate: Some(5),
                budget: None,
                ordered: false,
                url: "https://example.com".into(),
                secrets: ("s".into(), None, None),
                headers: None,
                oauth2: None,
                retry: None,
                client_tls: None,
                transform: None,
            },
        );
        let before = c.0.changes;
        let spent = RateBudget::stored(Some(2.5), Some(7)).unwrap();
        c.set_budget(kept, spent);
        c.set_budget(other, spent);
        assert_eq!(c.get(kept).and_then(|s| s.budget), Some(spent));
        assert!(c.get(other).is_none());
        assert_eq!(c.0.changes, before + 1);
    }
}
