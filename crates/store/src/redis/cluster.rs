//! The Redis Cluster side of [`super::conn::Conn`]: seed nodes from a
//! `redis+cluster://` URL, and the few operations that must name a node
//! (script loading on every master, `SCAN` on each master, `WAIT` on a
//! slot's master). The `redis` crate follows MOVED and ASK and refreshes
//! the slot map by itself.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, RedisResult, Value};

use super::RedisTls;
use super::crypto::install_crypto;
use super::errors::connect_error;
use super::scripts::Script;
use crate::StoreError;

/// A connection to every node of a cluster, cloned per operation.
#[derive(Clone)]
pub(crate) struct ClusterLink {
    conn: ClusterConnection,
}

/// The node URLs of a `redis+cluster://` or `rediss+cluster://` URL, each
/// with the URL's user information; `None` for any other URL.
///
/// `redis+cluster://user:pass@h1:p1,h2:p2` gives `redis://user:pass@h1:p1`
/// and `redis://user:pass@h2:p2`: one user and password for the whole
/// cluster, as the `redis` crate requires.
pub(crate) fn seed_nodes(url: &str) -> Option<Result<Vec<String>, StoreError>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(end);
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(StoreError::Unavailable(format!(
            "invalid Redis URL {}: a cluster URL needs at least one host:port",
            super::redact::redacted(url)
        ))));
    }
    Some(Ok(nodes))
}

impl ClusterLink {
    /// Connects to the cluster through `nodes` (see [`seed_nodes`]).
    /// Errors name `shown`, the URL without its password.
    pub(crate) async fn open(
        nodes: &[String],
        tls: &RedisTls,
        timeout: Duration,
        shown: &str,
    ) -> Result<(Self, bool), StoreError> {
        let is_tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        if !tls.is_empty() && !is_tls {
            return Err(StoreError::Denied(format!(
                "a Redis CA or client certificate was given, but {shown} is not a \
                 TLS URL (use rediss+cluster://)"
            )));
        }
        if is_tls {
            install_crypto();
        }
        let invalid = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("invalid Redis URL {shown}: {e}"))
        };
        let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // Short retries: during a failover an operation fails at its
            // own time limit, and the next one starts afresh.
            .retries(2)
            .min_retry_wait(20)
            .max_retry_wait((timeout / 4).as_millis().max(20) as u64);
        if !tls.is_empty() {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: tls.client.as_ref().map(|c| redis::ClientTlsConfig {
                    client_cert: c.cert_pem.clone(),
                    client_key: c.key_pem.clone(),
                }),
                root_cert: tls.ca_pem.clone(),
            });
        }
        let client = builder.build().map_err(|e| {
            if tls.is_empty() {
                invalid(&e)
            } else {
                StoreError::Denied(format!(
                    "cannot use the TLS certificates given for Redis at {shown}: {e}"
                ))
            }
        })?;
        let no_client_cert = is_tls && tls.client.is_none();
        let conn = tokio::time::timeout(timeout.saturating_mul(2), client.get_async_connection())
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!("connecting to Redis Cluster at {shown} timed out"))
            })?
            .map_err(|e| connect_error(&e, shown, no_client_cert))?;
        Ok((Self { conn }, no_client_cert))
    }

    /// A handle for one operation (they share the nodes' connections).
    pub(crate) fn connection(&self) -> ClusterConnection {
        self.conn.clone()
    }

    /// Runs `cmd` on the master of `route`'s slot.
    pub(crate) async fn on_route(&self, cmd: &Cmd, route: Route) -> RedisResult<Value> {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
        self.connection().route_command(cmd.clone(), routing).await
    }

    /// Runs `cmd` on the master of `slot`.
    pub(crate) async fn on_slot(&self, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        self.on_route(cmd, Route::new(slot, SlotAddr::Master)).await
    }

    /// Runs `evalsha` and `WAIT 1 <wait_ms>` in one pipeline on the node
    /// that serves `key`'s slot, so that `WAIT` covers the script's writes
    /// on that very node and connection; gives both replies. The `redis`
    /// crate does not follow redirections inside a pipeline: after `MOVED`
    /// a plain command on `key` makes it refresh its slot map, and `ASK`
    /// (a slot being moved) sends `ASKING` first to the node named. A few
    /// tries, then the redirection is the error.
    pub(crate) async fn eval_waited(
        &self,
        evalsha: &Cmd,
        wait_ms: u64,
        key: Option<&str>,
    ) -> RedisResult<(Value, Value)> {
        let key = key.unwrap_or_default();
        // Where a redirection sent the next try, and whether it was ASK.
        let mut redirected: Option<(String, u16, bool)> = None;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let (route, offset) = match redirected.take() {
                Some((host, port, asking)) => {
                    if asking {
                        pipe.cmd("ASKING");
                    }
                    (
                        SingleNodeRoutingInfo::ByAddress { host, port },
                        usize::from(asking),
                    )
                }
                None => (
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)),
                    0,
                ),
            };
            pipe.add_command(evalsha.clone());
            pipe.cmd("WAIT").arg(1).arg(wait_ms);
            let mut replies = self
                .connection()
                .route_pipeline(pipe, offset, 2, route)
                .await?;
            let wait = replies.pop().unwrap_or(Value::Nil);
            let reply = replies.pop().unwrap_or(Value::Nil);
            let Value::ServerError(e) = reply else {
                return Ok((reply, wait));
            };
            let target = e
                .details()
                .and_then(|d| d.rsplit(' ').next())
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)));
            match (e.kind(), target) {
                (Some(redis::ServerErrorKind::Ask), Some((h, p))) if tries < 4 => {
                    redirected = Some((h, p, true));
                }
                (Some(redis::ServerErrorKind::Moved), Some((h, p))) if tries < 4 => {
                    // A plain command on the key makes the client follow
                    // the redirection and refresh its slot map, for the
                    // next operations; this one goes where MOVED says.
                    let _ = redis::cmd("EXISTS")
                        .arg(key)
                        .query_async::<Value>(&mut self.connection())
                        .await;
                    redirected = Some((h, p, false));
                }
                _ => return Err(e.into()),
            }
        }
    }

    /// Loads a script (`load`, a `SCRIPT LOAD`) on the master of `key`'s
    /// slot: the node that just answered NOSCRIPT for it.
    pub(crate) async fn load_on(&self, load: &Cmd, key: Option<&str>) -> RedisResult<()> {
        let slot = Slot::for_key(key.unwrap_or_default());
        self.on_route(load, Route::with_slot(slot, SlotAddr::Master))
            .await
            .map(drop)
    }

    /// Loads every script on every master (`SCRIPT LOAD` is routed to all
    /// masters, and must succeed on all), giving the SHA-1s.
    pub(crate) async fn load_all(&self, scripts: &[&Script]) -> RedisResult<Vec<String>> {
        let mut shas = Vec::with_capacity(scripts.len());
        for s in scripts {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(&*s.code);
            shas.push(load.query_async::<String>(&mut self.connection()).await?);
        }
        Ok(shas)
    }

    /// One slot served by each master (from `CLUSTER SLOTS`), to name
    /// every master for a walk over all keys.
    pub(crate) async fn master_slots(&self) -> RedisResult<Vec<u16>> {
        let v = self
            .connection()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        Ok(first_slot_per_master(&v))
    }
}

/// The first slot of each master in a `CLUSTER SLOTS` reply: ranges of
/// `[start, end, [host, port, id, …], replicas…]`.
fn first_slot_per_master(v: &Value) -> Vec<u16> {
    let mut seen: Vec<(String, i64)> = Vec::new();
    let mut slots = Vec::new();
    let Value::Array(ranges) = v else {
        return slots;
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Array(master))) = (parts.first(), parts.get(2))
        else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            continue;
        };
        if seen.contains(&(host.clone(), *port)) {
            continue;
        }
        seen.push((host, *port));
        if let Ok(slot) = u16::try_from(*start) {
            slots.push(slot);
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_nodes_carry_the_user_and_scheme() {
        let nodes = seed_nodes("redis+cluster://u:p%40w@10.0.0.1:7000,10.0.0.2:7001")
            .expect("a cluster URL")
            .expect("valid");
        assert_eq!(
            nodes,
            [
                "redis://u:p%40w@10.0.0.1:7000",
                "redis://u:p%40w@10.0.0.2:7001"
            ]
        );
        let tls = seed_nodes("rediss+cluster://h:1/?protocol=resp3")
            .expect("a cluster URL")
            .expect("valid");
        assert_eq!(tls, ["rediss://h:1/?protocol=resp3"]);
        assert!(seed_nodes("redis://h:1").is_none());
        let empty = seed_nodes("redis+cluster://u:secret@").expect("a cluster URL");
        let err = empty.expect_err("no hosts").to_string();
        assert!(err.contains("u:***@"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn one_slot_per_master() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
            ])
        };
        let range = |a: i64, b: i64, host: &str, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                node(host, port),
                node("r", 1),
            ])
        };
        let v = Value::Array(vec![
            range(0, 5460, "a", 1),
            range(5461, 5500, "b", 2),
            range(5501, 5600, "a", 1),
            range(5601, 16383, "c", 3),
        ]);
        assert_eq!(first_slot_per_master(&v), [0, 5461, 5601]);
    }
}
