-- Version 18: an endpoint's jq program, applied to each body before it is
-- signed (issue 77, ADR 0050); NULL is none.
ALTER TABLE endpoints ADD COLUMN transform VARCHAR;
