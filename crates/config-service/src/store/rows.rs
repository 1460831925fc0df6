//! The rows as the database holds them and the queries that read them,
//! shared by reads ([`super::ReadTx`]) and writes ([`super::WriteTx`]).

use std::collections::BTreeMap;

use charon_core::config::NamespaceSettings;
use serde_json::Value;
use sqlx::AnyConnection;

use super::{
    ConfigDbError, ENVOY, Entity, Meta, Result, StoredNamespace, StoredResource, parse_document,
    to_i64, to_u64,
};

// Rows as the database holds them (integers for versions and flags, JSON
// text for documents), read by `sqlx::FromRow`; `TryFrom` and `checked`
// check what the database cannot (no negative version, a document that
// parses).

/// A row of `charon_meta`.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct MetaRow {
    pub(super) version: i64,
    pub(super) history_floor: i64,
    pub(super) epoch: String,
}

impl TryFrom<MetaRow> for Meta {
    type Error = ConfigDbError;

    fn try_from(row: MetaRow) -> Result<Self> {
        Ok(Meta {
            version: to_u64("version", row.version)?,
            history_floor: to_u64("history_floor", row.history_floor)?,
            epoch: row.epoch,
        })
    }
}

/// A row of `charon_resources`.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ResourceRow {
    pub(super) name: String,
    pub(super) document: String,
    pub(super) updated_version: i64,
}

impl ResourceRow {
    /// The resource's name and what is stored, checked.
    fn checked(self) -> Result<(String, StoredResource)> {
        let document = parse_document(&self.name, &self.document)?;
        let updated_version = to_u64("updated_version", self.updated_version)?;
        Ok((
            self.name,
            StoredResource {
                document,
                updated_version,
            },
        ))
    }
}

/// A row of `charon_namespaces`.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct NamespaceRow {
    pub(super) name: String,
    pub(super) allow_unconfigured: i64,
    pub(super) ignore_configured: i64,
    pub(super) updated_version: i64,
}

impl NamespaceRow {
    /// The namespace's name and its stored settings, checked.
    fn checked(self) -> Result<(String, StoredNamespace)> {
        let settings = NamespaceSettings {
            allow_unconfigured: self.allow_unconfigured != 0,
            ignore_configured: self.ignore_configured != 0,
        };
        let updated_version = to_u64("updated_version", self.updated_version)?;
        Ok((
            self.name,
            StoredNamespace {
                settings,
                updated_version,
            },
        ))
    }
}

/// A resource changed after some version, with its document now (`None`:
/// deleted).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ChangedResourceRow {
    pub(super) name: String,
    pub(super) document: Option<String>,
}

/// A namespace changed after some version, with its switches now (`None`:
/// deleted).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ChangedNamespaceRow {
    pub(super) name: String,
    pub(super) allow_unconfigured: Option<i64>,
    pub(super) ignore_configured: Option<i64>,
}

/// A row of `charon_audit`; `config` only when asked for.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct AuditRow {
    pub(super) version: i64,
    pub(super) unix_ms: i64,
    pub(super) token: String,
    pub(super) diff: String,
    pub(super) config: Option<String>,
}

/// One commit as the audit trail recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuditEntry {
    /// The version the commit made.
    pub version: u64,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The name of the token that made it.
    pub token: String,
    /// The unified diff of the normalized YAML, before → after.
    pub diff: String,
    /// The normalized YAML after the commit, when asked for.
    pub config: Option<String>,
}

impl TryFrom<AuditRow> for AuditEntry {
    type Error = ConfigDbError;

    fn try_from(row: AuditRow) -> Result<Self> {
        Ok(AuditEntry {
            version: to_u64("audit version", row.version)?,
            unix_ms: to_u64("audit unix_ms", row.unix_ms)?,
            token: row.token,
            diff: row.diff,
            config: row.config,
        })
    }
}

/// The row of `charon_envoy`.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct EnvoyRow {
    pub(super) document: String,
}

// Queries shared by reads and writes: they take the transaction's
// connection.

/// The stored `envoy:` section (its normalized SPEC §11 document), if the
/// configuration has one.
pub(super) async fn envoy(conn: &mut AnyConnection) -> Result<Option<Value>> {
    sqlx::query_as::<_, EnvoyRow>("SELECT document FROM charon_envoy WHERE id = 1")
        .fetch_optional(conn)
        .await?
        .map(|row| parse_document(ENVOY, &row.document))
        .transpose()
}

pub(super) async fn meta(conn: &mut AnyConnection) -> Result<Meta> {
    sqlx::query_as::<_, MetaRow>(
        "SELECT version, history_floor, epoch FROM charon_meta WHERE id = 1",
    )
    .fetch_one(conn)
    .await?
    .try_into()
}

/// Whether a name can be stored at all. Names with control characters are
/// refused by validation, so none is ever stored; a lookup of one must not
/// reach PostgreSQL, which refuses NUL bytes in text with an error.
pub(super) fn storable(name: &str) -> bool {
    !name.contains('\0')
}

pub(super) async fn resource(
    conn: &mut AnyConnection,
    name: &str,
) -> Result<Option<StoredResource>> {
    if !storable(name) {
        return Ok(None);
    }
    sqlx::query_as::<_, ResourceRow>(
        "SELECT name, document, updated_version FROM charon_resources WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(conn)
    .await?
    .map(|row| row.checked().map(|(_, r)| r))
    .transpose()
}

/// Every row `sql` selects, checked, by name.
pub(super) async fn by_name<R, T>(
    conn: &mut AnyConnection,
    sql: &'static str,
    checked: fn(R) -> Result<(String, T)>,
) -> Result<BTreeMap<String, T>>
where
    R: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
{
    let rows = sqlx::query_as::<_, R>(sql).fetch_all(conn).await?;
    rows.into_iter().map(checked).collect()
}

pub(super) async fn resources(
    conn: &mut AnyConnection,
) -> Result<BTreeMap<String, StoredResource>> {
    let sql = "SELECT name, document, updated_version FROM charon_resources";
    by_name(conn, sql, ResourceRow::checked).await
}

pub(super) async fn namespace(
    conn: &mut AnyConnection,
    name: &str,
) -> Result<Option<StoredNamespace>> {
    if !storable(name) {
        return Ok(None);
    }
    sqlx::query_as::<_, NamespaceRow>(
        "SELECT name, allow_unconfigured, ignore_configured, updated_version \
         FROM charon_namespaces WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(conn)
    .await?
    .map(|row| row.checked().map(|(_, n)| n))
    .transpose()
}

pub(super) async fn namespaces(
    conn: &mut AnyConnection,
) -> Result<BTreeMap<String, StoredNamespace>> {
    let sql = "SELECT name, allow_unconfigured, ignore_configured, updated_version \
               FROM charon_namespaces";
    by_name(conn, sql, NamespaceRow::checked).await
}

/// Names of the entities of `entity` changed after `since`, with their
/// current state (`None`: deleted).
pub(super) async fn changed_resources(
    conn: &mut AnyConnection,
    since: u64,
) -> Result<Vec<(String, Option<Value>)>> {
    let rows = sqlx::query_as::<_, ChangedResourceRow>(
        "SELECT c.name AS name, r.document AS document \
         FROM (SELECT DISTINCT name FROM charon_changes WHERE entity = 'resource' AND version > $1) c \
         LEFT JOIN charon_resources r ON r.name = c.name",
    )
    .bind(to_i64(since))
    .fetch_all(conn)
    .await?;
    let mut out = rows
        .into_iter()
        .map(|row| {
            let document = match &row.document {
                Some(text) => Some(parse_document(&row.name, text)?),
                None => None,
            };
            Ok((row.name, document))
        })
        .collect::<Result<Vec<_>>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub(super) async fn changed_namespaces(
    conn: &mut AnyConnection,
    since: u64,
) -> Result<Vec<(String, Option<NamespaceSettings>)>> {
    let rows = sqlx::query_as::<_, ChangedNamespaceRow>(
        "SELECT c.name AS name, n.allow_unconfigured AS allow_unconfigured, \
                n.ignore_configured AS ignore_configured \
         FROM (SELECT DISTINCT name FROM charon_changes WHERE entity = 'namespace' AND version > $1) c \
         LEFT JOIN charon_namespaces n ON n.name = c.name",
    )
    .bind(to_i64(since))
    .fetch_all(conn)
    .await?;
    let mut out: Vec<_> = rows
        .into_iter()
        .map(|row| {
            let settings = match (row.allow_unconfigured, row.ignore_configured) {
                (Some(a), Some(i)) => Some(NamespaceSettings {
                    allow_unconfigured: a != 0,
                    ignore_configured: i != 0,
                }),
                _ => None,
            };
            (row.name, settings)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub(super) async fn changed_after(
    conn: &mut AnyConnection,
    entity: Entity,
    name: &str,
    version: u64,
) -> Result<bool> {
    if !storable(name) {
        return Ok(false);
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) AS n FROM charon_changes WHERE entity = $1 AND name = $2 AND version > $3",
    )
    .bind(entity.as_str())
    .bind(name)
    .bind(to_i64(version))
    .fetch_one(conn)
    .await?;
    Ok(n > 0)
}
