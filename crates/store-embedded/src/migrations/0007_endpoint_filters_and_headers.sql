-- Version 7: an endpoint's filter on the event's type and payload (ADR 0024),
-- as the JSON text of the filter, and its custom headers, as their JSON
-- object sealed like the signing secrets (ADR 0022); and the start of each
-- attempt's answer body. NULL is none.
ALTER TABLE endpoints ADD COLUMN filter VARCHAR;
ALTER TABLE endpoints ADD COLUMN headers VARCHAR;
ALTER TABLE attempts ADD COLUMN response_body VARCHAR;
