//! `charon simulate --store redis://…` (or `redis+cluster://…`): the same
//! replay through the Redis store, its Lua scripts deciding on the
//! simulation's virtual clock, so that any replay can be checked in both
//! stores.
//!
//! The replay's keys live under a prefix of its own
//! (`charon:simulate-<random>`), so it never reads or changes a server's
//! counts on the same Redis, and the Redis user needs no more rights than
//! a server's (`~charon:*`). They are deleted when the replay ends
//! ([`RedisSimulation::finish`]); a replay that is killed leaves them to
//! expire within a day.

use std::sync::Arc;
use std::time::Duration;

use charon_core::ManualClock;
use charon_core::config::Config;
pub use charon_store::{RedisOptions, RedisTls, StoreError, redacted};
use charon_store::{RedisStore, Store};
use tokio::task::JoinHandle;

use crate::Simulation;

/// A Redis store on a virtual clock, with its upkeep running.
pub struct RedisSimulation {
    store: Arc<RedisStore>,
    maintain: JoinHandle<StoreError>,
    prefix: String,
}

impl std::fmt::Debug for RedisSimulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSimulation")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSimulation {
    /// Connects to `url` (`redis://`, `rediss://`, `redis+cluster://`…)
    /// under a new key prefix, and a simulation of `config` on it.
    pub async fn start(
        url: &str,
        config: Config,
        options: RedisOptions,
    ) -> Result<(Self, Simulation), StoreError> {
        let clock = Arc::new(ManualClock::new(0));
        let prefix = format!("charon:simulate-{:016x}", rand_id());
        let store = RedisStore::connect(
            url,
            RedisOptions {
                server_id: "simulate".to_owned(),
                key_prefix: prefix.clone(),
                clock: Some(clock.clone()),
                // Nobody else uses this prefix: no other member can hold
                // copies that a new generation would wait for.
                rebuild_grace: Some(Duration::ZERO),
                ..options
            },
        )
        .await?;
        let upkeep = store.clone();
        let maintain = tokio::spawn(async move { upkeep.maintain().await });
        let sim = Simulation::with_store(config, clock, store.clone());
        Ok((
            Self {
                store,
                maintain,
                prefix,
            },
            sim,
        ))
    }

    /// The key prefix of this replay.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Stops the upkeep and deletes every key of the replay; how many.
    pub async fn finish(self) -> Result<u64, StoreError> {
        self.maintain.abort();
        self.store.forget_all().await
    }
}

/// 64 bits from the standard library's randomly keyed hasher (no new
/// dependency for a name).
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
