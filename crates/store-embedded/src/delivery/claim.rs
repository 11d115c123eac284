//! Claiming: expired leases swept, probes first, then due deliveries shared
//! fairly among endpoints and accounts (ADR 0009), leased and read back.

use crate::delivery::dead_letters::seq_range;
use crate::delivery::read::{row_to_delivery, sent_events, DELIVERY_COLS};
use crate::delivery::transition::{Circuits, Transitions};
use crate::endpoint;
use crate::error::DuckResultExt;
use crate::live::{row_to_lease_row, EndpointQueue, LiveRow, LEASE_COLS};
use crate::store::Tx;
use crate::util::{list, RowExt};
use control_plane_core::plan_lease_expiry;
use control_plane_core::LeaseRow;
use control_plane_core::{
    share_claim, AccountId, CircuitMode, ClaimRequest, ClaimedDelivery, Delivery, DeliveryId,
    DeliveryState, EndpointId, FlowCandidate, Lease, LeaseToken, RateBudget, Secret,
    SigningSecrets, StoreError, StoreResult, Throttle, Timestamp, TraceParent,
};
use duckdb::{params, Row};
use std::collections::HashMap;

/// Logs and frees every lease that expired by `t.now`.
pub(super) fn sweep_expired(t: &mut Tx<'_>) -> StoreResult<()> {
    let expired = {
        let mut st = t
            .prepare(&format!(
                "SELECT {LEASE_COLS} FROM deliveries WHERE state = 'leased' AND lease_expires_at <= $1 ORDER BY seq"
            ))
            .db()?;
        let rows = st
            .query_map(params![t.now.as_millis()], row_to_lease_row)
            .db()?;
        rows.collect::<Result<Vec<_>, _>>().db()?
    };
    let mut circuits = Circuits::default();
    let mut writes = Transitions::default();
    for mut row in expired {
        let circuit = circuits.get(t, row.endpoint_id)?;
        let probe = circuit.is_probe(row.id);
        let tr = plan_lease_expiry(row.state_for_plan(), circuit, probe, t.now, &t.options);
        writes.push(t, &mut row, &tr, None, None)?;
    }
    circuits.write(t)?;
    writes.write(t)
}

/// Pending and due on a live enabled endpoint that is not a poll endpoint
/// (whose consumer reads its deliveries, ADR 0051).
pub(super) const DUE: &str =
    "d.state = 'pending' AND d.due_at <= $1 AND e.enabled AND e.deleted_at IS NULL AND e.url <> ''";

/// The head of its endpoint when that one is ordered (with [`DUE`]: claimable).
pub(super) const HEAD: &str = "(NOT e.ordered OR d.seq = (SELECT min(h.seq) FROM deliveries h \
     WHERE h.endpoint_id = d.endpoint_id AND h.state IN ('pending', 'leased')))";

/// A claim candidate: id, endpoint, due time, sequence.
pub(super) type Candidate = (DeliveryId, EndpointId, i64, i64);

pub(super) fn candidates(
    t: &Tx<'_>,
    sql: &str,
    now: i64,
    limit: i64,
) -> StoreResult<Vec<Candidate>> {
    candidates_of(t, sql, params![now, limit])
}

pub(super) fn candidates_of(
    t: &Tx<'_>,
    sql: &str,
    params: impl duckdb::Params,
) -> StoreResult<Vec<Candidate>> {
    let mut st = t.prepare(sql).db()?;
    let rows = st
        .query_map(params, |r| Ok((r.col(0)?, r.col(1)?, r.get(2)?, r.get(3)?)))
        .db()?;
    rows.collect::<Result<Vec<_>, _>>().db()
}

/// One endpoint's share of a claim as the flow rule sees it, with the
/// refilled bucket when it has a rate limit, and its due deliveries oldest
/// first, as many as the claim could take (for an ordered endpoint its head
/// alone).
pub(super) struct Flow {
    pub(super) candidate: FlowCandidate,
    pub(super) budget: Option<(u32, RateBudget)>,
    pub(super) heads: Vec<Candidate>,
}

/// The flows of unordered endpoints on closed circuits, in one scan of the
/// live rows (`$1` now, `$2` the claim's limit): per endpoint its oldest
/// due `(due_at, seq)`, due count (up to `$2`) and live leases, with the
/// endpoint's cap, rate limit and bucket, and its `$2` oldest due
/// deliveries ([`flows`] reads the columns).
pub(super) const FLOWS_UNORDERED: &str = "WITH g AS (SELECT d.endpoint_id, \
     count(*) FILTER (WHERE d.state = 'pending' AND d.due_at <= $1) AS n, \
     count(*) FILTER (WHERE d.state = 'leased' AND d.lease_expires_at > $1) AS leased, \
     min_by({'id': d.id, 'due': d.due_at, 'seq': d.seq}, {'due': d.due_at, 'seq': d.seq}, $2) \
       FILTER (WHERE d.state = 'pending' AND d.due_at <= $1) AS heads \
     FROM deliveries d WHERE d.state IN ('pending', 'leased') GROUP BY d.endpoint_id) \
     SELECT e.id, e.account, g.heads[1].due, g.heads[1].seq, least(g.n, $2), g.leased, e.max_in_flight, \
     e.rate_limit_per_s, e.budget_tokens, e.budget_at, e.ordered, g.heads, \
     (SELECT count(*) FROM endpoints o WHERE o.enabled AND o.deleted_at IS NULL AND o.ordered \
       AND o.circuit_mode = 'closed') AS ordered_endpoints \
     FROM g JOIN endpoints e ON e.id = g.endpoint_id \
     WHERE g.n > 0 AND e.enabled AND e.deleted_at IS NULL AND e.url <> '' AND NOT e.ordered \
     AND e.circuit_mode = 'closed'";

/// The flows of ordered endpoints on closed circuits whose head (the oldest
/// pending or leased delivery) is pending and due: the same columns as
/// [`FLOWS_UNORDERED`], the head being the one delivery it may hand out.
pub(super) const FLOWS_ORDERED: &str = "WITH due AS (SELECT d.endpoint_id, d.id, d.due_at, d.seq FROM deliveries d \
     JOIN endpoints e ON e.id = d.endpoint_id \
     WHERE d.state = 'pending' AND d.due_at <= $1 AND e.enabled AND e.deleted_at IS NULL AND e.url <> '' \
     AND e.ordered AND e.circuit_mode = 'closed' AND d.seq = (SELECT min(h.seq) FROM deliveries h \
     WHERE h.endpoint_id = d.endpoint_id AND h.state IN ('pending', 'leased'))), \
     fl AS (SELECT endpoint_id, count(*) AS n FROM deliveries \
     WHERE state = 'leased' AND lease_expires_at > $1 GROUP BY endpoint_id) \
     SELECT e.id, e.account, due.due_at, due.seq, least(1, $2), coalesce(fl.n, 0), e.max_in_flight, \
     e.rate_limit_per_s, e.budget_tokens, e.budget_at, e.ordered, \
     [{'id': due.id, 'due': due.due_at, 'seq': due.seq}], 1 \
     FROM due JOIN endpoints e ON e.id = due.endpoint_id LEFT JOIN fl ON fl.endpoint_id = due.endpoint_id";

/// A list of `{id, due, seq}` structs as claim candidates of `endpoint`.
pub(super) fn heads_of(
    endpoint: EndpointId,
    v: duckdb::types::Value,
) -> duckdb::Result<Vec<Candidate>> {
    use duckdb::types::Value;
    let bad = || {
        duckdb::Error::FromSqlConversionFailure(
            11,
            duckdb::types::Type::Any,
            "a due delivery is not an {id, due, seq} struct".into(),
        )
    };
    let Value::List(items) = v else {
        return Err(bad());
    };
    items
        .into_iter()
        .map(|item| {
            let Value::Struct(fields) = item else {
                return Err(bad());
            };
            let int = |k: &str| match fields.get(&k.to_string()) {
                Some(Value::BigInt(n)) => Ok(*n),
                _ => Err(bad()),
            };
            let id = match fields.get(&"id".to_string()) {
                Some(Value::Text(s)) => uuid::Uuid::parse_str(s).map_err(|_| bad())?,
                _ => return Err(bad()),
            };
            Ok((DeliveryId(id), endpoint, int("due")?, int("seq")?))
        })
        .collect()
}

/// An endpoint's columns that a flow needs, read from `r` at `at`: id,
/// account, `max_in_flight`, `rate_limit_per_s`, `budget_tokens`,
/// `budget_at`, `ordered`.
struct FlowEndpoint {
    endpoint: EndpointId,
    account: String,
    cap: Option<u32>,
    rate: Option<u32>,
    budget: Option<RateBudget>,
    ordered: bool,
}

impl FlowEndpoint {
    fn read(r: &Row<'_>, at: [usize; 7]) -> duckdb::Result<Self> {
        Ok(FlowEndpoint {
            endpoint: r.col(at[0])?,
            account: r.get(at[1])?,
            cap: r.get(at[2])?,
            rate: r.get(at[3])?,
            budget: RateBudget::stored(r.get(at[4])?, r.get(at[5])?),
            ordered: r.get(at[6])?,
        })
    }

    /// Its flow at `t.now`, with its due work: the oldest due delivery,
    /// how many are due (up to the claim's limit), its live leases and the
    /// deliveries it could hand out.
    fn flow(
        self,
        t: &Tx<'_>,
        throttle: &Throttle,
        due: u32,
        in_flight: u32,
        heads: Vec<Candidate>,
    ) -> StoreResult<Flow> {
        let now = t.now;
        let budget = self
            .rate
            .map(|rate| (rate, RateBudget::refilled(self.budget, rate, now)));
        let oldest = heads
            .first()
            .map_or((0, 0), |(_, _, due, seq)| (*due, *seq));
        let cap = t.options.cap_of(self.cap);
        Ok(Flow {
            candidate: FlowCandidate {
                endpoint: self.endpoint,
                account: AccountId::new(self.account)?,
                oldest,
                due,
                in_flight,
                cap: throttle.cap(self.endpoint, cap),
                rate_room: budget.map(|(_, b)| b.whole()),
                ordered: self.ordered,
            },
            budget,
            heads,
        })
    }
}

/// The flows of one of the statements above, and whether any ordered
/// endpoint is live (the unordered statement counts them on the way).
pub(super) fn flows(
    t: &Tx<'_>,
    sql: &str,
    limit: i64,
    throttle: &Throttle,
) -> StoreResult<(Vec<Flow>, bool)> {
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    let rows: Vec<(FlowEndpoint, i64, i64, Vec<Candidate>, i64)> = {
        let mut st = t.prepare(sql).db()?;
        let rows = st
            .query_map(params![t.now.as_millis(), limit], |r| {
                let e = FlowEndpoint::read(r, [0, 1, 6, 7, 8, 9, 10])?;
                let heads = heads_of(e.endpoint, r.get(11)?)?;
                Ok((e, r.get(4)?, r.get(5)?, heads, r.get(12)?))
            })
            .db()?;
        rows.collect::<Result<_, _>>().db()?
    };
    let mut any_ordered = false;
    let mut out = Vec::with_capacity(rows.len());
    for (e, due, in_flight, heads, ordered_endpoints) in rows {
        any_ordered |= ordered_endpoints > 0;
        out.push(e.flow(t, throttle, count(due), count(in_flight), heads)?);
    }
    Ok((out, any_ordered))
}

/// The flows of every endpoint on a closed circuit with due work, from the
/// writer's live index ([`crate::live`]) and its endpoint cache: the same
/// flows the two statements above find, without scanning the live rows.
/// `None` while the index is not kept.
pub(super) fn flows_from_index(
    t: &mut Tx<'_>,
    limit: i64,
    throttle: &Throttle,
) -> StoreResult<Option<Vec<Flow>>> {
    let now = t.now.as_millis();
    let take = usize::try_from(limit).unwrap_or(0);
    let mut due: HashMap<EndpointId, Due> = HashMap::new();
    // Endpoints with pending deliveries past their window that this claim
    // may reach (ADR 0028): read in once the endpoint proves live.
    let mut short = Vec::new();
    {
        let Some(queues) = t.live_queues()? else {
            return Ok(None);
        };
        for (endpoint, q) in queues {
            if q.short_for_claim(now, take) {
                short.push(*endpoint);
            }
            if let Some(d) = due_of(*endpoint, q, now, take) {
                due.insert(*endpoint, d);
            }
        }
    }
    if due.is_empty() && short.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mut ids: Vec<EndpointId> = due.keys().chain(&short).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    let senders = endpoint::senders(t, &ids)?;
    let mut endpoints = Vec::with_capacity(senders.len());
    for (id, s) in senders {
        // Enabled, not removed, and on a closed circuit.
        if s.live && endpoint::load_circuit(t, id)?.mode == CircuitMode::Closed {
            endpoints.push(FlowEndpoint {
                endpoint: id,
                account: s.account,
                cap: s.cap,
                rate: s.rate,
                budget: s.budget,
                ordered: s.ordered,
            });
        }
    }
    for e in endpoints.iter().filter(|e| short.contains(&e.endpoint)) {
        if let Some(d) = refilled(t, e.endpoint, now, take)? {
            due.insert(e.endpoint, d);
        }
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        let Some((heads, in_flight, head)) = due.remove(&e.endpoint) else {
            continue;
        };
        let heads = match (e.ordered, head) {
            (false, _) => heads,
            (true, Some(head)) => vec![head],
            (true, None) => continue,
        };
        let n = count(heads.len());
        out.push(e.flow(t, throttle, n, count(in_flight), heads)?);
    }
    Ok(Some(out))
}

/// Per endpoint with due work: its oldest due deliveries (up to a claim's
/// `take`), its live leases, and its head when that is the one an ordered
/// endpoint may send.
type Due = (Vec<Candidate>, usize, Option<Candidate>);

/// What `endpoint`'s queue `q` holds due at `now`; `None` when nothing.
fn due_of(endpoint: EndpointId, q: &EndpointQueue, now: i64, take: usize) -> Option<Due> {
    let heads: Vec<Candidate> = q
        .due_at(now)
        .take(take)
        .map(|(due, seq, id)| (*id, endpoint, *due, *seq))
        .collect();
    if heads.is_empty() {
        return None;
    }
    let head = q
        .due_head(now)
        .map(|(due, seq, id)| (id, endpoint, due, seq));
    Some((heads, q.in_flight(now), head))
}

/// Reads windows of `endpoint`'s pending deliveries into the live index
/// until a claim of `take` at `now` finds its oldest due ones there, then
/// what it holds due.
fn refilled(
    t: &mut Tx<'_>,
    endpoint: EndpointId,
    now: i64,
    take: usize,
) -> StoreResult<Option<Due>> {
    for _ in 0..=take {
        let short = match t.live_queues()? {
            Some(queues) => queues
                .get(&endpoint)
                .is_some_and(|q| q.short_for_claim(now, take)),
            None => return Ok(None),
        };
        if !short {
            break;
        }
        t.live_refill(endpoint)?;
    }
    Ok(t.live_queues()?
        .and_then(|queues| queues.get(&endpoint))
        .and_then(|q| due_of(endpoint, q, now, take)))
}

/// The ordinary deliveries of a claim of `limit`: the endpoints' shares
/// (`flow::share_claim`), each endpoint's oldest due first; spends the rate
/// budgets of the endpoints that get any. The flows come from the live
/// index; without one, one scan finds the unordered endpoints' flows with
/// their oldest due deliveries, and ordered endpoints take a second one,
/// only when there are any.
pub(super) fn fair_candidates(
    t: &mut Tx<'_>,
    limit: i64,
    throttle: &Throttle,
) -> StoreResult<Vec<Candidate>> {
    let all = match flows_from_index(t, limit, throttle)? {
        Some(all) => all,
        None => {
            let (mut all, counted) = flows(t, FLOWS_UNORDERED, limit, throttle)?;
            // With no unordered flow there was no row to count ordered endpoints on.
            let any_ordered = if all.is_empty() {
                any_endpoint(t, ANY_ORDERED, [])?
            } else {
                counted
            };
            if any_ordered {
                all.extend(flows(t, FLOWS_ORDERED, limit, throttle)?.0);
            }
            all
        }
    };
    let candidates: Vec<FlowCandidate> = all.iter().map(|f| f.candidate.clone()).collect();
    let shares = share_claim(&candidates, u32::try_from(limit).unwrap_or(0), throttle);
    let mut picked: Vec<Candidate> = Vec::new();
    for (endpoint, n) in shares {
        if let Some(f) = all.iter().find(|f| f.candidate.endpoint == endpoint) {
            picked.extend(f.heads.iter().take(n as usize).copied());
        }
    }
    picked.sort_by_key(|(_, _, due, seq)| (*due, *seq));
    spend_budgets(t, &all, &picked)?;
    Ok(picked)
}

/// Spends one token per picked delivery from each rate-limited endpoint's
/// bucket.
pub(super) fn spend_budgets(
    t: &mut Tx<'_>,
    flows: &[Flow],
    picked: &[Candidate],
) -> StoreResult<()> {
    for f in flows {
        let Some((_, budget)) = f.budget else {
            continue;
        };
        let taken = picked
            .iter()
            .filter(|c| c.1 == f.candidate.endpoint)
            .count();
        if taken == 0 {
            continue;
        }
        let left = budget.spend(u32::try_from(taken).unwrap_or(u32::MAX));
        t.senders.set_budget(f.candidate.endpoint, left);
        t.execute(
            "UPDATE endpoints SET budget_tokens = $1, budget_at = $2 WHERE id = $3",
            params![
                left.tokens,
                left.at.as_millis(),
                f.candidate.endpoint.to_string()
            ],
        )
        .db()?;
    }
    Ok(())
}

/// Whether any live endpoint has a circuit due for a probe (`$1` now).
pub(super) const ANY_PROBE_DUE: &str =
    "SELECT count(*) FROM endpoints WHERE enabled AND deleted_at IS NULL \
     AND circuit_mode = 'open' AND circuit_open_until <= $1";

/// Whether any live endpoint is ordered and closed.
pub(super) const ANY_ORDERED: &str =
    "SELECT count(*) FROM endpoints WHERE enabled AND deleted_at IS NULL \
     AND ordered AND circuit_mode = 'closed'";

/// Whether one of the counts above finds an endpoint: the endpoints table is
/// small, and this spares the deliveries scans that would find nothing.
pub(super) fn any_endpoint(
    t: &Tx<'_>,
    sql: &str,
    params: impl duckdb::Params,
) -> StoreResult<bool> {
    let n: i64 = t.query_row(sql, params, |r| r.get(0)).db()?;
    Ok(n > 0)
}

pub(crate) fn claim(t: &mut Tx<'_>, req: ClaimRequest) -> StoreResult<Vec<ClaimedDelivery>> {
    let limit = i64::from(req.limit());
    // Every few hundred milliseconds: free expired leases, then probes first
    // (one per circuit whose cooldown is over).
    let mut picks: Vec<(Candidate, bool)> = Vec::new();
    if t.housekeeping.due(t.now) {
        if t.live().may_have_expired(t.now) {
            sweep_expired(t)?;
        }
        picks.extend(due_probes(t, limit)?.into_iter().map(|c| (c, true)));
    }
    // Then ordinary deliveries on closed circuits fill the rest, shared
    // fairly among endpoints and accounts within each endpoint's cap and
    // rate budget (ADR 0009).
    let rest = limit - picks.len() as i64;
    if rest > 0 {
        picks.extend(
            fair_candidates(t, rest, req.throttle())?
                .into_iter()
                .map(|c| (c, false)),
        );
    }
    if picks.is_empty() {
        return Ok(Vec::new());
    }
    picks.sort_by_key(|((_, _, due, seq), _)| (*due, *seq));
    lease(t, &picks, &req)
}

/// The head of each endpoint whose circuit is due for a probe, oldest first.
pub(super) fn due_probes(t: &Tx<'_>, limit: i64) -> StoreResult<Vec<Candidate>> {
    let now = t.now.as_millis();
    if !any_endpoint(t, ANY_PROBE_DUE, params![now])? {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT d.id, d.endpoint_id, d.due_at, d.seq FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
         WHERE {DUE} AND {HEAD} AND e.circuit_mode = 'open' AND e.circuit_open_until <= $1 \
         QUALIFY row_number() OVER (PARTITION BY d.endpoint_id ORDER BY d.due_at, d.seq) = 1 \
         ORDER BY d.due_at, d.seq LIMIT $2"
    );
    candidates(t, &sql, now, limit)
}

/// Leases the picks (a probe starts its circuit's probe) and returns them
/// with what a send needs, in the picks' order.
pub(super) fn lease(
    t: &mut Tx<'_>,
    picks: &[(Candidate, bool)],
    req: &ClaimRequest,
) -> StoreResult<Vec<ClaimedDelivery>> {
    let now = t.now.as_millis();
    let mut circuits = Circuits::default();
    let mut leases = HashMap::with_capacity(picks.len());
    // One token for the claim's batch: each delivery's writes are still
    // fenced by its id and this token, and the lease is one value for
    // every row it writes, which DuckDB updates without a join of per-row
    // values (docs/experiments.md, "The embedded store's write shapes").
    let token = LeaseToken::new();
    for ((id, endpoint_id, _, _), probe) in picks {
        if *probe {
            circuits.get(t, *endpoint_id)?.start_probe(*id);
        }
        leases.insert(*id, (token, *probe));
    }
    circuits.write(t)?;
    let expires = t.now.plus(req.lease_for());
    let seqs: Vec<i64> = picks.iter().map(|((.., seq), _)| *seq).collect();
    let (lo, hi) = seq_range(&seqs).unwrap_or_default();
    let seqs = || list::of(seqs.iter().copied());
    let params = params![
        seqs(),
        token.to_string(),
        expires.as_millis(),
        req.worker(),
        now,
        lo,
        hi
    ];
    let n = t.execute(LEASE, params).db()?;
    if n != picks.len() {
        return Err(StoreError::Backend(format!(
            "{} of {} claimed deliveries were no longer pending and due; the live index is rebuilt",
            picks.len().saturating_sub(n),
            picks.len()
        )));
    }
    let leased = match leased_from_index(t, picks, expires) {
        Some(leased) => {
            if t.check_against_table {
                same_as_the_table(t, &leased, (lo, hi), expires, now)?;
            }
            leased
        }
        None => {
            // A kept index that offered picks it does not hold is out of
            // step: rebuilt at the next claim.
            if t.live().is_built() {
                t.live_mut().forget();
            }
            leased_rows(t, (lo, hi), expires, now)?
        }
    };
    let mut claimed = sends(t, leased, expires, &leases)?;
    for c in claimed.values() {
        t.live_mut().put(held_row(c));
        t.seqs.insert(c.delivery.id, c.delivery.seq);
    }
    let claimed = picks
        .iter()
        .map(|((id, ..), _)| {
            claimed.remove(id).ok_or_else(|| {
                StoreError::Backend(format!("claimed delivery {id} was not read back"))
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(t.keys.open_claimed(claimed))
}

/// Leases the deliveries of seqs `$1` with token `$2` until `$3` for
/// worker `$4` at `$5` (`$6..=$7` bound the seqs). Only pending, due rows:
/// should the live index ever offer another one, the claim fails instead of
/// leasing it twice, and the failed transaction throws the index away (the
/// next claim rebuilds it).
const LEASE: &str =
    "UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_token = $2, \
     lease_expires_at = $3, leased_by = $4, last_outcome = NULL, updated_at = $5 \
     WHERE seq BETWEEN $6 AND $7 AND seq IN (SELECT unnest($1::BIGINT[])) \
     AND state = 'pending' AND due_at <= $5";

/// The deliveries a claim just leased (until `expires`), as the lease made
/// them from the rows the live index holds: nothing is read back (ADR 0028).
/// `None` when the index is not kept or lacks one of them (then
/// [`leased_rows`] reads them).
fn leased_from_index(
    t: &Tx<'_>,
    picks: &[(Candidate, bool)],
    expires: Timestamp,
) -> Option<Vec<Delivery>> {
    picks
        .iter()
        .map(|((id, ..), _)| {
            let pending = t.live().pending(*id)?.delivery();
            Some(Delivery {
                state: DeliveryState::Leased,
                attempts: pending.attempts.saturating_add(1),
                lease_expires_at: Some(expires),
                updated_at: t.now,
                ..pending
            })
        })
        .collect()
}

/// Checks the deliveries a claim made from the live index against the
/// table, when the store is told to
/// ([`crate::EmbeddedConfig::check_against_table`]): so every contract that
/// claims also checks that the index held each row as the table does.
fn same_as_the_table(
    t: &Tx<'_>,
    leased: &[Delivery],
    range: (i64, i64),
    expires: Timestamp,
    now: i64,
) -> StoreResult<()> {
    // The range may also hold an earlier lease of the same instant and
    // length (a manual clock): only this claim's rows are compared.
    let mut table = leased_rows(t, range, expires, now)?;
    table.retain(|d| leased.iter().any(|l| l.id == d.id));
    let mut kept = leased.to_vec();
    table.sort_by_key(|d| d.seq);
    kept.sort_by_key(|d| d.seq);
    if table != kept {
        return Err(StoreError::Backend(format!(
            "a claim from the live index differs from the table: kept {kept:?}, in the table {table:?}"
        )));
    }
    Ok(())
}

/// The deliveries a claim just leased (`lo..=hi` by seq, leased until
/// `expires` at `now`), as leased. A second statement, not a `RETURNING`
/// on the lease: on DuckDB 1.2 the `RETURNING` made burn-down claims of 100
/// a fifth slower than the update and this read together (ADR 0028).
fn leased_rows(
    t: &Tx<'_>,
    (lo, hi): (i64, i64),
    expires: Timestamp,
    now: i64,
) -> StoreResult<Vec<Delivery>> {
    let mut st = t
        .prepare(&format!(
            "SELECT {DELIVERY_COLS} FROM deliveries d WHERE d.seq BETWEEN $1 AND $2 \
             AND d.state = 'leased' AND d.lease_expires_at = $3 AND d.updated_at = $4"
        ))
        .db()?;
    let rows = st
        .query_map(params![lo, hi, expires.as_millis(), now], row_to_delivery)
        .db()?;
    rows.collect::<Result<_, _>>().db()
}

/// The deliveries a claim just leased (until `expires`) with what a send
/// needs, by id: their events and endpoints come from the writer's caches
/// ([`crate::cache::EventCache`], [`crate::cache::SenderCache`]), which read
/// only what they lack. `leases` holds each one's token and whether it is a
/// probe.
fn sends(
    t: &mut Tx<'_>,
    leased: Vec<Delivery>,
    expires: Timestamp,
    leases: &HashMap<DeliveryId, (LeaseToken, bool)>,
) -> StoreResult<HashMap<DeliveryId, ClaimedDelivery>> {
    let mut endpoint_ids: Vec<EndpointId> = leased.iter().map(|d| d.endpoint_id).collect();
    endpoint_ids.sort_unstable();
    endpoint_ids.dedup();
    let senders = endpoint::senders(t, &endpoint_ids)?;
    let events = sent_events(t, leased.iter().map(|d| d.event_id))?;
    let mut out = HashMap::with_capacity(leased.len());
    for delivery in leased {
        let (Some((token, probe)), Some(s), Some(ev)) = (
            leases.get(&delivery.id).copied(),
            senders.get(&delivery.endpoint_id),
            events.get(&delivery.event_id),
        ) else {
            continue;
        };
        let (current, previous, previous_expires_at) = s.secrets.clone();
        out.insert(
            delivery.id,
            ClaimedDelivery {
                lease: Lease {
                    delivery_id: delivery.id,
                    token,
                    attempt: delivery.attempts,
                    expires_at: delivery.lease_expires_at.unwrap_or(expires),
                },
                event_type: ev.event_type.clone(),
                body: ev.body.clone(),
                url: s.url.clone(),
                secrets: SigningSecrets {
                    current: Secret::new(current),
                    previous: previous.map(Secret::new),
                    previous_expires_at,
                },
                headers: s.headers.clone().map(Secret::new),
                probe,
                traceparent: ev.traceparent.as_deref().and_then(TraceParent::parse),
                oauth2: s.oauth2.clone().map(Secret::new),
                retry: s.retry.clone(),
                client_tls: s.client_tls.clone().map(Secret::new),
                transform: s.transform.clone(),
                delivery,
            },
        );
    }
    Ok(out)
}

/// The row the live index keeps for a delivery this claim leased.
fn held_row(c: &ClaimedDelivery) -> LiveRow {
    let d = &c.delivery;
    let row = LeaseRow {
        id: d.id,
        seq: d.seq,
        account: d.account.clone(),
        endpoint_id: d.endpoint_id,
        attempts: d.attempts,
        max_attempts: d.max_attempts,
        due_at: d.due_at,
        state: DeliveryState::Leased,
        lease_token: Some(c.lease.token),
        lease_expires_at: Some(c.lease.expires_at),
        last_outcome: None,
    };
    LiveRow {
        row,
        event_id: d.event_id,
        created_at: d.created_at,
        last_error: d.last_error.clone(),
        updated_at: d.updated_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lane;
    use control_plane_core::DeliveryStore;
    use control_plane_core::EventStore;
    use control_plane_core::PublishRequest;
    use std::time::Duration;

    /// Should the live index ever offer a delivery that the table holds
    /// leased, the lease fails instead of leasing it a second time.
    #[tokio::test]
    async fn a_lease_takes_only_pending_due_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (store, account) = crate::store::tests::store_with_endpoint(&dir, false).await;
        let event = PublishRequest::new(account, "order.paid".to_string(), serde_json::json!({}));
        store
            .event_publish_batch(control_plane_core::Checked::all(vec![event]).unwrap())
            .await
            .unwrap();
        let req = ClaimRequest::new("w", 10, Duration::from_secs(30)).unwrap();
        let first = store.delivery_claim(req.clone()).await.unwrap();
        let d = first[0].delivery.clone();
        let again = store
            .call(Lane::Work, move |w| {
                w.tx(|t| lease(t, &[((d.id, d.endpoint_id, 0, d.seq), false)], &req))
            })
            .await;
        assert!(
            matches!(&again, Err(StoreError::Backend(m)) if m.contains("no longer pending")),
            "{again:?}"
        );
    }
}
