//! Runs a replay in both stores: the in-memory store, and the Redis store
//! of `charon simulate --store redis://` on a private redis-server (its
//! Lua scripts deciding on the replay's virtual clock). The two must print
//! the same lines; the replay's keys must be gone when it ends.

use charon_core::config::Config;
use charon_simulate::Simulation;
use charon_simulate::redis::{RedisOptions, RedisSimulation};
use charon_testkit::RedisServer;
use serde_json::Value;

/// The replies to `events` in the in-memory store, after checking that the
/// Redis store (a private redis-server) gives the very same, and leaves
/// no key behind.
pub fn run(config: &str, events: &[Value]) -> Vec<Value> {
    let redis = RedisServer::start();
    let replies = run_at(config, events, &redis.url());
    assert_eq!(keys_left(&redis), 0, "keys left in Redis after the replay");
    replies
}

/// [`run`] against the Redis store at `url` (a Redis Cluster's, say).
pub fn run_at(config: &str, events: &[Value], url: &str) -> Vec<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let config = Config::from_yaml(config).expect("valid").0;
    let mut memory = Simulation::new(config.clone());
    let in_memory: Vec<Value> = events
        .iter()
        .map(|e| runtime.block_on(memory.event(e)))
        .collect();
    let (run, mut sim) = runtime
        .block_on(RedisSimulation::start(url, config, RedisOptions::default()))
        .expect("a replay on the private redis");
    let in_redis: Vec<Value> = events
        .iter()
        .map(|e| runtime.block_on(sim.event(e)))
        .collect();
    drop(sim);
    let deleted = runtime
        .block_on(run.finish())
        .expect("the replay's keys deleted");
    assert!(deleted > 0, "the replay wrote keys, and deleted them");
    for (i, (m, r)) in in_memory.iter().zip(&in_redis).enumerate() {
        assert_eq!(m, r, "event {i} ({}): memory vs Redis", events[i]);
    }
    in_memory
}

/// How many keys the private Redis holds.
pub fn keys_left(redis: &RedisServer) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "DBSIZE"])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a count")
}
