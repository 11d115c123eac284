-- Version 24: an endpoint's jq program, applied to each body before it is
-- signed (issue 77, ADR 0050); NULL is none. Not a secret: stored as typed.
-- A nullable column with no default: no table rewrite.
ALTER TABLE endpoints ADD COLUMN transform text;
