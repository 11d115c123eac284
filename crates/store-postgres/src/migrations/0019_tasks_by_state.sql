-- Version 19: an account's pending and running tasks listed by state
-- (GET .../tasks?state=..., issue 57), newest first, from an index of the
-- live ones only; dead letters already have `tasks_dead`, and completed
-- ones are not listed.
CREATE INDEX tasks_live_by_account ON tasks (account, state, seq DESC)
    WHERE state IN ('pending', 'leased');
