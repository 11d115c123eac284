//! What the writer remembers between transactions besides the live index
//! ([`crate::live`]): each cache is filled and emptied on the writer thread
//! alone, forgotten where the rows it copies change, and emptied when a
//! transaction that changed it fails (it may have read a change that did
//! not commit).

use std::collections::HashMap;
use std::sync::Arc;

use control_plane_core::policy::Circuit;
use control_plane_core::{AccountId, DeliveryId, Endpoint, EndpointId};

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

/// The change counts of the writer's caches, taken when a transaction
/// begins: after it fails, a cache whose count moved is emptied.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marks([u64; 3]);

/// The caches a transaction may fill or change.
pub(crate) fn marks(
    schemas: &SchemaCache,
    fan_out: &FanOutCache,
    circuits: &CircuitCache,
) -> Marks {
    Marks([schemas.0.changes, fan_out.0.changes, circuits.0.changes])
}

/// Empties each cache that changed since `before`.
pub(crate) fn reset_changed(
    before: Marks,
    schemas: &mut SchemaCache,
    fan_out: &mut FanOutCache,
    circuits: &mut CircuitCache,
) {
    let now = marks(schemas, fan_out, circuits);
    if now.0[0] != before.0[0] {
        schemas.0.clear();
    }
    if now.0[1] != before.0[1] {
        fan_out.0.clear();
    }
    if now.0[2] != before.0[2] {
        circuits.0.clear();
    }
}
