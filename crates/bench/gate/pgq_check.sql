-- After a round of PgQ: no batch left open; prints the events consumed
-- (the backlog less what each consumer has not reached).
-- psql variable: backlog.
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pgq.get_consumer_info() WHERE queue_name LIKE 'gate_q_%' AND current_batch IS NOT NULL)
  THEN RAISE EXCEPTION 'pgq: a batch was left open'; END IF;
END $$;
SELECT 'drained', :backlog - sum(pending_events) FROM pgq.get_consumer_info() WHERE queue_name LIKE 'gate_q_%';
