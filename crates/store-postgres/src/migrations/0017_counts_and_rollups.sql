-- Version 17: reads whose cost does not grow with the history (ADR 0032).
--
-- delivery_tallies: how many finished deliveries (delivered, dead) each
-- account has, as signed deltas appended by every statement that moves a
-- delivery into or out of delivery_done (one row per account and state per
-- statement, never an update of a shared row, so writers do not queue on
-- it), folded into one row per account and state by maintenance. Live
-- states are counted from delivery_queue, which holds only live rows.
CREATE TABLE delivery_tallies (
    account text NOT NULL,
    state text NOT NULL CHECK (state IN ('delivered', 'dead')),
    n bigint NOT NULL
);

INSERT INTO delivery_tallies (account, state, n)
SELECT d.account, x.state, count(*)
FROM delivery_done x JOIN deliveries d ON d.id = x.delivery_id
GROUP BY d.account, x.state;

-- A dead delivery's account and sequence number on its finished row, so that
-- the dead letters of an account page by keyset from a partial index instead
-- of walking the account's whole history (1 % dead means a walk of 100 rows
-- per row shown). Only dead rows carry them: a delivered row is written
-- without them, as before.
ALTER TABLE delivery_done ADD COLUMN account text, ADD COLUMN seq bigint;
UPDATE delivery_done x SET account = d.account, seq = d.seq
FROM deliveries d WHERE x.state = 'dead' AND d.id = x.delivery_id;
CREATE INDEX delivery_done_dead_by_account ON delivery_done (account, seq DESC) WHERE state = 'dead';

-- attempt_rollup: attempts per endpoint, minute, result and latency bucket,
-- appended with every attempt row and folded per key by maintenance; the
-- stats pages sum it instead of the attempt log. Kept 25 hours.
CREATE TABLE attempt_rollup (
    endpoint_id uuid NOT NULL,
    minute bigint NOT NULL,
    result text NOT NULL,
    bucket smallint NOT NULL,
    n bigint NOT NULL
);
CREATE INDEX attempt_rollup_by_endpoint ON attempt_rollup (endpoint_id, minute);
CREATE INDEX attempt_rollup_age ON attempt_rollup USING brin (minute);

-- The last day of the attempt log, rolled up once here. The array holds the
-- upper bounds of buckets 0 to 62 (control_plane_core::latency_bucket_bound;
-- a test checks they agree): a latency's bucket is how many bounds lie below it.
INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n)
SELECT endpoint_id, recorded_at - recorded_at % 60000, result,
       CASE WHEN result = 'lease_expired' THEN 0
            ELSE width_bucket(latency_ms - 1, ARRAY[1,2,3,4,5,7,9,12,15,19,24,30,38,48,60,75,94,118,148,185,232,290,363,454,568,710,888,1110,1388,1735,2169,2712,3390,4238,5298,6623,8279,10349,12937,16172,20215,25269,31587,39484,49355,61694,77118,96398,120498,150623,188279,235349,294187,367734,459668,574585,718232,897790,1122238,1402798,1753498,2191873,2739842]::bigint[]) END,
       count(*)
FROM attempts
WHERE recorded_at >= (SELECT coalesce(max(recorded_at), 0) FROM attempts) - 25 * 3600 * 1000
GROUP BY 1, 2, 3, 4;
