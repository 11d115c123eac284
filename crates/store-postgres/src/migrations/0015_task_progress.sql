-- Version 15: what a running task's handler last reported (a recovery's
-- counts and where it has got to), stored with its heartbeats. A nullable
-- column with no default: added to the catalogue only, without rewriting
-- `tasks`.
ALTER TABLE tasks ADD COLUMN progress jsonb;
