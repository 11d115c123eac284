-- The delivery log: each endpoint reads an append-only log of its own
-- deliveries through a cursor. Nothing is updated or deleted per delivery:
-- a claim hands out a range of the log under the endpoint's flow row and
-- writes one batch-lease row; an outcome appends one attempt row per
-- delivery and moves the cursor once per batch. Failed deliveries leave the
-- log for a retry table, dead ones for a dead table. Space comes back by
-- dropping whole time partitions of the log (rotate_log below).
-- psql variables: endpoints, backlog, slots (time partitions the backlog
-- was appended over), cap (each endpoint's in-flight cap).

-- Event bodies, stored once however many endpoints receive them.
CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);

-- One row per endpoint: where its log ends, how far ranges were handed out,
-- and the cursor. A claim and an outcome each write this row once per
-- batch, which is where claimers of one endpoint take turns.
CREATE TABLE flow (
  endpoint_id int PRIMARY KEY,
  head bigint NOT NULL DEFAULT 0,      -- the last sequence number appended
  claimed bigint NOT NULL DEFAULT 0,   -- ranges are handed out up to here
  acked bigint NOT NULL DEFAULT 0,     -- the cursor: every delivery up to here has left the log
  done_lo bigint[] NOT NULL DEFAULT '{}', -- ranges answered ahead of the cursor,
  done_hi bigint[] NOT NULL DEFAULT '{}', -- waiting for the ones before them
  acked_at timestamptz NOT NULL DEFAULT now(), -- when the cursor last moved
  in_flight int NOT NULL DEFAULT 0,    -- deliveries leased now: the cap is checked against this
  cap int NOT NULL,
  next_retry_at timestamptz,           -- the earliest due time in the retry table
  turn bigint NOT NULL DEFAULT 0       -- claims go to the endpoint served least recently
);
CREATE SEQUENCE turns;

-- The log, partitioned by the time slot a delivery was appended in. Slot 0
-- holds the rows that rotation moved aside (log_held): they keep their
-- sequence numbers, and the claim reads them through the same parent.
CREATE TABLE log (slot int NOT NULL, endpoint_id int NOT NULL, seq bigint NOT NULL, event_id bigint NOT NULL)
  PARTITION BY RANGE (slot);
CREATE INDEX log_range ON log (endpoint_id, seq);
CREATE TABLE log_held PARTITION OF log FOR VALUES FROM (0) TO (1);
CREATE TABLE log_slots (slot int PRIMARY KEY);

-- A batch lease: a range of one endpoint's log plus the due retries it took.
-- Its token fences the outcome; a lease that expires is handed out again
-- whole (not exercised by the drain).
CREATE TABLE lease (
  token uuid PRIMARY KEY,
  endpoint_id int NOT NULL,
  lo bigint NOT NULL,
  hi bigint NOT NULL,
  retry_seqs bigint[] NOT NULL,
  retry_attempts int[] NOT NULL,
  expires_at timestamptz NOT NULL
);

-- Failed deliveries wait here for their due time; dead ones end here.
CREATE TABLE retry (endpoint_id int NOT NULL, seq bigint NOT NULL, attempts int NOT NULL,
                    due_at timestamptz NOT NULL, PRIMARY KEY (endpoint_id, seq));
CREATE INDEX retry_due ON retry (endpoint_id, due_at);
CREATE TABLE dead (endpoint_id int NOT NULL, seq bigint NOT NULL, attempts int NOT NULL,
                   died_at timestamptz NOT NULL, PRIMARY KEY (endpoint_id, seq));

-- The attempt log: a delivery is (endpoint, sequence number), so one index
-- serves both its attempts and its endpoint's.
CREATE TABLE attempts (endpoint_id int NOT NULL, seq bigint NOT NULL, attempt int NOT NULL,
                       result text NOT NULL, status_code int, latency_ms int NOT NULL,
                       recorded_at timestamptz NOT NULL);
CREATE INDEX attempts_by_delivery ON attempts (endpoint_id, seq);
CREATE INDEX attempts_age ON attempts USING brin (recorded_at);

-- The cursor after a batch [lo, hi] was answered: it moves past the batch if
-- the batch starts right after it (and past any batches answered earlier
-- that now follow on); otherwise the batch waits in done_lo/done_hi. Called
-- inside the outcome's UPDATE of the flow row, so it sees that row's latest
-- version even when another outcome of the endpoint committed meanwhile.
CREATE FUNCTION advance(acked bigint, los bigint[], his bigint[], lo bigint, hi bigint,
                        OUT new_acked bigint, OUT new_los bigint[], OUT new_his bigint[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE i int;
BEGIN
  new_acked := acked; new_los := los; new_his := his;
  IF hi < lo THEN RETURN; END IF;           -- a batch of retries only: the cursor is past them
  IF lo <> acked + 1 THEN
    new_los := los || lo; new_his := his || hi;
    RETURN;
  END IF;
  new_acked := hi;
  LOOP
    i := array_position(new_los, new_acked + 1);
    EXIT WHEN i IS NULL;
    new_acked := new_his[i];
    new_los := new_los[:i - 1] || new_los[i + 1:];
    new_his := new_his[:i - 1] || new_his[i + 1:];
  END LOOP;
END $$;

-- Rotation: drops the oldest time partition of the log. It waits only for
-- endpoints whose cursor is moving and still inside that partition; an
-- endpoint whose cursor has not moved for stalled_after (a receiver that
-- never answers) does not hold it: its rows past its cursor are moved into
-- log_held first, keeping their sequence numbers. Their flow rows are locked
-- while they move, so no claim of those endpoints runs meanwhile.
CREATE FUNCTION rotate_log(stalled_after interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE oldest int; newest int; part text; waiting int; moved bigint;
BEGIN
  SELECT min(slot), max(slot) INTO oldest, newest FROM log_slots;
  IF oldest IS NULL OR oldest = newest THEN RETURN 'only the current slot'; END IF;
  part := 'log_' || oldest;
  EXECUTE format('SELECT count(*) FROM flow f WHERE f.acked_at > now() - $1 AND EXISTS '
                 '(SELECT 1 FROM %I p WHERE p.endpoint_id = f.endpoint_id AND p.seq > f.acked)', part)
    INTO waiting USING stalled_after;
  IF waiting > 0 THEN RETURN format('%s waits for %s moving endpoint(s)', part, waiting); END IF;
  EXECUTE format('SELECT 1 FROM flow f WHERE EXISTS (SELECT 1 FROM %I p WHERE p.endpoint_id = f.endpoint_id '
                 'AND p.seq > f.acked) ORDER BY f.endpoint_id FOR UPDATE OF f', part);
  EXECUTE format('INSERT INTO log_held (slot, endpoint_id, seq, event_id) '
                 'SELECT 0, p.endpoint_id, p.seq, p.event_id FROM %I p JOIN flow f ON f.endpoint_id = p.endpoint_id '
                 'WHERE p.seq > f.acked', part);
  GET DIAGNOSTICS moved = ROW_COUNT;
  EXECUTE format('DROP TABLE %I', part);
  DELETE FROM log_slots WHERE slot = oldest;
  RETURN format('dropped %s, %s row(s) moved aside', part, moved);
END $$;

-- Endpoints 1..:endpoints, and the backlog: :backlog deliveries, one event
-- each, endpoints taken in turn, appended over :slots time slots (1..slots),
-- then slot :slots + 1 open for new appends. Each endpoint's sequence
-- numbers run 1, 2, 3, ... in append order.
INSERT INTO flow (endpoint_id, cap) SELECT e, :cap FROM generate_series(1, :endpoints) e;
SELECT format('CREATE TABLE log_%s PARTITION OF log FOR VALUES FROM (%s) TO (%s)', s, s, s + 1)
  FROM generate_series(1, :slots + 1) s \gexec
INSERT INTO log_slots SELECT generate_series(1, :slots + 1);
INSERT INTO events (id, body) SELECT g, '{"type":"bench.event","data":{}}' FROM generate_series(1, :backlog) g;
INSERT INTO log (slot, endpoint_id, seq, event_id)
  SELECT 1 + (g - 1) * :slots / :backlog, 1 + (g - 1) % :endpoints, 1 + (g - 1) / :endpoints, g
  FROM generate_series(1, :backlog) g;
UPDATE flow f SET head = (SELECT max(seq) FROM log l WHERE l.endpoint_id = f.endpoint_id);
-- The inbox of the staged log (publish_stage.pgbench, fold.pgbench): what
-- publishers appended and no claim has folded into the log yet.
CREATE TABLE inbox (id bigserial PRIMARY KEY, endpoint_id int NOT NULL, event_id bigint NOT NULL);
CREATE INDEX inbox_by_endpoint ON inbox (endpoint_id, id);

-- The ids of events that publishers append during a drain (publish.pgbench).
CREATE SEQUENCE event_ids;
SELECT setval('event_ids', :backlog);
ANALYZE events, flow, log, attempts, retry, dead, lease, inbox;
