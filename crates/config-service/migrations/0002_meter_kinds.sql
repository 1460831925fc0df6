-- Resources of `kind: bucket`, `window` and `queue` (SPEC §7–9).
--
-- The CHECK on `charon_resources.kind` admitted only `rate` and `copy`.
-- SQLite cannot change a CHECK in place, so the table is rebuilt with the
-- wider one (the same statements run on PostgreSQL): no other table
-- refers to it and it has no other index than its primary key.
CREATE TABLE charon_resources_next (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('rate', 'copy', 'bucket', 'window', 'queue')),
    document TEXT NOT NULL,
    created_version BIGINT NOT NULL,
    updated_version BIGINT NOT NULL
);

INSERT INTO charon_resources_next (name, kind, document, created_version, updated_version)
    SELECT name, kind, document, created_version, updated_version FROM charon_resources;

DROP TABLE charon_resources;

ALTER TABLE charon_resources_next RENAME TO charon_resources;
