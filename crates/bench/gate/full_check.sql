-- After a round of the full path: every delivery was finished at most once,
-- each with one attempt row and one finished row, and none is left leased
-- (every claim got its outcome). Prints the deliveries drained.
DO $$
DECLARE attempted bigint; finished bigint; distinct_ids bigint; leased bigint; live bigint;
BEGIN
  SELECT count(*), count(DISTINCT delivery_id) INTO attempted, distinct_ids FROM attempts;
  SELECT count(*) INTO finished FROM delivery_done;
  SELECT count(*) FILTER (WHERE state = 'leased'), count(*) INTO leased, live FROM delivery_queue;
  IF attempted <> distinct_ids OR attempted <> finished OR leased <> 0
     OR live + finished <> (SELECT count(*) FROM deliveries) THEN
    RAISE EXCEPTION 'full: % attempts (% distinct), % finished, % leased, % live',
      attempted, distinct_ids, finished, leased, live;
  END IF;
END $$;
SELECT 'drained', count(*) FROM attempts;
