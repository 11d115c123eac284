-- PgQ itself (Debian's postgresql-15-pgq3), shaped like the other runs:
-- one queue per endpoint with one consumer each, the backlog appended in
-- transactions of :n events with a tick after each, so that every batch a
-- consumer takes is one claim of :n. PgQ appends events once, keeps a cursor
-- (the last tick) per consumer and finishes a batch whole.
-- psql variables: endpoints, backlog, n.
CREATE EXTENSION IF NOT EXISTS pgq;
SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue WHERE queue_name LIKE 'gate_q_%' \g /dev/null
SELECT pgq.create_queue('gate_q_' || e), pgq.set_queue_config('gate_q_' || e, 'ticker_max_count', '1'),
       pgq.register_consumer('gate_q_' || e, 'gate')
  FROM generate_series(1, :endpoints) e \g /dev/null
SELECT set_config('gate.endpoints', :'endpoints', false), set_config('gate.backlog', :'backlog', false),
       set_config('gate.n', :'n', false) \g /dev/null
-- A tick only sees committed events, so each chunk commits before its tick.
DO $$
DECLARE e int; left_ bigint; chunk int := current_setting('gate.n')::int;
        endpoints int := current_setting('gate.endpoints')::int;
BEGIN
  FOR e IN 1 .. endpoints LOOP
    left_ := current_setting('gate.backlog')::bigint / endpoints;
    WHILE left_ > 0 LOOP
      PERFORM count(pgq.insert_event('gate_q_' || e, 'noop', '{}')) FROM generate_series(1, least(chunk, left_));
      COMMIT;
      PERFORM pgq.ticker('gate_q_' || e);
      COMMIT;
      left_ := left_ - chunk;
    END LOOP;
  END LOOP;
END $$;
-- Statistics, as for every other shape after its prefill: without them the
-- planner joins PgQ's tick table to itself by scanning it, which cost
-- 0.3 s per batch under 16 clients.
ANALYZE pgq.tick;
ANALYZE pgq.subscription;
ANALYZE pgq.queue;
ANALYZE pgq.consumer;
