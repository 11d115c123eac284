-- Version 3: account API keys, stored by the hash of their secret.
CREATE TABLE IF NOT EXISTS account_keys (
    id          VARCHAR PRIMARY KEY,
    account     VARCHAR NOT NULL,
    key_hash    VARCHAR NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);
