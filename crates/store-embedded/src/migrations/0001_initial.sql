-- Version 1 of the embedded schema. Times are milliseconds since the epoch
-- (BIGINT), identifiers are UUID text. Only immutable columns are indexed:
-- DuckDB executes an update of an indexed column as delete + insert.
CREATE TABLE IF NOT EXISTS counters (
    name  VARCHAR PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO counters VALUES ('delivery_seq', 0), ('attempt_id', 0) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS endpoints (
    id                    VARCHAR PRIMARY KEY,
    account               VARCHAR NOT NULL,
    url                   VARCHAR NOT NULL,
    secret                VARCHAR NOT NULL,
    previous_secret       VARCHAR,
    previous_expires_at   BIGINT,
    event_types           VARCHAR NOT NULL,
    enabled               BOOLEAN NOT NULL,
    disabled_reason       VARCHAR,
    rate_limit_per_s      BIGINT,
    ordered               BOOLEAN NOT NULL,
    description           VARCHAR,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    deleted_at            BIGINT,
    circuit_mode          VARCHAR NOT NULL,
    circuit_failures      BIGINT NOT NULL,
    circuit_open_until    BIGINT,
    circuit_reopen_count  BIGINT NOT NULL,
    circuit_failing_since BIGINT,
    circuit_probe         VARCHAR
);

CREATE TABLE IF NOT EXISTS events (
    id              VARCHAR PRIMARY KEY,
    account         VARCHAR NOT NULL,
    event_type      VARCHAR NOT NULL,
    body            VARCHAR NOT NULL,
    idempotency_key VARCHAR,
    created_at      BIGINT NOT NULL,
    UNIQUE (account, idempotency_key)
);

CREATE TABLE IF NOT EXISTS deliveries (
    id               VARCHAR PRIMARY KEY,
    account          VARCHAR NOT NULL,
    endpoint_id      VARCHAR NOT NULL,
    event_id         VARCHAR NOT NULL,
    seq              BIGINT NOT NULL,
    state            VARCHAR NOT NULL,
    attempts         BIGINT NOT NULL,
    max_attempts     BIGINT NOT NULL,
    due_at           BIGINT NOT NULL,
    lease_token      VARCHAR,
    lease_expires_at BIGINT,
    leased_by        VARCHAR,
    last_outcome     VARCHAR,
    last_error       VARCHAR,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (endpoint_id, event_id)
);

CREATE TABLE IF NOT EXISTS attempts (
    id              BIGINT PRIMARY KEY,
    delivery_id     VARCHAR NOT NULL,
    endpoint_id     VARCHAR NOT NULL,
    account         VARCHAR NOT NULL,
    attempt         BIGINT NOT NULL,
    result          VARCHAR NOT NULL,
    status_code     BIGINT,
    error           VARCHAR,
    latency_ms      BIGINT NOT NULL,
    will_retry      BOOLEAN NOT NULL,
    next_attempt_at BIGINT,
    recorded_at     BIGINT NOT NULL
);
