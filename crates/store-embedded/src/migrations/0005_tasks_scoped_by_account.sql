-- Version 5: workflow task ids are scoped by account. Another account's task
-- of the same id is a different task, so an enqueue never learns that an id
-- exists in another account. DuckDB cannot change a primary key in place:
-- the table is rebuilt with the same columns.
CREATE TABLE tasks_v5 (
    id               VARCHAR NOT NULL,
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
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (account, id)
);
INSERT INTO tasks_v5 SELECT * FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_v5 RENAME TO tasks;
