//! One multiplexed connection to Redis, reconnected by itself, with a time
//! limit on every operation and the mapping from Redis errors to
//! [`StoreError`].

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ServerError, ServerErrorKind, Value};

use super::scripts::Script;
use crate::StoreError;

/// A connection shared by every operation of one store: commands from
/// concurrent operations are pipelined on it.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    timeout: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Connects to `url`. Operations time out after `timeout`.
    pub(crate) async fn open(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let invalid = |e: redis::RedisError| {
            StoreError::Unavailable(format!("invalid Redis URL {url:?}: {e}"))
        };
        // TCP_NODELAY: one small script call per decision; Nagle's
        // algorithm against delayed ACKs would add up to 40 ms to some.
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(invalid)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info).map_err(invalid)?;
        // Reconnect attempts are short and few: an operation waiting for a
        // reconnect gives up at its own time limit anyway, and the next one
        // starts a fresh attempt.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(timeout / 4);
        let manager = tokio::time::timeout(
            timeout.saturating_mul(2),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::Unavailable(format!("connecting to Redis at {url} timed out")))?
        .map_err(|e| unavailable(&e))?;
        Ok(Self { manager, timeout })
    }

    /// Runs `script` with `keys` and `args` in one round trip, after the
    /// `before` commands (sent first on the same connection, in the same
    /// pipeline). When Redis does not know the script (a restart or
    /// `SCRIPT FLUSH`), loads it and runs the pipeline again.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
        before: &[Cmd],
    ) -> Result<Value, StoreError> {
        self.eval_after(script, keys, args, before)
            .await
            .map(|(_, reply)| reply)
    }

    /// [`Conn::eval`], also giving the replies of the `before` commands.
    pub(crate) async fn eval_after(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
        before: &[Cmd],
    ) -> Result<(Vec<Value>, Value), StoreError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
        let work = async {
            let mut conn = self.manager.clone();
            let mut loaded = false;
            loop {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in before {
                    pipe.add_command(cmd.clone());
                }
                pipe.add_command(evalsha.clone());
                let mut replies: Vec<Value> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable(&e))?;
                let reply = replies
                    .pop()
                    .ok_or_else(|| StoreError::BadData("empty pipeline reply".into()))?;
                for r in &replies {
                    if let Value::ServerError(e) = r {
                        // The script may have run without what had to come
                        // first (a key-set entry): report it as in doubt.
                        return Err(StoreError::Unavailable(format!(
                            "Redis refused a command sent before {}: {e}",
                            script.name
                        )));
                    }
                }
                match reply {
                    Value::ServerError(e)
                        if e.kind() == Some(ServerErrorKind::NoScript) && !loaded =>
                    {
                        let mut load = redis::cmd("SCRIPT");
                        load.arg("LOAD").arg(&*script.code);
                        load.query_async::<String>(&mut conn)
                            .await
                            .map_err(|e| unavailable(&e))?;
                        loaded = true;
                    }
                    Value::ServerError(e) => return Err(server_error(&e, script.name)),
                    v => return Ok((replies, v)),
                }
            }
        };
        self.limited(work).await
    }

    /// Runs one plain command.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let work = async {
            let mut conn = self.manager.clone();
            cmd.query_async::<T>(&mut conn).await.map_err(|e| {
                if e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.code().is_some_and(cannot_serve_now)
                {
                    unavailable(&e)
                } else {
                    StoreError::BadData(format!("Redis answered: {e}"))
                }
            })
        };
        self.limited(work).await
    }

    /// Loads every script (so the first operations need no second trip).
    pub(crate) async fn load(&self, scripts: &[&Script]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for s in scripts {
            pipe.cmd("SCRIPT").arg("LOAD").arg(&*s.code);
        }
        let work = async {
            let mut conn = self.manager.clone();
            pipe.query_async::<Vec<String>>(&mut conn)
                .await
                .map_err(|e| unavailable(&e))
        };
        let shas = self.limited(work).await?;
        for (s, sha) in scripts.iter().zip(&shas) {
            if *sha != s.sha {
                return Err(StoreError::BadData(format!(
                    "Redis gave script {} the SHA-1 {sha}, expected {}",
                    s.name, s.sha
                )));
            }
        }
        Ok(())
    }

    async fn limited<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "Redis did not answer within {:?}",
                    self.timeout
                )))
            })
    }
}

fn unavailable(e: &redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("Redis: {e}"))
}

/// An error reply. Replies that mean "Redis cannot serve now" are
/// unavailability; the rest mean a bug or foreign data under our keys.
/// `MISCONF` (it cannot persist: a full disk) and `NOREPLICAS` (too few
/// replicas acknowledge writes) refuse writes until the operator acts.
fn server_error(e: &ServerError, what: &str) -> StoreError {
    if cannot_serve_now(e.code()) {
        StoreError::Unavailable(format!("Redis cannot serve {what} now: {e}"))
    } else {
        StoreError::BadData(format!("Redis refused {what}: {e}"))
    }
}

/// Whether an error code means "Redis cannot serve now" rather than a bug.
fn cannot_serve_now(code: &str) -> bool {
    matches!(
        code,
        "LOADING"
            | "BUSY"
            | "MASTERDOWN"
            | "READONLY"
            | "CLUSTERDOWN"
            | "TRYAGAIN"
            | "OOM"
            | "MISCONF"
            | "NOREPLICAS"
    )
}
