-- Version 10: what a running task's handler last reported (a recovery's
-- counts and where it has got to), stored with its heartbeats; JSON text.
ALTER TABLE tasks ADD COLUMN progress VARCHAR;
