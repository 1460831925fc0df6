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
mod sqlite_file;
mod tx;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use charon_core::config::NamespaceSettings;
use serde_json::Value;
use sqlx::AnyConnection;
use sqlx::migrate::Migrator;

pub(crate) use assemble::assemble;
pub use classify::Unavailability;
use pools::Pools;
use tx::Tx;

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

// Rows as the database holds them (integers for versions and flags, JSON
// text for documents), read by `sqlx::FromRow`; `TryFrom` and `checked`
// check what the database cannot (no negative version, a document that
// parses).

/// A row of `charon_meta`.
#[derive(Debug, sqlx::FromRow)]
struct MetaRow {
    version: i64,
    history_floor: i64,
    epoch: String,
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
struct ResourceRow {
    name: String,
    document: String,
    updated_version: i64,
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
struct NamespaceRow {
    name: String,
    allow_unconfigured: i64,
    ignore_configured: i64,
    updated_version: i64,
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
struct ChangedResourceRow {
    name: String,
    document: Option<String>,
}

/// A namespace changed after some version, with its switches now (`None`:
/// deleted).
#[derive(Debug, sqlx::FromRow)]
struct ChangedNamespaceRow {
    name: String,
    allow_unconfigured: Option<i64>,
    ignore_configured: Option<i64>,
}

/// A row of `charon_audit`; `config` only when asked for.
#[derive(Debug, sqlx::FromRow)]
struct AuditRow {
    version: i64,
    unix_ms: i64,
    token: String,
    diff: String,
    config: Option<String>,
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
struct EnvoyRow {
    document: String,
}

// Queries shared by reads and writes: they take the transaction's
// connection.

/// The stored `envoy:` section (its normalized SPEC §11 document), if the
/// configuration has one.
async fn envoy(conn: &mut AnyConnection) -> Result<Option<Value>> {
    sqlx::query_as::<_, EnvoyRow>("SELECT document FROM charon_envoy WHERE id = 1")
        .fetch_optional(conn)
        .await?
        .map(|row| parse_document(ENVOY, &row.document))
        .transpose()
}

async fn meta(conn: &mut AnyConnection) -> Result<Meta> {
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
fn storable(name: &str) -> bool {
    !name.contains('\0')
}

async fn resource(conn: &mut AnyConnection, name: &str) -> Result<Option<StoredResource>> {
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
async fn by_name<R, T>(
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

async fn resources(conn: &mut AnyConnection) -> Result<BTreeMap<String, StoredResource>> {
    let sql = "SELECT name, document, updated_version FROM charon_resources";
    by_name(conn, sql, ResourceRow::checked).await
}

async fn namespace(conn: &mut AnyConnection, name: &str) -> Result<Option<StoredNamespace>> {
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

async fn namespaces(conn: &mut AnyConnection) -> Result<BTreeMap<String, StoredNamespace>> {
    let sql = "SELECT name, allow_unconfigured, ignore_configured, updated_version \
               FROM charon_namespaces";
    by_name(conn, sql, NamespaceRow::checked).await
}

/// Names of the entities of `entity` changed after `since`, with their
/// current state (`None`: deleted).
async fn changed_resources(
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

async fn changed_namespaces(
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

async fn changed_after(
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

/// One commit in the making. Dropped without [`WriteTx::commit`], it rolls
/// back and the version does not move.
#[derive(Debug)]
pub(crate) struct WriteTx {
    /// The transaction, which reads as a [`ReadTx`] does (through
    /// `Deref`).
    read: ReadTx,
    /// The version before this commit.
    pub base: u64,
    /// The version this commit will have.
    next: u64,
    history_floor: u64,
    history_versions: u64,
    /// 0: every audit row is kept.
    audit_versions: u64,
    changed: BTreeSet<(Entity, String)>,
    /// The name of the token making this commit.
    token: String,
    /// The normalized YAML before this commit, for the audit diff.
    before: String,
}

impl std::ops::Deref for WriteTx {
    type Target = ReadTx;

    fn deref(&self) -> &ReadTx {
        &self.read
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut ReadTx {
        &mut self.read
    }
}

/// What a finished write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Committed {
    /// The version the configuration is at now.
    pub version: u64,
    /// Whether this write changed anything (and so made that version).
    pub changed: bool,
}

impl WriteTx {
    /// The oldest version a delta can be computed from.
    pub fn history_floor(&self) -> u64 {
        self.history_floor
    }

    /// Whether a change to this entity was committed after `version`, as
    /// far as the kept history tells.
    pub async fn changed_after(
        &mut self,
        entity: Entity,
        name: &str,
        version: u64,
    ) -> Result<bool> {
        self.read
            .tx
            .run(async |c| changed_after(c, entity, name, version).await)
            .await
    }

    async fn record(&mut self, entity: Entity, name: &str) -> Result<()> {
        let version = to_i64(self.next);
        self.read
            .tx
            .run(async |c| {
                sqlx::query(
                    "INSERT INTO charon_changes (version, entity, name) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(version)
                .bind(entity.as_str())
                .bind(name)
                .execute(c)
                .await?;
                Ok(())
            })
            .await?;
        self.changed.insert((entity, name.to_owned()));
        Ok(())
    }

    /// Runs `upsert` (of the entity `name`), its last parameter the
    /// version this commit makes, and records the change.
    async fn put(&mut self, entity: Entity, name: &str, upsert: Statement<'_>) -> Result<()> {
        let version = to_i64(self.next);
        self.read
            .tx
            .run(async |c| {
                upsert.bind(version).execute(c).await?;
                Ok(())
            })
            .await?;
        self.record(entity, name).await
    }

    /// Creates or replaces a resource with a validated, normalized document.
    pub async fn put_resource(&mut self, name: &str, kind: &str, document: &Value) -> Result<()> {
        let upsert = sqlx::query(
            "INSERT INTO charon_resources (name, kind, document, created_version, updated_version) \
             VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, \
                document = excluded.document, updated_version = excluded.updated_version",
        );
        let upsert = upsert.bind(name).bind(kind).bind(document.to_string());
        self.put(Entity::Resource, name, upsert).await
    }

    /// Deletes a resource; false if there was none.
    pub async fn delete_resource(&mut self, name: &str) -> Result<bool> {
        self.delete(
            Entity::Resource,
            "DELETE FROM charon_resources WHERE name = $1",
            name,
        )
        .await
    }

    /// Runs `sql` (a DELETE by name) and records the change if it deleted
    /// anything; false if there was nothing to delete.
    async fn delete(&mut self, entity: Entity, sql: &'static str, name: &str) -> Result<bool> {
        if !storable(name) {
            return Ok(false);
        }
        let done = self
            .read
            .tx
            .run(async |c| Ok(sqlx::query(sql).bind(name).execute(c).await?))
            .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        self.record(entity, name).await?;
        Ok(true)
    }

    /// Sets the `envoy:` section to a validated, normalized document, or
    /// removes it (`None`). Recorded as a change only if it differs.
    pub async fn set_envoy(&mut self, document: Option<&Value>) -> Result<()> {
        let now = self.envoy().await?;
        if now.as_ref() == document {
            return Ok(());
        }
        match document {
            Some(doc) => {
                let upsert = sqlx::query(
                    "INSERT INTO charon_envoy (id, document, updated_version) VALUES (1, $1, $2) \
                     ON CONFLICT (id) DO UPDATE SET document = excluded.document, \
                        updated_version = excluded.updated_version",
                )
                .bind(doc.to_string());
                self.put(Entity::Envoy, ENVOY, upsert).await
            }
            None => self
                .delete(
                    Entity::Envoy,
                    "DELETE FROM charon_envoy WHERE $1 = 'envoy'",
                    ENVOY,
                )
                .await
                .map(|_| ()),
        }
    }

    /// Creates or replaces a namespace's switches.
    pub async fn put_namespace(&mut self, name: &str, settings: NamespaceSettings) -> Result<()> {
        let upsert = sqlx::query(
            "INSERT INTO charon_namespaces (name, allow_unconfigured, ignore_configured, updated_version) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO UPDATE SET allow_unconfigured = excluded.allow_unconfigured, \
                ignore_configured = excluded.ignore_configured, \
                updated_version = excluded.updated_version",
        );
        let (allow, ignore) = (settings.allow_unconfigured, settings.ignore_configured);
        let upsert = upsert
            .bind(name)
            .bind(i64::from(allow))
            .bind(i64::from(ignore));
        self.put(Entity::Namespace, name, upsert).await
    }

    /// Deletes a namespace's switches; false if there were none.
    pub async fn delete_namespace(&mut self, name: &str) -> Result<bool> {
        self.delete(
            Entity::Namespace,
            "DELETE FROM charon_namespaces WHERE name = $1",
            name,
        )
        .await
    }

    /// Commits if anything changed (pruning history and audit rows beyond
    /// what is kept, and writing the audit row in the same transaction); rolls back
    /// otherwise, leaving the version where it was and the audit trail as
    /// it was. `Ok` only once the commit is durable; on error nothing of it
    /// was committed, audit row included.
    pub async fn commit(mut self) -> Result<Committed> {
        if self.changed.is_empty() {
            self.read.tx.rollback().await?;
            return Ok(Committed {
                version: self.base,
                changed: false,
            });
        }
        let after = self.read.normalized_yaml().await?;
        let diff = crate::audit::unified(&self.before, &after);
        let unix_ms = wall_clock_ms();
        let (version, token) = (to_i64(self.next), self.token.clone());
        self.read
            .tx
            .run(async |c| {
                sqlx::query(
                    "INSERT INTO charon_audit (version, unix_ms, token, diff, config) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(version)
                .bind(unix_ms)
                .bind(token)
                .bind(diff)
                .bind(after)
                .execute(c)
                .await?;
                Ok(())
            })
            .await?;
        if self.audit_versions > 0 && self.next > self.audit_versions {
            let oldest_kept = to_i64(self.next - self.audit_versions + 1);
            self.read
                .tx
                .run(async |c| {
                    sqlx::query("DELETE FROM charon_audit WHERE version < $1")
                        .bind(oldest_kept)
                        .execute(c)
                        .await?;
                    Ok(())
                })
                .await?;
        }
        let cutoff = to_i64(self.next.saturating_sub(self.history_versions));
        if cutoff > to_i64(self.history_floor) {
            self.read
                .tx
                .run(async |c| {
                    sqlx::query("DELETE FROM charon_changes WHERE version <= $1")
                        .bind(cutoff)
                        .execute(&mut *c)
                        .await?;
                    sqlx::query("UPDATE charon_meta SET history_floor = $1 WHERE id = 1")
                        .bind(cutoff)
                        .execute(&mut *c)
                        .await?;
                    Ok(())
                })
                .await?;
        }
        self.read.tx.commit().await?;
        Ok(Committed {
            version: self.next,
            changed: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_sqlite_urls() {
        let (url, backend) = database_url("/tmp/a b/c?.db").expect("a path");
        assert_eq!(backend, Backend::Sqlite);
        assert_eq!(url, "sqlite:///tmp/a%20b/c%3F.db?mode=rwc");
        assert_eq!(
            database_url("postgres://u@h/db").expect("pg").1,
            Backend::Postgres
        );
        assert_eq!(
            database_url("sqlite::memory:").expect("mem").1,
            Backend::Sqlite
        );
        assert!(database_url("mysql://h/db").is_err());
        assert!(database_url("").is_err());
    }

    /// "Durably committed": every connection to the file runs in WAL mode
    /// with the log synced at each commit, and waits for another writer's
    /// lock only as long as configured.
    #[tokio::test]
    async fn every_connection_syncs_each_commit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.db");
        let options = StoreOptions {
            lock_timeout: Duration::from_millis(1234),
            ..StoreOptions::default()
        };
        let db = Db::open(&path.display().to_string(), &options)
            .await
            .expect("open");
        let mut conn = db.pools.writes.acquire().await.expect("a connection");
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .expect("journal_mode");
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .expect("synchronous");
        let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await
            .expect("busy_timeout");
        assert_eq!((mode.as_str(), synchronous, busy), ("wal", 2, 1234));
    }

    /// Rows come back through the `FromRow` structs; what the database
    /// cannot check (a document that parses, no negative version) is
    /// reported as damage, not as a database error.
    #[tokio::test]
    async fn rows_are_read_and_damage_is_reported() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.db");
        let db = Db::open(&path.display().to_string(), &StoreOptions::default())
            .await
            .expect("open");
        let mut conn = db.pools.writes.acquire().await.expect("a connection");
        for sql in [
            "INSERT INTO charon_resources VALUES ('a/x', 'rate', '{\"name\":\"a/x\"}', 1, 1)",
            "INSERT INTO charon_namespaces VALUES ('a', 1, 0, 3)",
        ] {
            sqlx::query(sql).execute(&mut *conn).await.expect(sql);
        }
        let mut tx = db.read().await.expect("read");
        assert_eq!(tx.meta().await.expect("meta").version, 0);
        let resources = tx.resources().await.expect("resources");
        assert_eq!(resources["a/x"].document["name"], "a/x");
        assert_eq!(resources["a/x"].updated_version, 1);
        let ns = tx.namespace("a").await.expect("namespace").expect("a");
        assert!(ns.settings.allow_unconfigured && !ns.settings.ignore_configured);
        assert_eq!(ns.updated_version, 3);
        drop(tx);

        for sql in [
            "UPDATE charon_resources SET updated_version = -1",
            "UPDATE charon_resources SET updated_version = 1, document = 'not json'",
        ] {
            sqlx::query(sql).execute(&mut *conn).await.expect(sql);
            let mut tx = db.read().await.expect("read");
            let damaged = tx.resource("a/x").await;
            assert!(
                matches!(damaged, Err(ConfigDbError::Corrupt(_))),
                "{sql}: {damaged:?}"
            );
        }
    }
}
