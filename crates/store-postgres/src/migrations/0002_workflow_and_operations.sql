-- Version 2: the workflow queue, request idempotency, ticks, usage, alerts,
-- and the indexes retention needs.
CREATE SEQUENCE task_seq;

CREATE TABLE tasks (
    id               text PRIMARY KEY,
    account          text NOT NULL,
    kind             text NOT NULL,
    payload          jsonb NOT NULL,
    state            text NOT NULL,
    attempts         bigint NOT NULL,
    max_attempts     bigint NOT NULL,
    run_at           bigint NOT NULL,
    seq              bigint NOT NULL,
    lease_token      uuid,
    lease_expires_at bigint,
    leased_by        text,
    last_outcome     text,
    last_error       text,
    staged_result    jsonb,
    result           jsonb,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX tasks_due ON tasks (run_at, seq) WHERE state = 'pending';
CREATE INDEX tasks_lease_expiry ON tasks (lease_expires_at) WHERE state = 'leased';
CREATE INDEX tasks_dead ON tasks (account, seq DESC) WHERE state = 'dead_lettered';

CREATE TABLE idempotency (
    scope        text NOT NULL,
    key          text NOT NULL,
    request_hash text NOT NULL,
    state        text NOT NULL,
    token        uuid NOT NULL,
    status       bigint,
    body         text,
    expires_at   bigint NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);

CREATE TABLE ticks (
    name              text PRIMARY KEY,
    token             uuid,
    lease_expires_at  bigint,
    state             jsonb,
    last_completed_at bigint
);

CREATE TABLE usage_batches (
    batch_id    text PRIMARY KEY,
    recorded_at bigint NOT NULL
);

CREATE TABLE usage_counters (
    account      text NOT NULL,
    metric       text NOT NULL,
    window_start bigint NOT NULL,
    amount       bigint NOT NULL,
    PRIMARY KEY (account, metric, window_start)
);

CREATE TABLE alerts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account     text NOT NULL,
    kind        text NOT NULL,
    endpoint_id uuid NOT NULL,
    delivery_id uuid,
    message     text NOT NULL,
    created_at  bigint NOT NULL
);
CREATE INDEX alerts_by_account ON alerts (account, id DESC);

CREATE INDEX deliveries_delivered_age ON deliveries (updated_at) WHERE state = 'delivered';
CREATE INDEX attempts_age ON attempts (recorded_at, id);
