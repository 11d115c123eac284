-- Version 8: the event-type catalogue (ADR 0025). A registered type has a
-- description, and may have a JSON Schema its payloads must match and an
-- example payload, each kept as compact JSON text; NULL is none.
CREATE TABLE event_types (
    account VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    description VARCHAR NOT NULL,
    schema VARCHAR,
    example VARCHAR,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (account, name)
);
