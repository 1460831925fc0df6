-- Resources of `kind: lease` (SPEC §12).
--
-- The CHECK on `charon_resources.kind` does not admit `lease`; the table is
-- rebuilt with the wider one, as 0002 did (the same statements run on
-- SQLite and PostgreSQL). The new table has a name of its own so that the
-- names PostgreSQL gave 0002's constraints cannot collide with its own.
CREATE TABLE charon_resources_v4 (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('rate', 'copy', 'bucket', 'window', 'queue', 'lease')),
    document TEXT NOT NULL,
    created_version BIGINT NOT NULL,
    updated_version BIGINT NOT NULL
);

INSERT INTO charon_resources_v4 (name, kind, document, created_version, updated_version)
    SELECT name, kind, document, created_version, updated_version FROM charon_resources;

DROP TABLE charon_resources;

ALTER TABLE charon_resources_v4 RENAME TO charon_resources;
