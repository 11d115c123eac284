-- After a round of the minimal queue (with or without attempt rows): no job
-- is left leased, and with attempt rows each deleted job has exactly one.
-- psql variables: backlog, attempts (1 when the shape writes attempt rows),
-- handed to the block as settings (psql does not expand them inside it).
SELECT set_config('gate.backlog', :'backlog', false), set_config('gate.attempts', :'attempts', false) \g /dev/null
DO $$
DECLARE gone bigint; leased bigint; attempted bigint; distinct_ids bigint;
BEGIN
  SELECT current_setting('gate.backlog')::bigint - count(*), count(*) FILTER (WHERE locked_until > now()) INTO gone, leased FROM jobs;
  SELECT count(*), count(DISTINCT seq) INTO attempted, distinct_ids FROM attempts;
  IF leased <> 0 OR (current_setting('gate.attempts') = '1' AND (attempted <> gone OR distinct_ids <> gone))
     OR (current_setting('gate.attempts') = '0' AND attempted <> 0) THEN
    RAISE EXCEPTION 'minimal: % deleted, % leased, % attempts (% distinct)', gone, leased, attempted, distinct_ids;
  END IF;
END $$;
SELECT 'drained', :backlog - count(*) FROM jobs;
