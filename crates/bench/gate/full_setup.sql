-- The full path: today's store schema (run.sh applies the migrations of
-- crates/store-postgres into this schema first), with :endpoints endpoints of
-- one account and a backlog of :backlog pending deliveries spread over them
-- in turn, written the way crates/bench's pg_prefill writes one endpoint's.
-- psql variables: endpoints, backlog, now (ms).

INSERT INTO endpoints (id, account, url, secret, event_types, enabled, ordered, created_at, updated_at,
                       max_in_flight)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(e), 12, '0'))::uuid, 'bench',
       'http://127.0.0.1:9/hook', 'sealed', '[]', true, false, :now, :now, 10000
FROM generate_series(1, :endpoints) e;
INSERT INTO circuits (endpoint_id, mode, failures, reopen_count) SELECT id, 'closed', 0, 0 FROM endpoints;
INSERT INTO endpoint_flow (endpoint_id) SELECT id FROM endpoints;

-- Events and their deliveries, one each, endpoints taken in turn so that the
-- sequence numbers interleave as concurrent publishes would.
WITH g AS (SELECT (lpad(to_hex(:now::bigint), 12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid AS id,
                  ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % :endpoints), 12, '0'))::uuid AS endpoint_id
           FROM generate_series(1, :backlog::bigint) g),
ev AS (INSERT INTO events (id, account, event_type, body, idempotency_key, created_at)
       SELECT id, 'bench', 'bench.event', '{"type":"bench.event","data":{}}', NULL, :now FROM g ORDER BY id
       RETURNING id),
d AS (INSERT INTO deliveries (id, account, endpoint_id, event_id, seq, created_at)
      SELECT ev.id, 'bench', g.endpoint_id, ev.id, nextval('delivery_seq'), :now FROM ev JOIN g ON g.id = ev.id
      ORDER BY ev.id
      RETURNING id, endpoint_id, seq)
INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts,
                            due_at, updated_at)
SELECT endpoint_id, seq, id, 'bench', 'pending', 0, 8, :now, :now FROM d;

ANALYZE events, deliveries, delivery_queue, endpoints, circuits, endpoint_flow;
