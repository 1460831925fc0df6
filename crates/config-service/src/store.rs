//! Where the configuration lives: a relational database reached through
//! sqlx's `Any` driver, so that a SQLite file (the embedded default) and
//! PostgreSQL (production) share one schema, one set of migrations and one
//! set of queries (`$1` placeholders, `ON CONFLICT`, `RETURNING`: both
//! accept them).
//!
//! Every write runs in a [`WriteTx`], which starts by taking the write
//! lock (`BEGIN IMMEDIATE` in SQLite, the `charon_meta` row in PostgreSQL)
//! and bumping the global version, so writers are serialized, versions
//! become visible in order, and the `If-Match` check made after it cannot
//! race another writer. A write that changes nothing rolls back, so the
//! version only moves when the configuration does.
//!
//! A write is acknowledged only once its `COMMIT` returned (SQLite in WAL
//! mode with `synchronous = FULL`: on disk). A connection on which
//! anything failed is closed rather than reused ([`tx`]), and a full disk,
//! a lock held too long or a lost database is a [`ConfigDbError::Unavailable`]
//! (503), see [`classify`].

mod assemble;
mod classify;
mod pools;
mod rows;
mod sqlite_file;
mod tx;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use charon_core::config::NamespaceSettings;
use serde_json::Value;
use sqlx::migrate::Migrator;

pub(crate) use assemble::assemble;
pub use classify::Unavailability;
use pools::Pools;
pub(crate) use rows::AuditEntry;
use rows::{
    AuditRow, changed_after, changed_namespaces, changed_resources, envoy, meta, namespace,
    namespaces, resource, resources,
};
use tx::Tx;
pub(crate) use write::{Committed, WriteTx};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Why the configuration database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDbError {
    /// The database URL or path is not usable.
    #[error("cannot use configuration database {target:?}: {message}")]
    Config { target: String, message: String },
    /// The database cannot take the request now (unreachable, pool timed
    /// out, disk full, locked by another process past the lock timeout):
    /// a server error that may pass. Nothing was committed.
    #[error("the configuration database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The database answered with an error.
    #[error("configuration database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("cannot migrate the configuration database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// What is stored cannot be read back (edited by hand?).
    #[error("stored configuration is damaged: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for ConfigDbError {
    fn from(e: sqlx::Error) -> Self {
        match classify::classify(&e) {
            Some(_) => ConfigDbError::Unavailable(e),
            None => ConfigDbError::Database(e),
        }
    }
}

impl ConfigDbError {
    /// Why the database is unavailable, for an [`ConfigDbError::Unavailable`].
    pub fn unavailability(&self) -> Option<Unavailability> {
        match self {
            ConfigDbError::Unavailable(e) => {
                Some(classify::classify(e).unwrap_or(Unavailability::Unreachable))
            }
            _ => None,
        }
    }
}

type Result<T, E = ConfigDbError> = std::result::Result<T, E>;

/// A statement with some of its parameters bound.
type Statement<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Which kind of entity a change touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Entity {
    Resource,
    Namespace,
    /// The `envoy:` section, one document under the name [`ENVOY`].
    Envoy,
}

/// The change log's name for the `envoy:` section (there is only one).
pub(crate) const ENVOY: &str = "envoy";

impl Entity {
    fn as_str(self) -> &'static str {
        match self {
            Entity::Resource => "resource",
            Entity::Namespace => "namespace",
            Entity::Envoy => "envoy",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// How long the change history is kept, and other storage knobs.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How many versions of change history to keep for deltas. A client
    /// further behind than this gets a full snapshot. Default 1000.
    pub history_versions: u64,
    /// How many versions of audit trail to keep (`GET /v1/audit`, and
    /// what `charon config rollback` can restore): each row holds the
    /// whole configuration it left, so an unbounded trail of a busy
    /// service would fill its disk. Default 10,000; 0 keeps every row.
    pub audit_versions: u64,
    /// Most connections in the pool. Default 8 (4 for SQLite).
    pub max_connections: Option<u32>,
    /// How long to wait for a connection before answering 503. Default 5s.
    pub acquire_timeout: Duration,
    /// How long a request waits for a lock another writer holds (another
    /// process on the same SQLite file, a long PostgreSQL transaction)
    /// before answering 503. Default 5s.
    pub lock_timeout: Duration,
}

/// The audit rows kept by default ([`StoreOptions::audit_versions`]).
pub const DEFAULT_AUDIT_VERSIONS: u64 = 10_000;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            history_versions: 1000,
            audit_versions: DEFAULT_AUDIT_VERSIONS,
            max_connections: None,
            acquire_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(5),
        }
    }
}

/// The global version, the history floor and the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    pub version: u64,
    pub history_floor: u64,
    pub epoch: String,
}

/// A stored resource: its normalized document and when it last changed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredResource {
    pub document: Value,
    pub updated_version: u64,
}

/// A stored namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredNamespace {
    pub settings: NamespaceSettings,
    pub updated_version: u64,
}

/// The configuration database.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pools: Pools,
    backend: Backend,
    history_versions: u64,
    audit_versions: u64,
    /// An in-memory SQLite database lives in its one connection, which
    /// must never be closed.
    in_memory: bool,
}

/// Turns what the operator gave into a database URL: `postgres://…` and
/// `sqlite:…` URLs as they are, anything else as the path of a SQLite file
/// (created if missing).
fn database_url(spec: &str) -> Result<(String, Backend)> {
    let bad = |message: String| ConfigDbError::Config {
        target: spec.to_owned(),
        message,
    };
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        return Ok((spec.to_owned(), Backend::Postgres));
    }
    if spec.starts_with("sqlite:") {
        return Ok((spec.to_owned(), Backend::Sqlite));
    }
    if spec.is_empty() {
        return Err(bad("empty database location".to_owned()));
    }
    if spec.contains("://") {
        return Err(bad(
            "only postgres:// and sqlite: URLs, or the path of a SQLite file, are supported"
                .to_owned(),
        ));
    }
    let path = std::path::absolute(Path::new(spec)).map_err(|e| bad(e.to_string()))?;
    let text = path
        .to_str()
        .ok_or_else(|| bad("the path is not valid UTF-8".to_owned()))?;
    // sqlx percent-decodes the file name, so encode everything that could
    // be read as a URL delimiter or an escape.
    let mut encoded = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    Ok((format!("sqlite://{encoded}?mode=rwc"), Backend::Sqlite))
}

impl Db {
    /// Connects (creating a SQLite file if needed), runs the migrations and
    /// makes sure the meta row exists.
    pub async fn open(spec: &str, options: &StoreOptions) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let (url, backend) = database_url(spec)?;
        let in_memory =
            backend == Backend::Sqlite && (url.contains(":memory:") || url.contains("mode=memory"));
        let pools = Pools::connect(spec, &url, backend, in_memory, options).await?;
        MIGRATOR.run(&pools.writes).await?;
        sqlx::query(
            "INSERT INTO charon_meta (id, version, history_floor, epoch) \
             VALUES (1, 0, 0, $1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(format!("{:032x}", rand::random::<u128>()))
        .execute(&pools.writes)
        .await?;
        Ok(Self {
            pools,
            backend,
            history_versions: options.history_versions.max(1),
            audit_versions: options.audit_versions,
            in_memory,
        })
    }

    /// A read-only transaction that sees one consistent version.
    pub async fn read(&self) -> Result<ReadTx> {
        let begin = match self.backend {
            // Several statements must see the same commit: a snapshot.
            Backend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            // The first read takes the snapshot.
            Backend::Sqlite => "BEGIN",
        };
        let tx = Tx::begin(&self.pools.reads, begin, !self.in_memory).await?;
        Ok(ReadTx { tx })
    }

    /// Starts a write by the token named `token` (recorded in the audit
    /// trail if it commits): takes the write lock and bumps the version.
    pub async fn write(&self, token: &str) -> Result<WriteTx> {
        let begin = match self.backend {
            // The UPDATE below takes the meta row's lock.
            Backend::Postgres => "BEGIN",
            // The write lock now, waiting up to busy_timeout for another
            // writer: a deferred BEGIN could fail later with a snapshot
            // that went stale in between.
            Backend::Sqlite => "BEGIN IMMEDIATE",
        };
        let mut tx = Tx::begin(&self.pools.writes, begin, !self.in_memory).await?;
        let (version, history_floor): (i64, i64) = tx
            .run(async |conn| {
                Ok(sqlx::query_as(
                    "UPDATE charon_meta SET version = version + 1 WHERE id = 1 \
                     RETURNING version, history_floor",
                )
                .fetch_one(conn)
                .await?)
            })
            .await?;
        let next = to_u64("version", version)?;
        let history_floor = to_u64("history_floor", history_floor)?;
        let base = next - 1;
        let mut read = ReadTx { tx };
        // What the audit diff starts from: the configuration the last
        // commit recorded, or (no row: the first commit, or one after an
        // upgrade from before the audit trail) what the tables hold now.
        let before = match read.audit_config(base).await? {
            Some(config) => config,
            None => read.normalized_yaml().await?,
        };
        Ok(WriteTx {
            read,
            base,
            next,
            history_floor,
            history_versions: self.history_versions,
            audit_versions: self.audit_versions,
            changed: BTreeSet::new(),
            token: token.to_owned(),
            before,
        })
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pools.close().await;
    }
}

/// The wall clock in milliseconds since the Unix epoch, for the audit
/// trail's timestamps: a record for people, which no rule decides by (the
/// rules read time through `charon_core::Clock`), and which this crate,
/// without a store, has no `SystemClock` for.
#[allow(
    clippy::disallowed_methods,
    reason = "a timestamp for people, no rule reads it"
)]
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn to_u64(column: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| ConfigDbError::Corrupt(format!("{column} is negative: {v}")))
}

fn to_i64(v: u64) -> i64 {
    // Versions count commits; they never come near 2^63.
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn parse_document(name: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        ConfigDbError::Corrupt(format!("resource {name:?}: document is not JSON: {e}"))
    })
}

/// A read-only view of one version. Dropped, it rolls back.
#[derive(Debug)]
pub(crate) struct ReadTx {
    tx: Tx,
}

impl ReadTx {
    pub async fn meta(&mut self) -> Result<Meta> {
        self.tx.run(async |c| meta(c).await).await
    }

    pub async fn resource(&mut self, name: &str) -> Result<Option<StoredResource>> {
        self.tx.run(async |c| resource(c, name).await).await
    }

    pub async fn resources(&mut self) -> Result<BTreeMap<String, StoredResource>> {
        self.tx.run(async |c| resources(c).await).await
    }

    pub async fn namespace(&mut self, name: &str) -> Result<Option<StoredNamespace>> {
        self.tx.run(async |c| namespace(c, name).await).await
    }

    pub async fn namespaces(&mut self) -> Result<BTreeMap<String, StoredNamespace>> {
        self.tx.run(async |c| namespaces(c).await).await
    }

    /// The `envoy:` section's document, if there is one.
    pub async fn envoy(&mut self) -> Result<Option<Value>> {
        self.tx.run(async |c| envoy(c).await).await
    }

    /// Whether the `envoy:` section changed after `since` (as far as the
    /// kept history tells; a client behind it gets a snapshot anyway).
    pub async fn envoy_changed(&mut self, since: u64) -> Result<bool> {
        self.tx
            .run(async |c| changed_after(c, Entity::Envoy, ENVOY, since).await)
            .await
    }

    pub async fn changed_resources(&mut self, since: u64) -> Result<Vec<(String, Option<Value>)>> {
        self.tx
            .run(async |c| changed_resources(c, since).await)
            .await
    }

    pub async fn changed_namespaces(
        &mut self,
        since: u64,
    ) -> Result<Vec<(String, Option<NamespaceSettings>)>> {
        self.tx
            .run(async |c| changed_namespaces(c, since).await)
            .await
    }

    /// The whole configuration as this transaction sees it, as normalized
    /// YAML.
    pub async fn normalized_yaml(&mut self) -> Result<String> {
        let resources = self.resources().await?;
        let namespaces = self.namespaces().await?;
        let envoy = self.envoy().await?;
        assemble(resources, &namespaces, envoy)
            .map(|config| config.to_yaml())
            .map_err(|e| ConfigDbError::Corrupt(e.to_string()))
    }

    /// The configuration the audit trail recorded for `version`.
    async fn audit_config(&mut self, version: u64) -> Result<Option<String>> {
        self.tx
            .run(async |c| {
                Ok(
                    sqlx::query_scalar("SELECT config FROM charon_audit WHERE version = $1")
                        .bind(to_i64(version))
                        .fetch_optional(c)
                        .await?,
                )
            })
            .await
    }

    /// Up to `limit` audit entries (without their configurations), newest
    /// first, of versions below `before` (all if `None`).
    pub async fn audit(&mut self, before: Option<u64>, limit: u64) -> Result<Vec<AuditEntry>> {
        let before = before.map_or(i64::MAX, to_i64);
        let rows = self
            .tx
            .run(async |c| {
                Ok(sqlx::query_as::<_, AuditRow>(
                    "SELECT version, unix_ms, token, diff, NULL AS config FROM charon_audit \
                     WHERE version < $1 ORDER BY version DESC LIMIT $2",
                )
                .bind(before)
                .bind(to_i64(limit))
                .fetch_all(c)
                .await?)
            })
            .await?;
        rows.into_iter().map(AuditEntry::try_from).collect()
    }

    /// The audit entry of `version`, with its configuration.
    pub async fn audit_entry(&mut self, version: u64) -> Result<Option<AuditEntry>> {
        self.tx
            .run(async |c| {
                Ok(sqlx::query_as::<_, AuditRow>(
                    "SELECT version, unix_ms, token, diff, config FROM charon_audit \
                     WHERE version = $1",
                )
                .bind(to_i64(version))
                .fetch_optional(c)
                .await?)
            })
            .await?
            .map(AuditEntry::try_from)
            .transpose()
    }
}

#[cfg(test)]
mod tests;
