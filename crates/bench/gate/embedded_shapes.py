#!/usr/bin/env python3
"""Issue 73, step 3: the embedded store's write shapes in raw DuckDB SQL.

The embedded store's burn-down writes each batch of 100 deliveries with two
UPDATEs of the `deliveries` table (the claim, then the outcome) and one
INSERT of attempt rows. This drains the same backlog (one file, one DuckDB
thread, the store's table definitions) in each shape and prints
deliveries/s, so that the shapes differ only in their statements:

- today:   the store's statements: each UPDATE joins an unnest of per-row
           values (a lease token per delivery; each outcome's own state).
- wide_in: the same columns set to one value per batch, rows picked with
           `seq IN (...)` and a seq range (a lease token per batch, and a
           batch whose outcomes are all the same).
- narrow:  only `state` updated, rows picked as in wide_in.
- log:     nothing updated per delivery: a claim appends one lease row, an
           outcome appends the attempt rows, deletes the lease row and moves
           the endpoint's cursor (ADR 0044's shape).

Every shape appends the same attempt rows and commits twice per batch.

    python3 -m venv v && v/bin/pip install duckdb==1.2.0
    v/bin/python crates/bench/gate/embedded_shapes.py [backlog] [rounds]

Rounds alternate the shapes; compare within one run (medians printed).
"""
import os
import statistics
import sys
import tempfile
import time
import uuid

import duckdb

SHAPES = ["today", "wide_in", "narrow", "log"]
BATCH = 100

CLAIM_TODAY = """UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_token = c.token,
  lease_expires_at = $3, leased_by = 'w', last_outcome = NULL, updated_at = $4
  FROM (SELECT unnest($1::BIGINT[]) AS s, unnest($2::VARCHAR[]) AS token) c
  WHERE deliveries.seq = c.s AND deliveries.seq BETWEEN $5 AND $6
  AND deliveries.state = 'pending' AND deliveries.due_at <= $4"""
OUTCOME_TODAY = """UPDATE deliveries SET state = c.state, due_at = c.d, last_error = NULL,
  lease_expires_at = NULL, leased_by = NULL, lease_token = c.state, last_outcome = 'delivered', updated_at = $3
  FROM (SELECT unnest($1::BIGINT[]) AS seq, unnest($2::VARCHAR[]) AS state, unnest($1::BIGINT[]) AS d) c
  WHERE deliveries.seq = c.seq AND deliveries.seq BETWEEN $4 AND $5"""
CLAIM_WIDE = """UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_token = $4,
  lease_expires_at = $5, leased_by = 'w', last_outcome = NULL, updated_at = $6
  WHERE seq BETWEEN $1 AND $2 AND seq IN (SELECT unnest($3::BIGINT[])) AND state = 'pending' AND due_at <= $6"""
OUTCOME_WIDE = """UPDATE deliveries SET state = 'delivered', due_at = $4, last_error = NULL,
  lease_expires_at = NULL, leased_by = NULL, last_outcome = 'delivered', updated_at = $4
  WHERE seq BETWEEN $1 AND $2 AND seq IN (SELECT unnest($3::BIGINT[]))"""
SET_STATE = """UPDATE deliveries SET state = $4
  WHERE seq BETWEEN $1 AND $2 AND seq IN (SELECT unnest($3::BIGINT[]))"""
ATTEMPTS = """INSERT INTO attempts SELECT unnest($1::BIGINT[]), unnest($2::VARCHAR[]), 'ep', 'acct', 1,
  'delivered', 200, NULL, 5, false, NULL, $3"""


def setup(path, n):
    c = duckdb.connect(path)
    c.execute("SET threads = 1")
    c.execute("""CREATE TABLE deliveries (id VARCHAR PRIMARY KEY, account VARCHAR NOT NULL,
      endpoint_id VARCHAR NOT NULL, event_id VARCHAR NOT NULL, seq BIGINT NOT NULL, state VARCHAR NOT NULL,
      attempts BIGINT NOT NULL, max_attempts BIGINT NOT NULL, due_at BIGINT NOT NULL, lease_token VARCHAR,
      lease_expires_at BIGINT, leased_by VARCHAR, last_outcome VARCHAR, last_error VARCHAR,
      created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, UNIQUE (endpoint_id, event_id))""")
    c.execute("""CREATE TABLE attempts (id BIGINT PRIMARY KEY, delivery_id VARCHAR NOT NULL,
      endpoint_id VARCHAR NOT NULL, account VARCHAR NOT NULL, attempt BIGINT NOT NULL, result VARCHAR NOT NULL,
      status_code BIGINT, error VARCHAR, latency_ms BIGINT NOT NULL, will_retry BOOLEAN NOT NULL,
      next_attempt_at BIGINT, recorded_at BIGINT NOT NULL)""")
    c.execute("CREATE TABLE leases (token VARCHAR, endpoint_id VARCHAR, lo BIGINT, hi BIGINT, expires BIGINT)")
    c.execute("CREATE TABLE cursors (endpoint_id VARCHAR PRIMARY KEY, done BIGINT)")
    c.execute(f"""INSERT INTO deliveries SELECT gen_random_uuid()::VARCHAR, 'acct', 'ep0',
      gen_random_uuid()::VARCHAR, i, 'pending', 0, 8, 1, NULL, NULL, NULL, NULL, NULL, 1, 1 FROM range({n}) t(i)""")
    c.execute("INSERT INTO cursors VALUES ('ep0', -1)")
    c.execute("CHECKPOINT")
    ids = [r[0] for r in c.execute("SELECT id FROM deliveries ORDER BY seq").fetchall()]
    return c, ids


def batch(c, shape, seqs, ids, now):
    lo, hi = seqs[0], seqs[-1]
    c.execute("BEGIN")
    if shape == "today":
        tokens = [str(uuid.uuid4()) for _ in seqs]
        c.execute(CLAIM_TODAY, [seqs, tokens, now + 60000, now, lo, hi])
    elif shape == "wide_in":
        c.execute(CLAIM_WIDE, [lo, hi, seqs, str(uuid.uuid4()), now + 60000, now])
    elif shape == "narrow":
        c.execute(SET_STATE, [lo, hi, seqs, "leased"])
    else:
        c.execute("INSERT INTO leases VALUES ($1, 'ep0', $2, $3, $4)", [str(uuid.uuid4()), lo, hi, now + 60000])
    c.execute("COMMIT")
    c.execute("BEGIN")
    if shape == "today":
        c.execute(OUTCOME_TODAY, [seqs, ["delivered"] * len(seqs), now, lo, hi])
    elif shape == "wide_in":
        c.execute(OUTCOME_WIDE, [lo, hi, seqs, now])
    elif shape == "narrow":
        c.execute(SET_STATE, [lo, hi, seqs, "delivered"])
    else:
        c.execute("DELETE FROM leases WHERE lo = $1", [lo])
        c.execute("UPDATE cursors SET done = $1 WHERE endpoint_id = 'ep0'", [hi])
    c.execute(ATTEMPTS, [seqs, ids[lo:hi + 1], now])
    c.execute("COMMIT")


def drain(shape, n):
    with tempfile.TemporaryDirectory() as d:
        c, ids = setup(os.path.join(d, "s.duckdb"), n)
        start = time.time()
        for i, lo in enumerate(range(0, n, BATCH)):
            batch(c, shape, list(range(lo, min(n, lo + BATCH))), ids, 100 + i)
        rate = n / (time.time() - start)
        left = c.execute("SELECT count(*) FROM attempts").fetchone()[0]
        if left != n:
            sys.exit(f"{shape}: {left} attempt rows for {n} deliveries")
        c.close()
        return rate


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rates = {s: [] for s in SHAPES}
    for r in range(rounds):
        order = SHAPES[r % len(SHAPES):] + SHAPES[:r % len(SHAPES)]
        for shape in order:
            rates[shape].append(drain(shape, n))
            print(f"round {r + 1} {shape}: {rates[shape][-1]:.0f} deliveries/s", flush=True)
    base = statistics.median(rates["today"])
    for shape in SHAPES:
        m = statistics.median(rates[shape])
        print(f"{shape}: median {m:.0f} deliveries/s, {m / base:.2f} x today")


if __name__ == "__main__":
    main()
