-- Version 14: examples are marked (issue 57). `send-example` publishes an
-- event to one endpoint; the mark keeps a recovery of another endpoint
-- subscribed to its type from delivering it there.
ALTER TABLE events ADD COLUMN example BOOLEAN NOT NULL DEFAULT false;
