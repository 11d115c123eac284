-- Version 21: the attempt search of one account reads that account's rows
-- only (issue 72, item 9). `AttemptQuery::sql` asks `WHERE account = $1 ...
-- ORDER BY id DESC LIMIT n`; without this index PostgreSQL walked every
-- tenant's attempts newest first, so a small account's search cost what
-- the largest account had written (92 ms against 1.8 ms at 2,000,000
-- attempts of another account). One more index entry per attempt written.
CREATE INDEX IF NOT EXISTS attempts_by_account ON attempts (account, id DESC);
