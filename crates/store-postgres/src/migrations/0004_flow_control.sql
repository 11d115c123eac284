-- Version 4: flow control at claim (ADR 0009). An endpoint's in-flight cap
-- (NULL: the service default); one flow row per endpoint holds its rate-limit
-- token bucket and is the lock that serializes claims of that endpoint across
-- replicas, so caps and budgets hold. Claims now go endpoint by endpoint.
ALTER TABLE endpoints ADD COLUMN max_in_flight bigint;
CREATE TABLE endpoint_flow (
    endpoint_id uuid PRIMARY KEY REFERENCES endpoints (id),
    tokens      double precision,
    refilled_at bigint
);
INSERT INTO endpoint_flow (endpoint_id) SELECT id FROM endpoints;
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due_by_endpoint ON deliveries (endpoint_id, due_at, seq) WHERE state = 'pending';
CREATE INDEX deliveries_leased_by_endpoint ON deliveries (endpoint_id, lease_expires_at) WHERE state = 'leased';
