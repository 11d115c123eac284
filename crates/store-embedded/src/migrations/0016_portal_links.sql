-- Version 16: portal links (ADR 0049), by the hash of their token. A link's
-- endpoints are their ids, comma-separated (empty: every endpoint).
CREATE TABLE portal_links (
    id          VARCHAR PRIMARY KEY,
    account     VARCHAR NOT NULL,
    token_hash  VARCHAR NOT NULL UNIQUE,
    role        VARCHAR NOT NULL,
    endpoints   VARCHAR NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    redeemed_at BIGINT,
    revoked_at  BIGINT
);
CREATE INDEX portal_links_by_account ON portal_links (account, created_at);
