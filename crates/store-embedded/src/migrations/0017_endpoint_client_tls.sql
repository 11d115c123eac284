-- Version 17: an endpoint's client certificate and private key (mTLS,
-- issue 77), as their JSON text sealed like the signing secrets (ADR 0022,
-- ADR 0048); NULL is none.
ALTER TABLE endpoints ADD COLUMN client_tls VARCHAR;
