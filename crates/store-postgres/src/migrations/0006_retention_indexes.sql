-- Version 6: retention covers every table. Each purge takes the oldest rows
-- of its table, so each table gets an index on the age it is purged by (the
-- embedded store scans columns instead: DuckDB needs no index for this).
CREATE INDEX events_age ON events (created_at);
CREATE INDEX tasks_completed_age ON tasks (updated_at) WHERE state = 'completed';
CREATE INDEX alerts_age ON alerts (created_at);
CREATE INDEX usage_counters_window ON usage_counters (window_start);
CREATE INDEX usage_batches_age ON usage_batches (recorded_at);
