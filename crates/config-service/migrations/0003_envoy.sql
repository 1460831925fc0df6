-- The `envoy:` section (SPEC §11): Envoy's descriptor trees, kept whole.
--
-- One row (id = 1) when the configuration has a section, none when it has
-- not: the section is one document (its nodes refer to resources by name,
-- and it is validated against them as a whole), stored as the normalized
-- JSON of the SPEC §11 layout, with the version that last changed it.
CREATE TABLE charon_envoy (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    document TEXT NOT NULL,
    updated_version BIGINT NOT NULL
);

-- Its changes go in the change log as the entity `envoy` (name `envoy`).
-- The CHECK on `charon_changes.entity` admitted only `resource` and
-- `namespace`; SQLite cannot change a CHECK in place, so the table is
-- rebuilt with the wider one, as 0002 did for `charon_resources` (the
-- same statements run on PostgreSQL), and its index made again.
CREATE TABLE charon_changes_next (
    version BIGINT NOT NULL,
    entity TEXT NOT NULL CHECK (entity IN ('resource', 'namespace', 'envoy')),
    name TEXT NOT NULL,
    PRIMARY KEY (version, entity, name)
);

INSERT INTO charon_changes_next (version, entity, name)
    SELECT version, entity, name FROM charon_changes;

DROP INDEX charon_changes_by_entity;

DROP TABLE charon_changes;

ALTER TABLE charon_changes_next RENAME TO charon_changes;

CREATE INDEX charon_changes_by_entity ON charon_changes (entity, name, version);
