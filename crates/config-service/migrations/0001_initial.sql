-- Charon configuration service: the initial schema.
--
-- One schema for SQLite (the embedded default) and PostgreSQL: only TEXT
-- and BIGINT columns and syntax both accept, so the same migration and the
-- same queries run on both.

-- One row (id = 1): the global version, bumped by every commit; the oldest
-- version from which a delta can still be computed (changes at or below it
-- have been pruned); and the epoch, a random id of this database, so that a
-- limiting server that synced with another database (a restore, a new
-- deployment) asks for a full snapshot instead of applying a wrong delta.
-- The row is inserted by the service on first open (the epoch is random).
CREATE TABLE charon_meta (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL CHECK (version >= 0),
    history_floor BIGINT NOT NULL CHECK (history_floor >= 0),
    epoch TEXT NOT NULL
);

-- Every configured resource: its validated, normalized document in the
-- SPEC §6 layout (JSON text: name, kind, limits, tiers, per-domain
-- overrides, groups), and the versions that created and last changed it.
CREATE TABLE charon_resources (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('rate', 'copy')),
    document TEXT NOT NULL,
    created_version BIGINT NOT NULL,
    updated_version BIGINT NOT NULL
);

-- Namespace switches of SPEC §4 (0 or 1).
CREATE TABLE charon_namespaces (
    name TEXT PRIMARY KEY,
    allow_unconfigured BIGINT NOT NULL CHECK (allow_unconfigured IN (0, 1)),
    ignore_configured BIGINT NOT NULL CHECK (ignore_configured IN (0, 1)),
    updated_version BIGINT NOT NULL
);

-- The change log behind `GET /v1/changes?since=V`: which entity a commit
-- touched (created, replaced or deleted). What it looks like now is read
-- from the tables above, so a delta carries the current state of every
-- entity changed after V. Pruned to the retained history.
CREATE TABLE charon_changes (
    version BIGINT NOT NULL,
    entity TEXT NOT NULL CHECK (entity IN ('resource', 'namespace')),
    name TEXT NOT NULL,
    PRIMARY KEY (version, entity, name)
);

CREATE INDEX charon_changes_by_entity ON charon_changes (entity, name, version);
