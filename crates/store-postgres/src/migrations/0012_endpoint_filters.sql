-- Version 12: an endpoint's filter on the event's type and payload (ADR 0024),
-- as the JSON text of the filter; NULL is no filter. A catalogue change only.
ALTER TABLE endpoints ADD COLUMN filter text;
