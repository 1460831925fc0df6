//! The connection pools: one for reads, and one of a single connection for
//! writes. Writes are serialized by the database anyway (SQLite's write
//! lock, PostgreSQL's meta row); queueing them for that one connection
//! rather than in the database keeps every other connection for reads, so
//! the feed of limiting servers is answered while writers wait for a lock
//! another process holds.

use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool, Connection, Executor};

use super::{Backend, ConfigDbError, Result, StoreOptions, sqlite_file};

#[derive(Debug, Clone)]
pub(super) struct Pools {
    pub reads: AnyPool,
    pub writes: AnyPool,
}

impl Pools {
    /// Connects to `url` (creating a SQLite file, mode 0600, if needed).
    pub async fn connect(
        spec: &str,
        url: &str,
        backend: Backend,
        in_memory: bool,
        options: &StoreOptions,
    ) -> Result<Self> {
        if in_memory {
            // Each connection to an in-memory database would be a database
            // of its own: exactly one, for ever, for reads and writes.
            let pool = pool_options(backend, options)
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect(url)
                .await?;
            return Ok(Self {
                reads: pool.clone(),
                writes: pool,
            });
        }
        if backend == Backend::Sqlite {
            sqlite_file::create_owner_only(url).map_err(|e| ConfigDbError::Config {
                target: spec.to_owned(),
                message: format!("cannot create the database file: {e}"),
            })?;
        }
        // One connection first, outside any pool: a pool retries a
        // failing connection until its acquire timeout and then says only
        // that it timed out; this says why (a full disk, a bad password).
        let mut first = AnyConnection::connect(url).await?;
        prepare(&mut first, backend, options.lock_timeout).await?;
        first.close().await?;
        let default = if backend == Backend::Sqlite { 4 } else { 8 };
        let reads = pool_options(backend, options)
            .max_connections(options.max_connections.unwrap_or(default))
            .connect(url)
            .await?;
        let writes = pool_options(backend, options)
            .max_connections(1)
            .connect(url)
            .await?;
        Ok(Self { reads, writes })
    }

    pub async fn close(&self) {
        self.writes.close().await;
        self.reads.close().await;
    }
}

/// What every connection gets: the backend's settings on connect, and a
/// check on its way back to the pool.
fn pool_options(backend: Backend, options: &StoreOptions) -> AnyPoolOptions {
    let lock_timeout = options.lock_timeout;
    AnyPoolOptions::new()
        .acquire_timeout(options.acquire_timeout)
        .after_connect(move |conn, _| Box::pin(prepare(conn, backend, lock_timeout)))
        .after_release(move |conn, _| {
            Box::pin(async move {
                // A connection still inside a transaction is closed, never
                // lent again. SQLite's worker runs a rollback queued on
                // drop (and only then counts the transaction as ended)
                // when it is next used: a ping first. PostgreSQL counts it
                // at once, and sqlx's own ping on release surfaces a
                // rollback that failed.
                if backend == Backend::Sqlite {
                    conn.ping().await?;
                }
                Ok(!conn.is_in_transaction())
            })
        })
}

/// The backend's settings, on every new connection.
async fn prepare(
    conn: &mut AnyConnection,
    backend: Backend,
    lock_timeout: Duration,
) -> Result<(), sqlx::Error> {
    match backend {
        Backend::Sqlite => {
            for pragma in sqlite_file::pragmas(lock_timeout) {
                conn.execute(pragma.as_str()).await?;
            }
        }
        Backend::Postgres => {
            // A write waiting for the meta row's lock gives up (55P03,
            // then 503) instead of waiting for ever.
            let ms = lock_timeout.as_millis();
            conn.execute(format!("SET lock_timeout = {ms}").as_str())
                .await?;
        }
    }
    Ok(())
}
