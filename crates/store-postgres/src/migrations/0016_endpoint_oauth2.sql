-- Version 16: an endpoint's OAuth2 client credentials (token URL, client id
-- and secret, scope, audience), as their JSON text sealed like the signing
-- secrets (ADR 0022); NULL is none. A nullable column with no default: no
-- table rewrite.
ALTER TABLE endpoints ADD COLUMN oauth2 text;
