//! The schemas a publish is checked against (ADR 0025), compiled once per
//! distinct text and kept in a process-wide cache bounded by their cost
//! ([`CompiledSchema::cost`]), so a publish costs one lookup and one
//! validation. The rules (limits, what compiles, the message of a failing
//! payload) are the port's: [`compile_schema`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use control_plane_core::{compile_schema, AccountId, CompiledSchema, PublishRequest, StoreError};

/// What the process keeps of compiled schemas, by their cost, before it
/// starts over.
const CACHE_BYTES: usize = 64 << 20;

/// The compiled schemas by their text, and their summed cost.
type Cache = Mutex<(HashMap<String, Arc<CompiledSchema>>, usize)>;

/// A registered type's schema as an adapter reads it: account, type name
/// and the schema's JSON text.
pub type StoredSchema = (AccountId, String, String);

/// The schemas a batch of publishes needs: per account (in order of first
/// appearance), the distinct types it publishes. An adapter reads the
/// schemas of these types in the publish's transaction and passes them to
/// [`check_publishes`].
pub fn types_by_account(reqs: &[PublishRequest]) -> Vec<(&AccountId, Vec<&str>)> {
    let mut out: Vec<(&AccountId, Vec<&str>)> = Vec::new();
    for r in reqs {
        let i = match out.iter().position(|(a, _)| **a == r.account) {
            Some(i) => i,
            None => {
                out.push((&r.account, Vec::new()));
                out.len() - 1
            }
        };
        if let Some((_, types)) = out.get_mut(i) {
            if !types.contains(&r.event_type.as_str()) {
                types.push(&r.event_type);
            }
        }
    }
    out
}

/// Checks every request whose type has a schema among `schemas`.
///
/// # Errors
/// The first failing request's error, as [`check_publish`] gives it.
pub fn check_publishes(
    reqs: &[PublishRequest],
    schemas: &[StoredSchema],
) -> Result<(), StoreError> {
    let batch = reqs.len();
    for (i, r) in reqs.iter().enumerate() {
        check_publish(r, i, batch, schemas)?;
    }
    Ok(())
}

/// Checks request `i` of a publish of `batch` requests against its type's
/// schema among `schemas`, if it has one.
///
/// # Errors
/// [`CompiledSchema::check`]'s error; in a batch of more than one, named
/// as `events[i]` (the batch route's name of the event, README); also when
/// the stored schema does not compile (it was stored by hand).
pub fn check_publish(
    req: &PublishRequest,
    i: usize,
    batch: usize,
    schemas: &[StoredSchema],
) -> Result<(), StoreError> {
    let schema = schemas
        .iter()
        .find(|(a, name, _)| *a == req.account && *name == req.event_type);
    let Some((_, _, text)) = schema else {
        return Ok(());
    };
    cached(text)?
        .check(&req.event_type, &req.payload)
        .map_err(|e| match e {
            StoreError::InvalidInput(m) if batch > 1 => {
                StoreError::InvalidInput(format!("events[{i}]: {m}"))
            }
            other => other,
        })
}

/// The compiled schema of `text`, from the cache or compiled now; the
/// cache keeps at most [`CACHE_BYTES`] of compiled schemas.
fn cached(text: &str) -> Result<Arc<CompiledSchema>, StoreError> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let lock = || {
        cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(v) = lock().0.get(text) {
        return Ok(v.clone());
    }
    let compiled = Arc::new(compile_schema(text)?);
    let mut kept = lock();
    if kept.1 + compiled.cost() > CACHE_BYTES {
        kept.0.clear();
        kept.1 = 0;
    }
    kept.0.insert(text.to_string(), compiled.clone());
    kept.1 += compiled.cost();
    Ok(compiled)
}
