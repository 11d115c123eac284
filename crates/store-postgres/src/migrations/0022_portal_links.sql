-- Version 22: portal links (ADR 0049), by the hash of their token. A link's
-- endpoints are their ids, comma-separated (empty: every endpoint).
CREATE TABLE portal_links (
    id          uuid PRIMARY KEY,
    account     text NOT NULL,
    token_hash  text NOT NULL UNIQUE,
    role        text NOT NULL,
    endpoints   text NOT NULL,
    created_at  bigint NOT NULL,
    expires_at  bigint NOT NULL,
    redeemed_at bigint,
    revoked_at  bigint
);
CREATE INDEX portal_links_by_account ON portal_links (account, created_at);
CREATE INDEX portal_links_expiry ON portal_links (expires_at);
