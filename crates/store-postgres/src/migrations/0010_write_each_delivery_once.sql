-- Version 10: each delivery is written once (ADR 0020). The wide delivery
-- row was updated at claim and at completion, and every new version of it
-- went into every one of its indexes. Now:
-- * deliveries keeps what never changes (id, account, endpoint, event,
--   sequence number, creation time) and is never updated;
-- * delivery_queue holds a narrow live row while a delivery is pending or
--   leased: claims update it, a retry moves its due time, success and death
--   delete it. Its key is (endpoint, seq), which also gives an ordered
--   endpoint's head; two partial indexes serve the claim and the expiry
--   sweep;
-- * delivery_done holds a finished delivery's state (delivered or dead),
--   inserted once when the live row is deleted;
-- * attempts lose their primary key (nothing looks a row up by it) and are
--   aged out through a BRIN index instead of a B-tree.
-- Moving an existing database copies the live rows and the finished ones
-- once (about 8 s per million deliveries on 2 busy cores); dropping columns
-- only changes the catalogue. The tables are locked first, so that nothing
-- written meanwhile by a replica of the previous version is left behind.
LOCK TABLE deliveries, attempts, events IN ACCESS EXCLUSIVE MODE;

CREATE TABLE delivery_queue (
    endpoint_id      uuid NOT NULL,
    seq              bigint NOT NULL,
    delivery_id      uuid NOT NULL,
    account          text NOT NULL,
    state            text NOT NULL,
    attempts         bigint NOT NULL,
    max_attempts     bigint NOT NULL,
    due_at           bigint NOT NULL,
    lease_token      uuid,
    lease_expires_at bigint,
    leased_by        text,
    last_outcome     text,
    last_error       text,
    updated_at       bigint NOT NULL,
    PRIMARY KEY (endpoint_id, seq)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01);
-- The claim: each endpoint's due deliveries, oldest first.
CREATE INDEX delivery_queue_due ON delivery_queue (endpoint_id, due_at, seq) WHERE state = 'pending';
-- Live leases per endpoint (the cap), and the expiry sweep.
CREATE INDEX delivery_queue_leased ON delivery_queue (endpoint_id, lease_expires_at) WHERE state = 'leased';

CREATE TABLE delivery_done (
    delivery_id  uuid PRIMARY KEY,
    state        text NOT NULL,
    attempts     bigint NOT NULL,
    max_attempts bigint NOT NULL,
    due_at       bigint NOT NULL,
    last_error   text,
    lease_token  uuid,
    last_outcome text,
    finished_at  bigint NOT NULL
);
-- Dead letters: bulk replay and their retention.
CREATE INDEX delivery_done_dead ON delivery_done (finished_at) WHERE state = 'dead';
-- Retention of delivered ones: rows arrive in about the order they finish.
CREATE INDEX delivery_done_age ON delivery_done USING brin (finished_at);

INSERT INTO delivery_queue (endpoint_id, seq, delivery_id, account, state, attempts, max_attempts, due_at,
                            lease_token, lease_expires_at, leased_by, last_outcome, last_error, updated_at)
SELECT endpoint_id, seq, id, account, state, attempts, max_attempts, due_at,
       lease_token, lease_expires_at, leased_by, last_outcome, last_error, updated_at
FROM deliveries WHERE state IN ('pending', 'leased');

INSERT INTO delivery_done (delivery_id, state, attempts, max_attempts, due_at, last_error, lease_token,
                           last_outcome, finished_at)
SELECT id, state, attempts, max_attempts, due_at, last_error, lease_token, last_outcome, updated_at
FROM deliveries WHERE state IN ('delivered', 'dead');

DROP INDEX IF EXISTS deliveries_due_by_endpoint;
DROP INDEX IF EXISTS deliveries_leased_by_endpoint;
DROP INDEX IF EXISTS deliveries_live_by_endpoint;
DROP INDEX IF EXISTS deliveries_dead_by_endpoint;
DROP INDEX IF EXISTS deliveries_lease_expiry;
-- Endpoints are never removed (only marked deleted) and an event is purged
-- only when no delivery refers to it: the foreign keys cost every insert a
-- lookup and a share lock on the endpoint's row, and guarded nothing.
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_endpoint_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_event_id_fkey;
ALTER TABLE deliveries
    DROP COLUMN state, DROP COLUMN attempts, DROP COLUMN max_attempts, DROP COLUMN due_at,
    DROP COLUMN lease_token, DROP COLUMN lease_expires_at, DROP COLUMN leased_by,
    DROP COLUMN last_outcome, DROP COLUMN last_error, DROP COLUMN updated_at;
ALTER TABLE deliveries SET (fillfactor = 100);

-- Events without an idempotency key no longer get an entry in its index.
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_account_idempotency_key_key;
CREATE UNIQUE INDEX events_idempotency_key ON events (account, idempotency_key) WHERE idempotency_key IS NOT NULL;

ALTER TABLE attempts DROP CONSTRAINT IF EXISTS attempts_pkey;
DROP INDEX IF EXISTS attempts_age;
CREATE INDEX attempts_age ON attempts USING brin (recorded_at);
