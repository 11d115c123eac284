-- Version 1 of the postgres schema. Times are milliseconds since the epoch
-- (bigint) taken from the store's clock, never from now().
CREATE TABLE endpoints (
    id                  uuid PRIMARY KEY,
    account             text NOT NULL,
    url                 text NOT NULL,
    secret              text NOT NULL,
    previous_secret     text,
    previous_expires_at bigint,
    event_types         jsonb NOT NULL,
    enabled             boolean NOT NULL,
    disabled_reason     text,
    rate_limit_per_s    bigint,
    ordered             boolean NOT NULL,
    description         text,
    created_at          bigint NOT NULL,
    updated_at          bigint NOT NULL,
    deleted_at          bigint
);
CREATE INDEX endpoints_by_account ON endpoints (account, created_at, id) WHERE deleted_at IS NULL;

-- One row per endpoint, apart from the endpoint so that circuit updates do
-- not rewrite (or lock) the endpoint row.
CREATE TABLE circuits (
    endpoint_id   uuid PRIMARY KEY REFERENCES endpoints (id),
    mode          text NOT NULL,
    failures      bigint NOT NULL,
    open_until    bigint,
    reopen_count  bigint NOT NULL,
    failing_since bigint,
    probe         uuid
);
CREATE INDEX circuits_open ON circuits (open_until) WHERE mode = 'open';

CREATE TABLE events (
    id              uuid PRIMARY KEY,
    account         text NOT NULL,
    event_type      text NOT NULL,
    body            text NOT NULL,
    idempotency_key text,
    created_at      bigint NOT NULL,
    UNIQUE (account, idempotency_key)
);

-- Global and strictly increasing; per endpoint that is all the contract asks.
-- Ordered endpoints also take a row lock before nextval, so their numbers
-- follow commit order.
CREATE SEQUENCE delivery_seq;

CREATE TABLE deliveries (
    id               uuid PRIMARY KEY,
    account          text NOT NULL,
    endpoint_id      uuid NOT NULL REFERENCES endpoints (id),
    event_id         uuid NOT NULL REFERENCES events (id),
    seq              bigint NOT NULL,
    state            text NOT NULL,
    attempts         bigint NOT NULL,
    max_attempts     bigint NOT NULL,
    due_at           bigint NOT NULL,
    lease_token      uuid,
    lease_expires_at bigint,
    leased_by        text,
    last_outcome     text,
    last_error       text,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    UNIQUE (endpoint_id, event_id)
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
-- The claim's ordering, on live rows only.
CREATE INDEX deliveries_due ON deliveries (due_at, seq) WHERE state = 'pending';
-- The expiry sweep.
CREATE INDEX deliveries_lease_expiry ON deliveries (lease_expires_at) WHERE state = 'leased';
-- The head of an ordered endpoint, and parking on delete.
CREATE INDEX deliveries_live_by_endpoint ON deliveries (endpoint_id, seq) WHERE state IN ('pending', 'leased');
-- Listings, newest first.
CREATE INDEX deliveries_by_account ON deliveries (account, seq DESC);
CREATE INDEX deliveries_by_event ON deliveries (event_id);

CREATE TABLE attempts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id     uuid NOT NULL,
    endpoint_id     uuid NOT NULL,
    account         text NOT NULL,
    attempt         bigint NOT NULL,
    result          text NOT NULL,
    status_code     bigint,
    error           text,
    latency_ms      bigint NOT NULL,
    will_retry      boolean NOT NULL,
    next_attempt_at bigint,
    recorded_at     bigint NOT NULL
);
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, id);
CREATE INDEX attempts_by_endpoint ON attempts (endpoint_id, id DESC);
