-- After a round of the delivery log. With no stalled endpoint: no lease is
-- left, each cursor stands where its ranges were handed out, and every
-- delivery up to a cursor was attempted from the log exactly once. In every
-- case: nothing past a cursor was attempted except inside a lease, and a
-- delivery whose last attempt failed is in the retry table (and only
-- those), one that died is in the dead table (and only those).
-- psql variable: stalled (0: none).
SELECT set_config('gate.stalled', :'stalled', false) \g /dev/null
DO $$
DECLARE stalled int := current_setting('gate.stalled')::int; bad bigint; firsts bigint; distinct_firsts bigint; cursors bigint;
BEGIN
  SELECT count(*) INTO bad FROM lease WHERE endpoint_id <> stalled;
  IF bad <> 0 THEN RAISE EXCEPTION 'log: % lease(s) left', bad; END IF;
  SELECT count(*) INTO bad FROM flow
    WHERE endpoint_id <> stalled AND (acked <> claimed OR cardinality(done_lo) > 0 OR in_flight <> 0);
  IF bad <> 0 THEN RAISE EXCEPTION 'log: % cursor(s) not where their ranges end', bad; END IF;
  SELECT count(*), count(DISTINCT (endpoint_id, seq)) INTO firsts, distinct_firsts FROM attempts WHERE attempt = 1;
  SELECT sum(acked) INTO cursors FROM flow WHERE endpoint_id <> stalled;
  IF firsts <> distinct_firsts OR firsts <> cursors THEN
    RAISE EXCEPTION 'log: % first attempts (% distinct), cursors sum to %', firsts, distinct_firsts, cursors;
  END IF;
  SELECT count(*) INTO bad FROM attempts a JOIN flow f USING (endpoint_id) WHERE a.seq > f.acked;
  IF bad <> 0 THEN RAISE EXCEPTION 'log: % attempt(s) past a cursor', bad; END IF;
  SELECT count(*) INTO bad FROM
    (SELECT DISTINCT ON (endpoint_id, seq) endpoint_id, seq, result FROM attempts
     ORDER BY endpoint_id, seq, attempt DESC) last
    FULL JOIN retry r USING (endpoint_id, seq) FULL JOIN dead d USING (endpoint_id, seq)
    WHERE (last.result = 'failed') IS DISTINCT FROM (r.seq IS NOT NULL AND d.seq IS NULL)
       OR (last.result = 'dead') IS DISTINCT FROM (d.seq IS NOT NULL AND r.seq IS NULL)
       OR last.result IS NULL;
  IF bad <> 0 THEN RAISE EXCEPTION 'log: % deliveries whose retry or dead row disagrees with their last attempt', bad; END IF;
  -- Every retry attempt follows one failure of the same delivery.
  SELECT count(*) INTO bad FROM attempts a WHERE a.attempt > 1 AND NOT EXISTS
    (SELECT 1 FROM attempts p WHERE p.endpoint_id = a.endpoint_id AND p.seq = a.seq
     AND p.attempt = a.attempt - 1 AND p.result = 'failed');
  IF bad <> 0 THEN RAISE EXCEPTION 'log: % retry attempt(s) without a failure before', bad; END IF;
END $$;
SELECT 'drained', count(*) FROM attempts;
