//! Claiming: expired leases swept, probes first, then due deliveries shared
//! fairly among endpoints and accounts (ADR 0009) with `FOR UPDATE SKIP
//! LOCKED`, leased and returned.

use crate::delivery::read::row_to_delivery;
use crate::delivery::transition::{apply, row_to_lease_row, LEASE_COLS};
use crate::endpoint;
use crate::error::PgResultExt;
use crate::store::{Tx, CLAIM_SETTINGS};
use crate::util::{u32_of, RowExt};
use control_plane_core::plan_lease_expiry;
use control_plane_core::{
    share_claim, ClaimRequest, ClaimedDelivery, EndpointId, EndpointRetry, FlowCandidate, Lease,
    RateBudget, SigningSecrets, StoreResult, Throttle, TraceParent, Transform,
};
use tokio_postgres::Row;
use uuid::Uuid;

/// Logs and frees leases that expired by `now`; replicas split the work
/// through `SKIP LOCKED`.
pub(super) async fn sweep_expired(t: &Tx<'_>) -> StoreResult<()> {
    let rows = t
        .query(
            &format!(
                "SELECT {LEASE_COLS} FROM delivery_queue l WHERE l.state = 'leased' AND l.lease_expires_at <= $1 \
                 ORDER BY l.seq LIMIT 1000 FOR UPDATE SKIP LOCKED"
            ),
            &[&t.now.as_millis()],
        )
        .await
        .db()?;
    for r in &rows {
        let row = row_to_lease_row(r)?;
        let mut circuit = endpoint::load_circuit(t, row.endpoint_id, true).await?;
        let probe = circuit.is_probe(row.id);
        let tr = plan_lease_expiry(row.state_for_plan(), &mut circuit, probe, t.now, t.options);
        if probe {
            endpoint::save_circuit(t, row.endpoint_id, &circuit).await?;
        }
        apply(t, &row, &tr, None, None).await?;
    }
    Ok(())
}

/// The first claimable live row of endpoint `$2` at `$1`: pending, due, on a
/// live enabled endpoint, and the head of an ordered one.
pub(super) const PROBE_CANDIDATE: &str = "SELECT l.seq, l.due_at FROM delivery_queue l JOIN endpoints e ON e.id = l.endpoint_id \
     WHERE l.endpoint_id = $2 AND l.state = 'pending' AND l.due_at <= $1 AND e.enabled AND e.deleted_at IS NULL AND e.url <> '' \
     AND (NOT e.ordered OR l.seq = (SELECT min(h.seq) FROM delivery_queue h WHERE h.endpoint_id = l.endpoint_id)) \
     ORDER BY l.due_at, l.seq LIMIT 1 FOR UPDATE OF l SKIP LOCKED";

/// What a sender needs of the live rows `x` (their `endpoint_id`, `seq`
/// and `delivery_id`): the columns of the CTE `c` that
/// [`LEASE_AND_RETURN`] reads, joined by [`SENDER_JOINS`].
pub(super) const SENDER_COLS: &str =
    "x.endpoint_id, x.seq, dv.id, dv.account, dv.event_id, dv.created_at, \
     ev.event_type, ev.body, ep.url, ep.secret, ep.previous_secret, ep.previous_expires_at, ep.headers, \
     ev.traceparent, ep.oauth2, ep.retry_schedule, ep.max_attempts AS retry_max, ep.client_tls, \
     ep.transform";

/// The lookups of [`SENDER_COLS`], one row each by primary key. Written as
/// lateral subqueries with `LIMIT 1` so that the planner cannot turn them
/// into joins over whole tables: the claim runs a generic plan made once per
/// connection, and with the statistics of a small table it chose hash joins
/// over full index scans.
pub(super) const SENDER_JOINS: &str = "CROSS JOIN LATERAL (SELECT d.id, d.account, d.event_id, d.created_at \
       FROM deliveries d WHERE d.id = x.delivery_id LIMIT 1) dv \
     CROSS JOIN LATERAL (SELECT v.event_type, v.body, v.traceparent FROM events v WHERE v.id = dv.event_id LIMIT 1) ev \
     CROSS JOIN LATERAL (SELECT e.url, e.secret, e.previous_secret, e.previous_expires_at, e.headers, e.oauth2, \
       e.retry_schedule, e.max_attempts, e.client_tls, e.transform \
       FROM endpoints e WHERE e.id = x.endpoint_id LIMIT 1) ep";

/// Leases the live rows of the CTE `c` ([`SENDER_COLS`]) and returns them
/// with what a sender needs. The lookups happen inside `c`, so the update
/// finds each live row by its whole key: with the endpoint joined here, a
/// generic plan made while the table was small looked the rows up by
/// endpoint alone and filtered the sequence, reading every live row of the
/// endpoint per claimed one (78 ms claims at 5,000 live rows).
pub(super) const LEASE_AND_RETURN: &str = "UPDATE delivery_queue l SET state = 'leased', attempts = l.attempts + 1, \
     lease_token = gen_random_uuid(), lease_expires_at = $3, leased_by = $4, last_outcome = NULL, updated_at = $1 \
     FROM c WHERE l.endpoint_id = c.endpoint_id AND l.seq = c.seq \
     RETURNING c.id, c.account, c.endpoint_id, c.event_id, c.seq, l.state, l.attempts, l.max_attempts, l.due_at, \
     l.lease_expires_at, l.last_error, c.created_at, l.updated_at, c.event_type, c.body, c.url, c.secret, \
     c.previous_secret, c.previous_expires_at, l.lease_token, c.headers, c.traceparent, c.oauth2, \
     c.retry_schedule, c.retry_max, c.client_tls, c.transform";

/// The claim of ordinary deliveries, endpoint by endpoint: `$1` now (ms),
/// `$2` the endpoints, `$5` how many of each, `$6` the head sequence of an
/// ordered one (NULL otherwise), `$7` each one's in-flight cap, `$3` the
/// lease expiry (ms), `$4` the worker. Each endpoint's oldest due first,
/// skipping rows other replicas hold, and never past its cap counted by this
/// statement: issued after the flow rows are locked, its snapshot sees every
/// lease another claimer committed before (ADR 0009). The benchmark issues
/// this same text raw.
pub fn claim_statement() -> String {
    format!(
        "WITH q AS (SELECT * FROM unnest($2::uuid[], $5::bigint[], $6::bigint[], $7::bigint[]) \
               AS q(endpoint_id, n, head, cap)), \
         c AS (SELECT {SENDER_COLS} FROM q CROSS JOIN LATERAL \
               (SELECT p.endpoint_id, p.seq, p.delivery_id FROM delivery_queue p \
               WHERE p.endpoint_id = q.endpoint_id AND p.state = 'pending' AND p.due_at <= $1 \
               AND (q.head IS NULL OR p.seq = q.head) ORDER BY p.due_at, p.seq \
               LIMIT GREATEST(0, LEAST(q.n, q.cap - (SELECT count(*) FROM delivery_queue k \
                 WHERE k.endpoint_id = q.endpoint_id AND k.state = 'leased' AND k.lease_expires_at > $1))) \
               FOR UPDATE SKIP LOCKED) x {SENDER_JOINS}) \
         {LEASE_AND_RETURN}"
    )
}

/// Per endpoint with due work on a closed circuit, poll endpoints aside
/// (their consumers read their deliveries, ADR 0051) (`$1` now): account,
/// oldest due `(due_at, seq)`, due count up to `$2`, live leases, cap, rate
/// limit, bucket, ordered. Unordered endpoints by their due index, ordered
/// ones by their head (the first live row by sequence).
pub(super) const FLOW_CANDIDATES: &str = "SELECT e.id, e.account, h.due_at, h.seq, \
     (SELECT count(*) FROM (SELECT 1 FROM delivery_queue x WHERE x.endpoint_id = e.id AND x.state = 'pending' \
       AND x.due_at <= $1 LIMIT $2) k), \
     (SELECT count(*) FROM delivery_queue y WHERE y.endpoint_id = e.id AND y.state = 'leased' AND y.lease_expires_at > $1), \
     e.max_in_flight, e.rate_limit_per_s, f.tokens, f.refilled_at, e.ordered \
     FROM endpoints e JOIN circuits ci ON ci.endpoint_id = e.id JOIN endpoint_flow f ON f.endpoint_id = e.id \
     CROSS JOIN LATERAL (SELECT x.due_at, x.seq FROM delivery_queue x WHERE x.endpoint_id = e.id AND x.state = 'pending' \
       AND x.due_at <= $1 ORDER BY x.due_at, x.seq LIMIT 1) h \
     WHERE e.enabled AND e.deleted_at IS NULL AND e.url <> '' AND ci.mode = 'closed' AND NOT e.ordered \
     UNION ALL \
     SELECT e.id, e.account, h.due_at, h.seq, 1::bigint, \
     (SELECT count(*) FROM delivery_queue y WHERE y.endpoint_id = e.id AND y.state = 'leased' AND y.lease_expires_at > $1), \
     e.max_in_flight, e.rate_limit_per_s, f.tokens, f.refilled_at, e.ordered \
     FROM endpoints e JOIN circuits ci ON ci.endpoint_id = e.id JOIN endpoint_flow f ON f.endpoint_id = e.id \
     CROSS JOIN LATERAL (SELECT x.state, x.due_at, x.seq FROM delivery_queue x WHERE x.endpoint_id = e.id \
       ORDER BY x.seq LIMIT 1) h \
     WHERE e.enabled AND e.deleted_at IS NULL AND e.url <> '' AND ci.mode = 'closed' AND e.ordered \
     AND h.state = 'pending' AND h.due_at <= $1";

/// Whether a claim's transaction is still open when the claim returns:
/// the pipelined path sends its `COMMIT` with the claim statement, every
/// other path leaves it to [`DeliveryStore::delivery_claim`].
pub(super) enum ClaimTx {
    Open,
    Committed,
}

/// Leases the ordinary part of a claim of `limit`: the endpoints' fair
/// shares (`flow::share_claim`), then, under each chosen endpoint's flow
/// row lock (taken in id order, so claimers never deadlock), the shares cut
/// to what the cap and the bucket allow now, since another replica may have
/// claimed in between; then the buckets are spent (ADR 0009).
pub(super) async fn claim_fair(
    t: &Tx<'_>,
    limit: i64,
    expires: i64,
    req: &ClaimRequest,
    begin: Option<&str>,
) -> StoreResult<(Vec<ClaimedDelivery>, ClaimTx)> {
    let now_ms = t.now.as_millis();
    let (worker, throttle) = (req.worker(), req.throttle());
    let (rows, candidates) = flow_candidates(t, limit, throttle, begin).await?;
    let mut shares = share_claim(&candidates, u32::try_from(limit).unwrap_or(0), throttle);
    if shares.is_empty() {
        return Ok((Vec::new(), ClaimTx::Open));
    }
    shares.sort_by_key(|(e, _)| *e);
    let ids: Vec<Uuid> = shares.iter().map(|(e, _)| e.0).collect();
    let rate_of = |endpoint: &EndpointId| {
        rows.iter()
            .find(|r| r.col::<Uuid>(0).is_ok_and(|id| id == endpoint.0))
            .and_then(|r| r.col::<Option<i64>>(7).ok().flatten())
    };
    // Serialize with other claimers of these endpoints: the claim statement,
    // issued after the lock is granted, recounts the leases.
    let lock = t
        .prepare_cached(
            "SELECT f.endpoint_id, f.tokens, f.refilled_at FROM endpoint_flow f \
             WHERE f.endpoint_id = ANY($1) ORDER BY f.endpoint_id FOR UPDATE",
        )
        .await
        .db()?;
    let claim = t.prepare_cached(&claim_statement()).await.db()?;
    let limited = shares.iter().any(|(e, _)| rate_of(e).is_some());
    // Without a rate limit the lock's answer changes nothing in the claim:
    // the lock, the claim and the commit go out together (pipelined; the
    // server runs the claim once the lock is granted, in a snapshot taken
    // then, and commits right after it), so the lock is held for the claim
    // statement alone, never for a round trip to this process, and replicas
    // queue on it that much less. With one, the buckets are read under the
    // lock first.
    let locked = if limited {
        t.query(&lock, &[&ids]).await.db()?
    } else {
        Vec::new()
    };
    let wanted = cut_shares(t, &shares, &candidates, rate_of, &locked);
    if wanted.is_empty() {
        return Ok((Vec::new(), ClaimTx::Open));
    }
    let endpoints: Vec<Uuid> = wanted.iter().map(|w| w.0).collect();
    let counts: Vec<i64> = wanted.iter().map(|w| w.1).collect();
    let heads: Vec<Option<i64>> = wanted.iter().map(|w| w.2).collect();
    let caps: Vec<i64> = wanted.iter().map(|w| w.3).collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
        &now_ms, &endpoints, &expires, &worker, &counts, &heads, &caps,
    ];
    let rows = if limited {
        t.query(&claim, &params).await.db()?
    } else {
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (_, rows, ()) = futures::try_join!(
            t.query(&lock, &lock_params),
            t.query(&claim, &params),
            t.batch_execute("COMMIT")
        )
        .db()?;
        let claimed = rows
            .iter()
            .map(|r| row_to_claimed(r, false))
            .collect::<StoreResult<Vec<_>>>()?;
        return Ok((claimed, ClaimTx::Committed));
    };
    let claimed = rows
        .iter()
        .map(|r| row_to_claimed(r, false))
        .collect::<StoreResult<Vec<_>>>()?;
    spend_buckets(t, &wanted, &claimed).await?;
    Ok((claimed, ClaimTx::Open))
}

/// The flows with due work (`FLOW_CANDIDATES`' rows, and what
/// `flow::share_claim` reads of each). With `begin`, the transaction's
/// `BEGIN` goes out pipelined with the query: one round trip for both.
async fn flow_candidates(
    t: &Tx<'_>,
    limit: i64,
    throttle: &Throttle,
    begin: Option<&str>,
) -> StoreResult<(Vec<Row>, Vec<FlowCandidate>)> {
    // Prepared once per connection: planning this union of lateral scans
    // costs about as much as running it.
    let candidates_sql = t.prepare_cached(FLOW_CANDIDATES).await.db()?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&t.now.as_millis(), &limit];
    let rows = match begin {
        Some(begin) => {
            let ((), rows) =
                futures::try_join!(t.batch_execute(begin), t.query(&candidates_sql, &params))
                    .db()?;
            rows
        }
        None => t.query(&candidates_sql, &params).await.db()?,
    };
    let mut candidates = Vec::with_capacity(rows.len());
    for r in &rows {
        let rate: Option<i64> = r.col(7)?;
        let stored = RateBudget::stored(r.col(8)?, r.col(9)?);
        let budget = rate.map(|rate| RateBudget::refilled(stored, u32_of(rate), t.now));
        let endpoint = r.col(0)?;
        candidates.push(FlowCandidate {
            endpoint,
            account: r.col(1)?,
            oldest: (r.col(2)?, r.col(3)?),
            due: r.col(4)?,
            in_flight: r.col(5)?,
            cap: throttle.cap(
                endpoint,
                t.options.cap_of(r.col::<Option<i64>>(6)?.map(u32_of)),
            ),
            rate_room: budget.map(|b| b.whole()),
            ordered: r.col(10)?,
        });
    }
    Ok((rows, candidates))
}

/// What a claim asks of one endpoint: (endpoint, count, head of an ordered
/// one, cap, refilled bucket).
type Want = (Uuid, i64, Option<i64>, i64, Option<RateBudget>);

/// Each share cut to the room rule, with the buckets the lock shows
/// (`locked`; none without a rate limit) refilled to `t.now`.
fn cut_shares(
    t: &Tx<'_>,
    shares: &[(EndpointId, u32)],
    candidates: &[FlowCandidate],
    rate_of: impl Fn(&EndpointId) -> Option<i64>,
    locked: &[Row],
) -> Vec<Want> {
    let mut wanted: Vec<Want> = Vec::new();
    for (endpoint, share) in shares {
        let Some(c) = candidates.iter().find(|c| c.endpoint == *endpoint) else {
            continue;
        };
        let budget = rate_of(endpoint).map(|rate| {
            let stored = locked
                .iter()
                .find(|r| r.col::<Uuid>(0).is_ok_and(|id| id == endpoint.0))
                .and_then(|r| RateBudget::stored(r.col(1).ok().flatten(), r.col(2).ok().flatten()));
            RateBudget::refilled(stored, u32_of(rate), t.now)
        });
        let now_seen = FlowCandidate {
            rate_room: budget.map(|b| b.whole()),
            ..c.clone()
        };
        let n = (*share).min(now_seen.room());
        if n > 0 {
            // An ordered endpoint has one delivery in flight at most.
            let cap = if c.ordered { 1 } else { c.cap };
            wanted.push((
                endpoint.0,
                i64::from(n),
                c.ordered.then_some(c.oldest.1),
                i64::from(cap),
                budget,
            ));
        }
    }
    wanted
}

/// Spends one token per claimed delivery from each rate-limited endpoint's
/// bucket, under the flow-row lock the claim holds.
async fn spend_buckets(
    t: &Tx<'_>,
    wanted: &[Want],
    claimed: &[ClaimedDelivery],
) -> StoreResult<()> {
    for (endpoint, _, _, _, budget) in wanted {
        let Some(b) = budget else { continue };
        let taken = claimed
            .iter()
            .filter(|c| c.delivery.endpoint_id.0 == *endpoint)
            .count();
        let left = b.spend(u32::try_from(taken).unwrap_or(u32::MAX));
        t.execute(
            "UPDATE endpoint_flow SET tokens = $1, refilled_at = $2 WHERE endpoint_id = $3",
            &[&left.tokens, &left.at.as_millis(), endpoint],
        )
        .await
        .db()?;
    }
    Ok(())
}

/// A claimed delivery as stored: its secrets are opened by the claim's end
/// ([`SecretKeys::open_claimed`]).
pub(super) fn row_to_claimed(r: &Row, probe: bool) -> StoreResult<ClaimedDelivery> {
    let delivery = row_to_delivery(r)?;
    let secrets = SigningSecrets {
        current: r.col(16)?,
        previous: r.col(17)?,
        previous_expires_at: r.col(18)?,
    };
    Ok(ClaimedDelivery {
        lease: Lease {
            delivery_id: delivery.id,
            token: r.col(19)?,
            attempt: delivery.attempts,
            expires_at: delivery.lease_expires_at.unwrap_or(delivery.due_at),
        },
        delivery,
        event_type: r.col(13)?,
        body: r.col(14)?,
        url: r.col(15)?,
        secrets,
        headers: r.col(20)?,
        probe,
        traceparent: r
            .col::<Option<String>>(21)?
            .and_then(|t| TraceParent::parse(&t)),
        oauth2: r.col(22)?,
        retry: EndpointRetry::from_stored(r.col::<Option<String>>(23)?.as_deref(), r.col(24)?)?,
        client_tls: r.col(25)?,
        transform: r.col::<Option<String>>(26)?.map(Transform::stored),
    })
}

/// A claim in a transaction it begins on the connection of `t`, with
/// [`CLAIM_SETTINGS`]; says whether it committed that transaction itself
/// (see [`claim_fair`]).
pub(super) async fn claim(
    t: &Tx<'_>,
    req: ClaimRequest,
) -> StoreResult<(Vec<ClaimedDelivery>, ClaimTx)> {
    let begin = format!("BEGIN; {CLAIM_SETTINGS}");
    // Every few hundred milliseconds: free expired leases, then probes
    // first. Otherwise the fair claim is the first statement, and the
    // `BEGIN` goes out with it (one round trip less per claim).
    let housekeeping = t.housekeeping.due(t.now);
    if housekeeping {
        t.batch_execute(&begin).await.db()?;
        sweep_expired(t).await?;
    }
    let now_ms = t.now.as_millis();
    let expires = t.now.plus(req.lease_for()).as_millis();
    let mut out = Vec::new();

    // Probes first. Locking the circuit row (skipping locked ones) makes
    // exactly one replica the prober of each endpoint.
    let open = if housekeeping {
        t.query(
            "SELECT endpoint_id FROM circuits WHERE mode = 'open' AND open_until <= $1 FOR UPDATE SKIP LOCKED",
            &[&now_ms],
        )
        .await
        .db()?
    } else {
        Vec::new()
    };
    if !open.is_empty() {
        // (due_at, seq, endpoint)
        let mut candidates: Vec<(i64, i64, Uuid)> = Vec::new();
        for r in &open {
            let endpoint_id: Uuid = r.col(0)?;
            let found = t
                .query_opt(PROBE_CANDIDATE, &[&now_ms, &endpoint_id])
                .await
                .db()?;
            if let Some(f) = found {
                candidates.push((f.col(1)?, f.col(0)?, endpoint_id));
            }
        }
        candidates.sort();
        candidates.truncate(req.limit() as usize);
        for (_, seq, endpoint_id) in candidates {
            let rows = t
                .query(
                    &format!(
                        "WITH c AS (SELECT {SENDER_COLS} FROM delivery_queue x {SENDER_JOINS} \
                         WHERE x.endpoint_id = $2 AND x.seq = $5) {LEASE_AND_RETURN}"
                    ),
                    &[&now_ms, &endpoint_id, &expires, &req.worker(), &seq],
                )
                .await
                .db()?;
            for r in &rows {
                let claimed = row_to_claimed(r, true)?;
                let mut c = endpoint::load_circuit(t, EndpointId(endpoint_id), false).await?;
                c.start_probe(claimed.delivery.id);
                endpoint::save_circuit(t, EndpointId(endpoint_id), &c).await?;
                out.push(claimed);
            }
        }
    }

    let rest = i64::from(req.limit()) - out.len() as i64;
    let mut state = ClaimTx::Open;
    if rest > 0 {
        let begin = (!housekeeping).then_some(begin.as_str());
        let (fair, fair_state) = claim_fair(t, rest, expires, &req, begin).await?;
        out.extend(fair);
        state = fair_state;
    }
    out.sort_by_key(|c| (c.delivery.due_at, c.delivery.seq));
    Ok((t.keys.open_claimed(out), state))
}
