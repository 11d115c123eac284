-- Version 18: examples are marked (issue 57). `send-example` publishes an
-- event to one endpoint; the mark keeps a recovery of another endpoint
-- subscribed to its type from delivering it there. A constant default:
-- no table rewrite.
ALTER TABLE events ADD COLUMN example boolean NOT NULL DEFAULT false;
