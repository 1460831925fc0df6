//! One transaction on one pooled connection, and the rule that keeps the
//! pool clean: a connection on which anything went wrong is closed, never
//! handed to the next request.
//!
//! Why not sqlx's `Transaction`: when its `COMMIT` fails (SQLite answers
//! `SQLITE_FULL` on a full disk and rolls the transaction back itself),
//! sqlx keeps counting the connection as inside a transaction, its queued
//! `ROLLBACK` fails unseen, and the connection goes back to the pool. The
//! next transaction on it is then a nested `SAVEPOINT` whose "commit"
//! commits nothing: writes answered 201, visible on that one connection,
//! lost on restart. Here any error, and any statement abandoned half-way
//! (a client that hung up), closes the connection instead; closing rolls
//! back whatever it still had open.

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Database, TransactionManager};

use super::{ConfigDbError, Result};

type Manager = <Any as Database>::TransactionManager;

/// An open transaction. Dropped without [`Tx::commit`] it rolls back: by a
/// queued `ROLLBACK` when the connection is known to be sound, by closing
/// the connection otherwise.
#[derive(Debug)]
pub(super) struct Tx {
    conn: PoolConnection<Any>,
    /// Still inside the transaction (not committed or rolled back).
    open: bool,
    /// Every statement so far finished without error: the connection is
    /// in a state we know.
    sound: bool,
    /// Whether a broken connection may be closed. An in-memory SQLite
    /// database lives in its one connection, so it is rolled back instead.
    closable: bool,
}

impl Tx {
    /// Takes a connection from `pool` and starts a transaction with
    /// `begin` (`BEGIN IMMEDIATE`, a read-only `BEGIN …`).
    pub async fn begin(pool: &AnyPool, begin: &'static str, closable: bool) -> Result<Self> {
        let conn = pool.acquire().await?;
        let mut tx = Self {
            conn,
            open: false,
            sound: false,
            closable,
        };
        Manager::begin(&mut tx.conn, Some(begin.into())).await?;
        tx.open = true;
        tx.sound = true;
        Ok(tx)
    }

    /// Runs one step of the transaction on its connection. An error, or
    /// the step being abandoned before it finished, marks the connection
    /// unsound.
    pub async fn run<T>(
        &mut self,
        step: impl AsyncFnOnce(&mut AnyConnection) -> Result<T>,
    ) -> Result<T> {
        self.sound = false;
        let result = step(&mut self.conn).await;
        self.sound = result.is_ok();
        result
    }

    /// Commits. Only an `Ok` means the transaction is durable; on error
    /// nothing of it was committed and the connection is discarded.
    pub async fn commit(self) -> Result<()> {
        self.end(true).await
    }

    /// Rolls back now (rather than on drop).
    pub async fn rollback(self) -> Result<()> {
        self.end(false).await
    }

    /// Commits or rolls back; an error leaves the connection unsound (so
    /// dropping it closes it).
    async fn end(mut self, commit: bool) -> Result<()> {
        self.sound = false;
        let ended = if commit {
            Manager::commit(&mut self.conn).await
        } else {
            Manager::rollback(&mut self.conn).await
        };
        ended.map_err(ConfigDbError::from)?;
        self.open = false;
        self.sound = true;
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if !self.sound && self.closable {
            tracing::debug!("closing a configuration database connection after an error");
            self.conn.close_on_drop();
        } else if self.open {
            // Runs before the connection is pinged and checked on its way
            // back to the pool (`after_release` in `Db::open`).
            Manager::start_rollback(&mut self.conn);
        }
    }
}
