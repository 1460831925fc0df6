//! Opening the store named by the settings: in memory, or Redis (retried
//! until it answers or `connect_timeout` passes).

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use charon_store::{MemoryStore, RedisOptions, RedisStore, Store, SystemClock};
use tracing::warn;

use super::StoreSettings;

pub(super) async fn open(url: &str, settings: &StoreSettings) -> anyhow::Result<Arc<dyn Store>> {
    if url == "memory" || url == "memory://" {
        return Ok(Arc::new(MemoryStore::new(Arc::new(SystemClock::new()))));
    }
    if !(url.starts_with("redis://")
        || url.starts_with("rediss://")
        || url.starts_with("redis+unix://"))
    {
        bail!("unsupported store {url:?} (expected memory or redis://host:port)");
    }
    let options = RedisOptions {
        server_id: server_id(),
        liveness_ttl: settings.liveness_ttl,
        op_timeout: settings.op_timeout,
        ..RedisOptions::default()
    };
    let deadline = tokio::time::Instant::now() + settings.connect_timeout;
    loop {
        match RedisStore::connect(url, options.clone()).await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() < deadline => {
                warn!("cannot use Redis at {url} yet ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => bail!("cannot use Redis at {url}: {e}"),
        }
    }
}

/// This server's name in the Redis membership: host and process id, so an
/// operator can tell whose holds were cleaned up.
fn server_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}
