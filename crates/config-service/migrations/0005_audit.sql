-- The audit trail (issue 16): one row per commit, written in the commit's
-- own transaction, so a commit that fails leaves no row and a row that
-- cannot be written fails the commit.
--
-- version: the version the commit made (commits that change nothing make
-- no version and no row); unix_ms: when, in milliseconds since the Unix
-- epoch (UTC); token: the name of the token that made it (never its
-- secret); diff: a unified diff of the normalized YAML of the whole
-- configuration, before -> after; config: the normalized YAML after the
-- commit, what `charon config rollback --to VERSION` restores.
--
-- Kept forever: unlike charon_changes it is not pruned (a configuration
-- of a few hundred resources is tens of kilobytes a commit).
CREATE TABLE charon_audit (
    version BIGINT PRIMARY KEY CHECK (version > 0),
    unix_ms BIGINT NOT NULL,
    token TEXT NOT NULL,
    diff TEXT NOT NULL,
    config TEXT NOT NULL
);
