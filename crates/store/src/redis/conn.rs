//! One multiplexed connection to Redis, reconnected by itself, with a time
//! limit on every operation (its errors mapped to [`StoreError`] by
//! `errors.rs`).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ServerErrorKind, Value};
use tracing::Instrument;

use super::cluster::{self, ClusterLink};
use super::crypto::install_crypto;

use super::RedisTls;
use super::errors::{acl_refusal, command_error, connect_error, server_error, unavailable};
use super::redact::redacted;
use super::scripts::Script;
use crate::StoreError;

/// A connection shared by every operation of one store: commands from
/// concurrent operations are pipelined on it.
#[derive(Clone)]
pub(crate) struct Conn {
    link: Link,
    timeout: Duration,
    /// The URL without its password (see [`redacted`]).
    shown: String,
    /// The client of a single Redis, for the wake-up subscription
    /// (`wakeups.rs`); none for a cluster, whose waiters poll.
    subscriber: Option<redis::Client>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("url", &self.shown)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One Redis, or a Redis Cluster: both multiplex every operation on
/// their connections and reconnect by themselves.
#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterLink),
}

impl Link {
    async fn pipeline(&self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<Value>> {
        match self {
            Link::Single(m) => pipe.query_async(&mut m.clone()).await,
            Link::Cluster(c) => pipe.query_async(&mut c.connection()).await,
        }
    }

    async fn cmd<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Link::Single(m) => cmd.query_async(&mut m.clone()).await,
            Link::Cluster(c) => cmd.query_async(&mut c.connection()).await,
        }
    }
}

impl Conn {
    /// Connects to `url` (with `tls` for a `rediss://` URL, or a
    /// `redis+cluster://` / `rediss+cluster://` list of seed nodes).
    /// Operations time out after `timeout`.
    ///
    /// No error names the URL as given: it may carry a password. They
    /// name [`redacted`]`(url)` instead.
    pub(crate) async fn open(
        url: &str,
        tls: &RedisTls,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let shown = redacted(url);
        if let Some(nodes) = cluster::seed_nodes(url) {
            let (link, no_client_cert) = ClusterLink::open(&nodes?, tls, timeout, &shown).await?;
            let link = Link::Cluster(link);
            probe(&link, timeout, &shown, no_client_cert).await?;
            // Copy writes wait for a replica (`WAIT`): a user who may not
            // is refused now, clearly, not at each copy operation.
            if let Link::Cluster(c) = &link {
                let check = async {
                    let masters = c.master_slots().await?;
                    for slot in masters {
                        if let Value::ServerError(e) =
                            c.on_slot(redis::cmd("WAIT").arg(0).arg(0), slot).await?
                        {
                            return Ok(Some(e));
                        }
                    }
                    Ok(None)
                };
                match tokio::time::timeout(timeout, check).await {
                    Err(_) => {
                        return Err(StoreError::Unavailable(format!(
                            "Redis at {shown} did not answer WAIT 0 0"
                        )));
                    }
                    Ok(Err(e)) => return Err(connect_error(&e, &shown, no_client_cert)),
                    Ok(Ok(Some(e))) => return Err(server_error(&e, "WAIT")),
                    Ok(Ok(None)) => {}
                }
            }
            return Ok(Self {
                link,
                timeout,
                shown,
                subscriber: None,
            });
        }
        let invalid = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("invalid Redis URL {shown}: {e}"))
        };
        // TCP_NODELAY: one small script call per decision; Nagle's
        // algorithm against delayed ACKs would add up to 40 ms to some.
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| invalid(&e))?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let is_tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if is_tls {
            install_crypto();
        }
        let no_client_cert = is_tls && tls.client.is_none();
        let client = if tls.is_empty() {
            redis::Client::open(info).map_err(|e| invalid(&e))?
        } else if !is_tls {
            // A CA or client certificate given for a plain connection is
            // a mistake that would otherwise go unnoticed: the traffic
            // the operator meant to protect would flow in clear.
            return Err(StoreError::Denied(format!(
                "a Redis CA or client certificate was given, but {shown} is not a \
                 TLS URL (use rediss://)"
            )));
        } else {
            let certificates = redis::TlsCertificates {
                client_tls: tls.client.as_ref().map(|c| redis::ClientTlsConfig {
                    client_cert: c.cert_pem.clone(),
                    client_key: c.key_pem.clone(),
                }),
                root_cert: tls.ca_pem.clone(),
            };
            redis::Client::build_with_tls(info, certificates).map_err(|e| {
                StoreError::Denied(format!(
                    "cannot use the TLS certificates given for Redis at {shown}: {e}"
                ))
            })?
        };
        // Reconnect attempts are short and few: an operation waiting for a
        // reconnect gives up at its own time limit anyway, and the next one
        // starts a fresh attempt.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(timeout / 4);
        let subscriber = Some(client.clone());
        let manager = tokio::time::timeout(
            timeout.saturating_mul(2),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::Unavailable(format!("connecting to Redis at {shown} timed out")))?
        .map_err(|e| connect_error(&e, &shown, no_client_cert))?;
        let link = Link::Single(manager);
        probe(&link, timeout, &shown, no_client_cert).await?;
        Ok(Self {
            link,
            timeout,
            shown,
            subscriber,
        })
    }

    /// A client for a pub/sub connection of its own (a single Redis only).
    pub(crate) fn subscriber(&self) -> Option<redis::Client> {
        self.subscriber.clone()
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

    /// Whether this is a Redis Cluster, where a master's slots can be
    /// unserved for a whole failover.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// [`Conn::eval`], also giving the replies of the `before` commands.
    pub(crate) async fn eval_after(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
        before: &[Cmd],
    ) -> Result<(Vec<Value>, Value), StoreError> {
        let span = script_span(script, keys.len());
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
        if let Link::Cluster(c) = &self.link {
            return self
                .limited(cluster_eval(c, script, keys, &evalsha, before, None))
                .instrument(span)
                .await;
        }
        let work = async {
            let mut loaded = false;
            loop {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in before {
                    pipe.add_command(cmd.clone());
                }
                pipe.add_command(evalsha.clone());
                let mut replies: Vec<Value> = self
                    .link
                    .pipeline(&pipe)
                    .await
                    .map_err(|e| unavailable(&e))?;
                let reply = replies
                    .pop()
                    .ok_or_else(|| StoreError::BadData("empty pipeline reply".into()))?;
                refused_before(&replies, script)?;
                match reply {
                    Value::ServerError(e)
                        if e.kind() == Some(ServerErrorKind::NoScript) && !loaded =>
                    {
                        let mut load = redis::cmd("SCRIPT");
                        load.arg("LOAD").arg(&*script.code);
                        self.link
                            .cmd::<String>(&load)
                            .await
                            .map_err(|e| unavailable(&e))?;
                        loaded = true;
                    }
                    Value::ServerError(e) => return Err(server_error(&e, script.name)),
                    v => return Ok((replies, v)),
                }
            }
        };
        self.limited(work).instrument(span).await
    }

    /// Runs one plain command.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let work = async { self.link.cmd::<T>(cmd).await.map_err(|e| command_error(&e)) };
        self.limited(work).await
    }

    /// The nodes a walk over every key (`SCAN`) must visit, each named by
    /// a slot it serves: `None` for the one Redis, else one slot of each
    /// master of the cluster.
    pub(crate) async fn scan_nodes(&self) -> Result<Vec<Option<u16>>, StoreError> {
        match &self.link {
            Link::Single(_) => Ok(vec![None]),
            Link::Cluster(c) => {
                let masters =
                    self.limited(async { c.master_slots().await.map_err(|e| unavailable(&e)) });
                Ok(masters.await?.into_iter().map(Some).collect())
            }
        }
    }

    /// Runs `cmd` on the node serving `slot` (see [`Conn::scan_nodes`]),
    /// or as [`Conn::query`] for `None`.
    pub(crate) async fn query_at<T: redis::FromRedisValue>(
        &self,
        slot: Option<u16>,
        cmd: &Cmd,
    ) -> Result<T, StoreError> {
        match (&self.link, slot) {
            (Link::Cluster(c), Some(slot)) => {
                let work = async {
                    let v = c.on_slot(cmd, slot).await.map_err(|e| unavailable(&e))?;
                    redis::from_redis_value(v)
                        .map_err(|e| StoreError::BadData(format!("Redis answered: {e}")))
                };
                self.limited(work).await
            }
            _ => self.query(cmd).await,
        }
    }

    /// [`Conn::eval_after`] whose writes a failover cannot lose: in a
    /// cluster, the script is followed on its node by `WAIT 1`, and a
    /// reply no replica confirmed in time is unavailability (the script
    /// may have run: the caller treats it as in doubt). On one Redis,
    /// [`Conn::eval_after`] (see docs/redis.md, "Failover").
    pub(crate) async fn eval_replicated(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
        before: &[Cmd],
    ) -> Result<(Vec<Value>, Value), StoreError> {
        let Link::Cluster(c) = &self.link else {
            return self.eval_after(script, keys, args, before).await;
        };
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
        let wait_ms = (self.timeout / 2).as_millis().max(1) as u64;
        self.limited(cluster_eval(
            c,
            script,
            keys,
            &evalsha,
            before,
            Some(wait_ms),
        ))
        .instrument(script_span(script, keys.len()))
        .await
    }

    /// Loads every script (so the first operations need no second trip).
    pub(crate) async fn load(&self, scripts: &[&Script]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for s in scripts {
            pipe.cmd("SCRIPT").arg("LOAD").arg(&*s.code);
        }
        let work = async {
            match &self.link {
                // `SCRIPT LOAD` goes to every master by itself; a pipeline
                // would reach one node.
                Link::Cluster(c) => c.load_all(scripts).await,
                Link::Single(m) => pipe.query_async::<Vec<String>>(&mut m.clone()).await,
            }
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

/// The span of one script call (see [`crate::TRACE_TARGET`]): a child of
/// the decision it serves when there is one.
fn script_span(script: &Script, keys: usize) -> tracing::Span {
    tracing::trace_span!(
        target: "charon::otel",
        "redis.evalsha",
        db.system = "redis",
        db.operation = "EVALSHA",
        charon.script = script.name,
        charon.keys = keys,
    )
}

/// [`Conn::eval_after`] in a cluster. A pipeline must stay in one slot
/// and the `before` commands are in the membership's slot, not the
/// script's: they are sent first, one by one, and the script only once
/// they are answered, so the order is kept (see docs/redis.md, "Redis
/// Cluster"). Each goes as a plain command, which the `redis` crate
/// follows through MOVED and ASK (it does not inside a pipeline).
///
/// With `wait_ms`, the script goes in one pipeline with `WAIT 1 <wait_ms>`
/// to the node that runs it, and its reply counts only once a replica
/// has its writes (see docs/redis.md, "Failover").
async fn cluster_eval(
    c: &ClusterLink,
    script: &Script,
    keys: &[&str],
    evalsha: &Cmd,
    before: &[Cmd],
    wait_ms: Option<u64>,
) -> Result<(Vec<Value>, Value), StoreError> {
    let mut pre = Vec::with_capacity(before.len());
    for cmd in before {
        match cmd.query_async::<Value>(&mut c.connection()).await {
            Ok(v) => pre.push(v),
            Err(e) if e.kind() == redis::ErrorKind::Io || e.is_timeout() => {
                return Err(unavailable(&e));
            }
            Err(e) => {
                return Err(StoreError::Unavailable(format!(
                    "Redis refused a command sent before {}: {e}",
                    script.name
                )));
            }
        }
    }
    let mut loaded = false;
    loop {
        let reply = match wait_ms {
            None => evalsha.query_async::<Value>(&mut c.connection()).await,
            Some(ms) => match c.eval_waited(evalsha, ms, keys.first().copied()).await {
                Ok((v, Value::Int(n))) if n >= 1 => Ok(v),
                Ok((_, other)) => {
                    return Err(StoreError::Unavailable(format!(
                        "no replica of the Redis Cluster master of {:?} confirmed {} within \
                         {ms} ms (WAIT answered {other:?}); a failover could lose it",
                        keys.first().copied().unwrap_or_default(),
                        script.name
                    )));
                }
                Err(e) => Err(e),
            },
        };
        match reply {
            Ok(v) => return Ok((pre, v)),
            Err(e)
                if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) && !loaded =>
            {
                // The node that answered NOSCRIPT is the master of the
                // script's slot: a replica promoted since `load`, or a
                // node restarted.
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&*script.code);
                c.load_on(&load, keys.first().copied())
                    .await
                    .map_err(|e| unavailable(&e))?;
                loaded = true;
            }
            Err(e) if e.code() == Some("NOPERM") || acl_refusal(&e.to_string()) => {
                return Err(StoreError::Denied(format!(
                    "Redis refused {} to the store URL's user (NOPERM: see the ACL rules in \
                     docs/redis.md): {e}",
                    script.name
                )));
            }
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::CrossSlot) => {
                return Err(StoreError::BadData(format!(
                    "{} would touch keys of several Redis Cluster slots (several resources in \
                     one batch); on a cluster, set same_slot: true on the Envoy domain \
                     (docs/envoy.md): {e}",
                    script.name
                )));
            }
            Err(e) => {
                return Err(match command_error(&e) {
                    StoreError::BadData(_) => {
                        StoreError::BadData(format!("Redis refused {}: {e}", script.name))
                    }
                    other => other,
                });
            }
        }
    }
}

/// Refuses the reply of a script whose `before` commands failed: the
/// script may have run without what had to come first (a key-set entry),
/// so it is reported as in doubt.
fn refused_before(replies: &[Value], script: &Script) -> Result<(), StoreError> {
    for r in replies {
        if let Value::ServerError(e) = r {
            return Err(StoreError::Unavailable(format!(
                "Redis refused a command sent before {}: {e}",
                script.name
            )));
        }
    }
    Ok(())
}

/// Sends PING first: a Redis that requires a password closes the
/// connection of an unauthenticated client that sends a long argument (a
/// script: more than 16 KiB), which would look like a network fault. A
/// PING first gets the plain NOAUTH. PING itself need not be allowed by
/// the user's ACL rules: NOPERM is fine here.
async fn probe(
    link: &Link,
    timeout: Duration,
    shown: &str,
    no_client_cert: bool,
) -> Result<(), StoreError> {
    let ping = tokio::time::timeout(timeout, link.cmd::<Value>(&redis::cmd("PING")))
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!(
                "Redis at {shown} did not answer PING within {timeout:?}"
            ))
        })?;
    match ping {
        Err(e) if e.code() == Some("NOPERM") => Ok(()),
        Err(e) => Err(connect_error(&e, shown, no_client_cert)),
        Ok(_) => Ok(()),
    }
}
