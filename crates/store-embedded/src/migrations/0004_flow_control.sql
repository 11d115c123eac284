-- Version 4: flow control at claim (ADR 0009): an endpoint's in-flight cap
-- (NULL: the service default) and its rate-limit token bucket.
ALTER TABLE endpoints ADD COLUMN max_in_flight BIGINT;
ALTER TABLE endpoints ADD COLUMN budget_tokens DOUBLE;
ALTER TABLE endpoints ADD COLUMN budget_at BIGINT;
