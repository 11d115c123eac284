-- Version 7: operators list an account's events newest first.
CREATE INDEX events_by_account ON events (account, created_at DESC, id DESC);
