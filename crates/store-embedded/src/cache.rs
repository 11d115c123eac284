//! What the writer remembers between transactions besides the live index
//! ([`crate::live`]): each cache is filled and emptied on the writer thread
//! alone, forgotten where the rows it copies change, and emptied when a
//! transaction fails (it may have read a change that did not commit).

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

/// The schema of each (account, event type) a publish has looked up: `None`
/// for a type that is not registered or has no schema. The embedded store
/// is one process with one writer, so a put or a delete (which forgets its
/// entry) is the only way an entry changes; a failed transaction empties
/// the cache, since it may have read its own put that did not commit.
/// Bounded: emptied when full. It spares each publish a statement (ADR 0025).
#[derive(Default)]
pub(crate) struct SchemaCache(HashMap<(AccountId, String), Option<String>>);

impl SchemaCache {
    const MAX: usize = 100_000;

    /// The entry of `account`'s `name`: `None` when not looked up yet.
    pub fn get(&self, account: &AccountId, name: &str) -> Option<&Option<String>> {
        self.0.get(&(account.clone(), name.to_string()))
    }

    /// Remembers what the store holds for `account`'s `name`.
    pub fn insert(&mut self, account: &AccountId, name: &str, schema: Option<String>) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert((account.clone(), name.to_string()), schema);
    }

    /// Forgets `account`'s `name` (it was put or deleted).
    pub fn forget(&mut self, account: &AccountId, name: &str) {
        self.0.remove(&(account.clone(), name.to_string()));
    }
}

/// The live endpoints of each account as fan-out reads them (ids,
/// subscriptions and filters; secrets left sealed): a publish asks for them
/// in every transaction, and they change only when an endpoint of the
/// account is created, updated or removed, which forgets the account's
/// entry. Other columns copied here (enabled, circuit) may be stale: fan-out
/// does not read them. Bounded: emptied when full.
#[derive(Default)]
pub(crate) struct FanOutCache(HashMap<AccountId, Arc<[Endpoint]>>);

impl FanOutCache {
    const MAX: usize = 10_000;

    /// The endpoints of `account`, when looked up since they last changed.
    pub fn get(&self, account: &AccountId) -> Option<Arc<[Endpoint]>> {
        self.0.get(account).cloned()
    }

    /// Remembers the endpoints of `account`.
    pub fn insert(&mut self, account: &AccountId, endpoints: Arc<[Endpoint]>) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(account.clone(), endpoints);
    }

    /// Forgets the endpoints of `account` (one of them changed).
    pub fn forget(&mut self, account: &AccountId) {
        self.0.remove(account);
    }
}

/// The circuit of each endpoint a transition has read: only
/// `endpoint::save_circuit` writes circuits, and it updates its entry, so
/// an entry is what the table holds. It spares every outcome batch a
/// statement per endpoint. Bounded: emptied when full.
#[derive(Default)]
pub(crate) struct CircuitCache(HashMap<EndpointId, Circuit>);

impl CircuitCache {
    const MAX: usize = 100_000;

    /// The circuit of `endpoint`, when read or written since the cache was
    /// last emptied.
    pub fn get(&self, endpoint: EndpointId) -> Option<&Circuit> {
        self.0.get(&endpoint)
    }

    /// Remembers the circuit of `endpoint`.
    pub fn insert(&mut self, endpoint: EndpointId, circuit: Circuit) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(endpoint, circuit);
    }
}
