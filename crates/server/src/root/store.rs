//! Opening the store named by the settings: in memory, or Redis (retried
//! until it answers or `connect_timeout` passes, unless it refuses this
//! server's credentials, rights or certificates: waiting cannot fix those).
//!
//! The URL may hold a password: every message shows it through
//! [`redacted`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use charon_store::{
    ClientCertificate, MemoryStore, RedisOptions, RedisStore, RedisTls, Store, StoreError,
    SystemClock, redacted,
};
use tracing::warn;

use super::StoreSettings;

pub(super) async fn open(url: &str, settings: &StoreSettings) -> anyhow::Result<Arc<dyn Store>> {
    if url == "memory" || url == "memory://" {
        return Ok(Arc::new(MemoryStore::new(Arc::new(SystemClock::new()))));
    }
    let shown = redacted(url);
    check_redis_url(url)?;
    let options = RedisOptions {
        server_id: server_id(),
        liveness_ttl: settings.liveness_ttl,
        op_timeout: settings.op_timeout,
        max_batch: settings.max_batch,
        tls: tls(settings)?,
        ..RedisOptions::default()
    };
    let deadline = tokio::time::Instant::now() + settings.connect_timeout;
    loop {
        match RedisStore::connect(url, options.clone()).await {
            Ok(store) => return Ok(store),
            Err(e @ StoreError::Denied(_)) => bail!("cannot use Redis at {shown}: {e}"),
            Err(e) if tokio::time::Instant::now() < deadline => {
                warn!("cannot use Redis at {shown} yet ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => bail!("cannot use Redis at {shown}: {e}"),
        }
    }
}

/// Refuses a store URL that is not a Redis one (`redis://`, `rediss://`,
/// `redis+unix://`, `redis+cluster://`, `rediss+cluster://`).
pub fn check_redis_url(url: &str) -> anyhow::Result<()> {
    const SCHEMES: &[&str] = &[
        "redis://",
        "rediss://",
        "redis+unix://",
        "redis+cluster://",
        "rediss+cluster://",
    ];
    if !SCHEMES.iter().any(|s| url.starts_with(s)) {
        bail!(
            "unsupported store {:?} (expected memory, redis://host:port or \
             redis+cluster://host:port,host:port)",
            redacted(url)
        );
    }
    Ok(())
}

/// The certificates the settings name, read now so that a missing file is
/// a start-up error naming it.
fn tls(settings: &StoreSettings) -> anyhow::Result<RedisTls> {
    redis_tls(
        settings.redis_ca.as_deref(),
        settings.redis_cert.as_deref(),
        settings.redis_key.as_deref(),
    )
}

/// The TLS of a Redis store from `--redis-ca`, `--redis-cert` and
/// `--redis-key` (files read now, so a missing one is an error naming it):
/// for every command that opens the Redis store (`serve`, `simulate`).
pub fn redis_tls(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<RedisTls> {
    let read = |path: &Path, what: &str| {
        std::fs::read(path).with_context(|| format!("cannot read the {what} {}", path.display()))
    };
    let ca_pem = match ca {
        Some(path) => Some(read(path, "Redis CA file (--redis-ca)")?),
        None => None,
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some(ClientCertificate {
            cert_pem: read(cert, "Redis client certificate (--redis-cert)")?,
            key_pem: read(key, "Redis client key (--redis-key)")?,
        }),
        (None, None) => None,
        _ => bail!("--redis-cert and --redis-key go together (a client certificate and its key)"),
    };
    Ok(RedisTls { ca_pem, client })
}

/// This process's name where others see it (the Redis membership, a lease
/// parent, a lease holder): host and process id, so an operator can tell
/// whose holds or leases they are.
pub fn server_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}
