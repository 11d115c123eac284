-- Version 13: the event-type catalogue (ADR 0025). A registered type has a
-- description, and may have a JSON Schema its payloads must match and an
-- example payload, each kept as compact JSON text; NULL is none. A new table:
-- nothing existing is locked.
CREATE TABLE event_types (
    account text NOT NULL,
    name text NOT NULL,
    description text NOT NULL,
    schema text,
    example text,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    PRIMARY KEY (account, name)
);
