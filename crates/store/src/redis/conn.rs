//! One multiplexed connection to Redis, reconnected by itself, with a time
//! limit on every operation and the mapping from Redis errors to
//! [`StoreError`].

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ServerError, ServerErrorKind, Value};

use super::RedisTls;
use super::scripts::Script;
use crate::StoreError;

/// A connection shared by every operation of one store: commands from
/// concurrent operations are pipelined on it.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    timeout: Duration,
    /// The URL without its password (see [`redacted`]).
    shown: String,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("url", &self.shown)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Connects to `url` (with `tls` for a `rediss://` URL). Operations
    /// time out after `timeout`.
    ///
    /// No error names the URL as given: it may carry a password. They
    /// name [`redacted`]`(url)` instead.
    pub(crate) async fn open(
        url: &str,
        tls: &RedisTls,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let shown = redacted(url);
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
        let manager = tokio::time::timeout(
            timeout.saturating_mul(2),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::Unavailable(format!("connecting to Redis at {shown} timed out")))?
        .map_err(|e| connect_error(&e, &shown, no_client_cert))?;
        // A Redis that requires a password closes the connection of an
        // unauthenticated client that sends a long argument (a script: more
        // than 16 KiB), which would look like a network fault. A PING
        // first gets the plain NOAUTH. PING itself need not be allowed by
        // the user's ACL rules: NOPERM is fine here.
        let mut probe = manager.clone();
        let ping = tokio::time::timeout(
            timeout,
            redis::cmd("PING").query_async::<String>(&mut probe),
        )
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!(
                "Redis at {shown} did not answer PING within {timeout:?}"
            ))
        })?;
        match ping {
            Err(e) if e.code() == Some("NOPERM") => {}
            Err(e) => return Err(connect_error(&e, &shown, no_client_cert)),
            Ok(_) => {}
        }
        Ok(Self {
            manager,
            timeout,
            shown,
        })
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
                // `unavailable` makes a refusal of the user a denial.
                if denial(&e).is_some()
                    || e.is_io_error()
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

/// A failed round trip: [`StoreError::Denied`] if Redis refuses this
/// server for good (see [`denial`]), else unavailability.
fn unavailable(e: &redis::RedisError) -> StoreError {
    match denial(e) {
        Some(why) => StoreError::Denied(format!("Redis {why}: {e}")),
        None => StoreError::Unavailable(format!("Redis: {e}")),
    }
}

/// An error reply. A refusal of the user's rights is a denial; replies
/// that mean "Redis cannot serve now" are unavailability; the rest mean a
/// bug or foreign data under our keys.
/// `MISCONF` (it cannot persist: a full disk) and `NOREPLICAS` (too few
/// replicas acknowledge writes) refuse writes until the operator acts.
fn server_error(e: &ServerError, what: &str) -> StoreError {
    if e.code() == "NOPERM" || acl_refusal(&e.to_string()) {
        StoreError::Denied(format!(
            "Redis refused {what} to the store URL's user (NOPERM: see the ACL rules in \
             docs/redis.md): {e}"
        ))
    } else if matches!(e.code(), "NOAUTH" | "WRONGPASS") {
        StoreError::Denied(format!(
            "Redis refused {what}: the user name or password of the store URL is not accepted: {e}"
        ))
    } else if cannot_serve_now(e.code()) {
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

/// Makes ring rustls' process-wide crypto provider unless one is set:
/// rustls cannot choose by itself when a build enables both of its
/// providers (ring here, aws-lc-rs through some other crate), and would
/// panic at the first handshake.
fn install_crypto() {
    // An error only says that a provider is installed already: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An error while connecting to Redis at `shown` (the URL without its
/// password). What waiting cannot fix, the credentials or the
/// certificates, is [`StoreError::Denied`], so that a server does not keep
/// retrying at start-up; the rest is [`StoreError::Unavailable`].
///
/// A Redis that requires a client certificate none was shown for sends a
/// TLS alert and closes; if the close overtakes the alert (a reset), only
/// a dropped connection is seen, which waiting could fix as well: that
/// stays unavailability, with the likely cause named.
fn connect_error(e: &redis::RedisError, shown: &str, no_client_cert: bool) -> StoreError {
    if let Some(why) = denial(e) {
        return StoreError::Denied(format!("Redis at {shown} {why}: {e}"));
    }
    let hint = if no_client_cert && (e.is_io_error() || e.is_connection_dropped()) {
        " (if this Redis requires a client certificate, tls-auth-clients yes, give one: \
         see --redis-cert)"
    } else {
        ""
    };
    StoreError::Unavailable(format!("cannot connect to Redis at {shown}: {e}{hint}"))
}

/// Why `e` means that Redis refuses this server for good (until an
/// operator changes the credentials, the rights or the certificates), if
/// it does.
///
/// rustls' certificate errors reach us as I/O errors whose text is all
/// that tells them apart, so those are recognised by rustls' wording
/// ("invalid peer certificate", "received fatal alert"), which is stable
/// across rustls 0.23.
pub(crate) fn denial(e: &redis::RedisError) -> Option<&'static str> {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Some("refused the user name or password of the store URL");
    }
    match e.code() {
        Some("WRONGPASS" | "NOAUTH") => {
            return Some("refused the user name or password of the store URL");
        }
        Some("NOPERM") => {
            return Some(
                "does not let the store URL's user run what Charon needs (NOPERM: see the ACL \
                 rules in docs/redis.md)",
            );
        }
        _ => {}
    }
    let text = e.to_string();
    if acl_refusal(&text) {
        Some(
            "does not let the store URL's user run what Charon needs (NOPERM: see the ACL rules \
             in docs/redis.md)",
        )
    } else if text.contains("invalid peer certificate") {
        Some("presented a certificate this server does not trust (see --redis-ca)")
    } else if text.contains("received fatal alert") {
        Some("ended the TLS handshake (does it require a client certificate? see --redis-cert)")
    } else {
        None
    }
}

/// Whether an error's text is an ACL refusal inside a script: Redis
/// reports those as plain `ERR` replies, not `NOPERM` ("The user executing
/// the script can't run this command…" in Redis 7.0, "ACL failure in
/// script: … no permissions …" from 7.2 and Valkey).
fn acl_refusal(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    text.contains("the user executing the script can't")
        || text.contains("acl failure in script")
        || text.contains("no permissions to")
}

/// `url` with its password, if any, replaced by `***`: what messages,
/// logs and metrics may show. Covers the password of the authority
/// (`redis://user:pass@host`, `redis://:pass@host`) and the `pass` or
/// `password` query parameter (`redis+unix:///path?pass=…`).
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redacted_query(url);
    };
    // All before the last '@' is user information, '/', '?' and '@' in
    // an unescaped password included, unless a query comes first (an
    // '@' inside `?pass=…`).
    match rest.rsplit_once('@') {
        Some((userinfo, host)) if !userinfo.contains('?') || userinfo.contains(':') => {
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{}", redacted_query(host)),
                None => format!("{scheme}://{userinfo}@{}", redacted_query(host)),
            }
        }
        _ => format!("{scheme}://{}", redacted_query(rest)),
    }
}

/// `text` with the values of its `pass` and `password` query parameters
/// replaced by `***`.
fn redacted_query(text: &str) -> String {
    let Some((head, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
            _ => p.to_owned(),
        })
        .collect();
    format!("{head}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn redacted_hides_every_password() {
        assert_eq!(
            redacted("redis://charon:s3cr%40t@10.0.0.1:6380/2"),
            "redis://charon:***@10.0.0.1:6380/2"
        );
        assert_eq!(redacted("rediss://:pw@h:1"), "rediss://:***@h:1");
        // A password may hold '@' and ':' unescaped: all before the last
        // '@' is user information.
        assert_eq!(redacted("redis://u:a@b:c@h"), "redis://u:***@h");
        assert_eq!(redacted("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?db=1&pass=pw"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redacted("redis+unix:///s?pass=a@b:c&db=1"),
            "redis+unix:///s?pass=***&db=1"
        );
        assert_eq!(redacted("redis://u:p/w?x@h/0"), "redis://u:***@h/0");
        assert_eq!(redacted("no url at all"), "no url at all");
    }
}
