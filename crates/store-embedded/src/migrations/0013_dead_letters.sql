-- Version 13: the dead letters (ADR 0032). A copy of every dead delivery's
-- row, so that the dead-letter page is a top-N of the dead deliveries of an
-- account instead of the whole history (1 % dead means a scan of 100 rows
-- per dead letter shown). A dead row does not change until it is revived
-- (replay, resend) or purged, and each of those deletes its copy in the same
-- transaction, as an outcome, a lease expiry or an endpoint's removal that
-- makes a delivery dead inserts it. No index: the writer keeps each
-- account's dead seqs in memory and reads a page as a range of seqs, which
-- DuckDB bounds by its zone maps.
CREATE TABLE dead_letters (
    account          VARCHAR NOT NULL,
    seq              BIGINT NOT NULL,
    id               VARCHAR NOT NULL,
    endpoint_id      VARCHAR NOT NULL,
    event_id         VARCHAR NOT NULL,
    attempts         BIGINT NOT NULL,
    max_attempts     BIGINT NOT NULL,
    due_at           BIGINT NOT NULL,
    lease_expires_at BIGINT,
    last_error       VARCHAR,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);

INSERT INTO dead_letters (account, seq, id, endpoint_id, event_id, attempts, max_attempts, due_at,
                          lease_expires_at, last_error, created_at, updated_at)
SELECT account, seq, id, endpoint_id, event_id, attempts, max_attempts, due_at,
       lease_expires_at, last_error, created_at, updated_at
FROM deliveries WHERE state = 'dead' ORDER BY seq;
