-- Version 7: an endpoint's filter on the event's type and payload (ADR 0024),
-- as the JSON text of the filter; NULL is no filter.
ALTER TABLE endpoints ADD COLUMN filter VARCHAR;
