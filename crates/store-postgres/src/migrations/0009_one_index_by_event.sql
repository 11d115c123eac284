-- Every new version of a delivery row (insert, claim, outcome) adds an entry
-- to each of its indexes, and two of them were keyed by the random event id:
-- UNIQUE (endpoint_id, event_id) and deliveries_by_event. One unique index
-- led by the event id serves both (ADR 0018): the conflict target of a
-- publish (ON CONFLICT finds a unique index by its set of columns, in any
-- order), an event's deliveries, and retention's "no delivery refers to this
-- event". Dead deliveries by endpoint (bulk replay, retention of a deleted
-- endpoint's dead ones) get a partial index: rows enter it when they die.
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_endpoint_id_event_id_key;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_event_endpoint_key UNIQUE (event_id, endpoint_id);
DROP INDEX IF EXISTS deliveries_by_event;
CREATE INDEX deliveries_dead_by_endpoint ON deliveries (account, endpoint_id) WHERE state = 'dead';
