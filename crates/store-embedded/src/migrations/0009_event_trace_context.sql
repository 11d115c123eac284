-- Version 9: the W3C trace context of a publish (README: Tracing), kept
-- with its event and sent on every delivery of it; NULL when the publish
-- carried none.
ALTER TABLE events ADD COLUMN traceparent VARCHAR;
