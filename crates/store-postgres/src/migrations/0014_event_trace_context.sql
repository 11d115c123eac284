-- Version 14: the W3C trace context of a publish (README: Tracing), kept
-- with its event and sent on every delivery of it. A nullable column with no
-- default: PostgreSQL adds it to the catalogue only, without rewriting the
-- table, so the migration holds its lock on `events` for milliseconds.
ALTER TABLE events ADD COLUMN traceparent text;
