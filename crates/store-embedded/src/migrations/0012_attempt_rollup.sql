-- Version 12: the attempt rollup the stats pages read instead of the attempt
-- log (ADR 0032): attempts per endpoint, minute, result and latency bucket,
-- appended with every write of attempt rows and folded per key by
-- maintenance. Kept 25 hours. No index: DuckDB scans it by zone maps, and it
-- holds a row per key and minute, not a row per attempt.
CREATE TABLE attempt_rollup (
    endpoint_id VARCHAR NOT NULL,
    minute BIGINT NOT NULL,
    result VARCHAR NOT NULL,
    bucket BIGINT NOT NULL,
    n BIGINT NOT NULL
);

-- The last day of the attempt log, rolled up once here. The values are the
-- upper bounds of buckets 0 to 62 (control_plane_core::latency_bucket_bound;
-- a test checks they agree): a latency's bucket is how many bounds lie below it.
INSERT INTO attempt_rollup (endpoint_id, minute, result, bucket, n)
SELECT endpoint_id, minute, result, bucket, count(*) FROM (
    SELECT a.endpoint_id, a.recorded_at - a.recorded_at % 60000 AS minute, a.result,
           CASE WHEN a.result = 'lease_expired' THEN 0
                ELSE (SELECT count(*) FROM (VALUES (1),(2),(3),(4),(5),(7),(9),(12),(15),(19),(24),(30),(38),(48),(60),(75),(94),(118),(148),(185),(232),(290),(363),(454),(568),(710),(888),(1110),(1388),(1735),(2169),(2712),(3390),(4238),(5298),(6623),(8279),(10349),(12937),(16172),(20215),(25269),(31587),(39484),(49355),(61694),(77118),(96398),(120498),(150623),(188279),(235349),(294187),(367734),(459668),(574585),(718232),(897790),(1122238),(1402798),(1753498),(2191873),(2739842)) AS b(v) WHERE b.v < a.latency_ms) END AS bucket
    FROM attempts a
    WHERE a.recorded_at >= (SELECT coalesce(max(recorded_at), 0) FROM attempts) - 25 * 3600 * 1000
) r
GROUP BY endpoint_id, minute, result, bucket;
