-- Version 3: account API keys, stored by the hash of their secret.
CREATE TABLE account_keys (
    id          uuid PRIMARY KEY,
    account     text NOT NULL,
    key_hash    text NOT NULL UNIQUE,
    created_at  bigint NOT NULL
);
