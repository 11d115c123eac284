-- Version 12: an endpoint's filter on the event's type and payload (ADR 0024),
-- as the JSON text of the filter, and its custom headers, as their JSON
-- object sealed like the signing secrets (ADR 0022); and the start of each
-- attempt's answer body. NULL is none. Catalogue
-- changes only.
ALTER TABLE endpoints ADD COLUMN filter text;
ALTER TABLE endpoints ADD COLUMN headers text;
ALTER TABLE attempts ADD COLUMN response_body text;
