-- Version 2: the workflow queue, request idempotency, ticks, usage, alerts.
INSERT INTO counters VALUES ('task_seq', 0), ('alert_id', 0) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS tasks (
    id               VARCHAR PRIMARY KEY,
    account          VARCHAR NOT NULL,
    kind             VARCHAR NOT NULL,
    payload          VARCHAR NOT NULL,
    state            VARCHAR NOT NULL,
    attempts         BIGINT NOT NULL,
    max_attempts     BIGINT NOT NULL,
    run_at           BIGINT NOT NULL,
    seq              BIGINT NOT NULL,
    lease_token      VARCHAR,
    lease_expires_at BIGINT,
    leased_by        VARCHAR,
    last_outcome     VARCHAR,
    last_error       VARCHAR,
    staged_result    VARCHAR,
    result           VARCHAR,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS idempotency (
    scope        VARCHAR NOT NULL,
    key          VARCHAR NOT NULL,
    request_hash VARCHAR NOT NULL,
    state        VARCHAR NOT NULL,
    token        VARCHAR NOT NULL,
    status       BIGINT,
    body         VARCHAR,
    expires_at   BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS ticks (
    name              VARCHAR PRIMARY KEY,
    token             VARCHAR,
    lease_expires_at  BIGINT,
    state             VARCHAR,
    last_completed_at BIGINT
);

CREATE TABLE IF NOT EXISTS usage_batches (
    batch_id    VARCHAR PRIMARY KEY,
    recorded_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS usage_counters (
    account      VARCHAR NOT NULL,
    metric       VARCHAR NOT NULL,
    window_start BIGINT NOT NULL,
    amount       BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS alerts (
    id          BIGINT PRIMARY KEY,
    account     VARCHAR NOT NULL,
    kind        VARCHAR NOT NULL,
    endpoint_id VARCHAR NOT NULL,
    delivery_id VARCHAR,
    message     VARCHAR NOT NULL,
    created_at  BIGINT NOT NULL
);
