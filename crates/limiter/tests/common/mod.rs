//! Test support shared by the limiter's Redis tests: Redis store options
//! for a private `redis-server`, and the membership duties a server runs.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use charon_core::ManualClock;
use charon_store::{RedisOptions, RedisStore, Store, StoreError};
use tokio::task::JoinHandle;

/// Options for tests with the given liveness ttl, deciding on `clock`
/// (Redis `TIME` if `None`).
pub fn options(clock: Option<Arc<ManualClock>>, id: &str, ttl: Duration) -> RedisOptions {
    RedisOptions {
        server_id: id.to_owned(),
        liveness_ttl: ttl,
        op_timeout: (ttl / 4).min(Duration::from_secs(1)),
        clock: clock.map(|c| c as Arc<dyn charon_core::Clock>),
        // A private Redis used by nobody before: no other server can hold
        // copies that a new generation must wait for.
        rebuild_grace: Some(Duration::ZERO),
        ..RedisOptions::default()
    }
}

/// Runs `store.maintain()` in the background, as a server would.
pub fn spawn_maintain(store: &Arc<RedisStore>) -> JoinHandle<StoreError> {
    let s = store.clone();
    tokio::spawn(async move { s.maintain().await })
}
