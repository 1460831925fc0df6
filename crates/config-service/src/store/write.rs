//! One commit in the making ([`WriteTx`]): the writes of the API, the
//! audit record and the version bump, all in one transaction.

use std::collections::BTreeSet;

use charon_core::config::NamespaceSettings;
use serde_json::Value;

use super::rows::{changed_after, storable};
use super::{ENVOY, Entity, ReadTx, Result, Statement, to_i64, wall_clock_ms};

/// One commit in the making. Dropped without [`WriteTx::commit`], it rolls
/// back and the version does not move.
#[derive(Debug)]
pub(crate) struct WriteTx {
    /// The transaction, which reads as a [`ReadTx`] does (through
    /// `Deref`).
    pub(super) read: ReadTx,
    /// The version before this commit.
    pub base: u64,
    /// The version this commit will have.
    pub(super) next: u64,
    pub(super) history_floor: u64,
    pub(super) history_versions: u64,
    /// 0: every audit row is kept.
    pub(super) audit_versions: u64,
    pub(super) changed: BTreeSet<(Entity, String)>,
    /// The name of the token making this commit.
    pub(super) token: String,
    /// The normalized YAML before this commit, for the audit diff.
    pub(super) before: String,
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
