-- The minimal queue, as crates/bench's minimal_queue builds it: one table,
-- no endpoints, no accounts, no attempt log. psql variables: backlog.
CREATE TABLE jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL,
                   locked_until timestamptz NOT NULL DEFAULT '-infinity');
INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, :backlog);

-- The attempt log of "minimal + attempt row" (unused by the bare minimal
-- queue): the same table as the log shape's, so that the two pay for the
-- same row. A job's id stands where the log has (endpoint, sequence).
CREATE TABLE attempts (endpoint_id int NOT NULL, seq bigint NOT NULL, attempt int NOT NULL,
                       result text NOT NULL, status_code int, latency_ms int NOT NULL,
                       recorded_at timestamptz NOT NULL);
CREATE INDEX attempts_by_delivery ON attempts (endpoint_id, seq);
CREATE INDEX attempts_age ON attempts USING brin (recorded_at);
ANALYZE jobs, attempts;
