//! Test support shared by the store's integration tests: each fixture is a
//! store on a manual clock; the Redis one has a private `redis-server`
//! and runs its membership duties like a server would.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use charon_core::ManualClock;
use charon_store::{MemoryStore, RedisOptions, RedisStore, Store, StoreError};
use charon_testkit::RedisServer;
use tokio::task::JoinHandle;

/// A store under test, its clock, and whatever keeps it running.
pub struct Fixture {
    pub clock: Arc<ManualClock>,
    pub store: Arc<dyn Store>,
    pub redis: Option<RedisServer>,
    maintain: Option<JoinHandle<StoreError>>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.maintain.take() {
            m.abort();
        }
    }
}

/// The in-memory store with sequential transfer ids.
pub async fn memory() -> Fixture {
    let clock = Arc::new(ManualClock::new(0));
    Fixture {
        store: Arc::new(MemoryStore::with_sequential_ids(clock.clone())),
        clock,
        redis: None,
        maintain: None,
    }
}

/// The Redis store on a private redis-server, deciding on a manual clock.
pub async fn redis() -> Fixture {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(0));
    let opts = RedisOptions {
        clock: Some(clock.clone()),
        ..options(None, "test", Duration::from_secs(10))
    };
    let store = RedisStore::connect(&server.url(), opts)
        .await
        .expect("connect to the private redis");
    let maintain = spawn_maintain(&store);
    Fixture {
        clock,
        store,
        redis: Some(server),
        maintain: Some(maintain),
    }
}

/// Options for tests with the given liveness ttl (crash tests use short
/// ones so that they are fast).
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
