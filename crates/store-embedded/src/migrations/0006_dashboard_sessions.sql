-- Version 6: dashboard sessions (ADR 0021), by the hash of their id.
CREATE TABLE sessions (
    id_hash    text PRIMARY KEY,
    token_hash text NOT NULL,
    csrf       text NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);
