//! Latency and throughput of `request` with the Redis store against the
//! in-memory store, and Redis commands per decision, on a private
//! redis-server: `cargo bench -p charon-store --bench redis_store`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::config::{CopyLimits, Enforcement, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_store::{MemoryStore, RedisOptions, RedisStore, Store, SystemClock};
use charon_testkit::RedisServer;

const TIERS: &[Tier] = &[
    Tier {
        limit: 1_000_000,
        window: 1_000,
        active: None,
        cooldown: 0,
        skippable: false,
    },
    Tier {
        limit: 1_000_000,
        window: 1_000,
        active: Some(10_000),
        cooldown: 10_000,
        skippable: false,
    },
];

fn limits() -> RateLimits<'static> {
    RateLimits {
        hard_limit: Some(1_000_000),
        global_limit: Some(10_000_000),
        tiers: TIERS,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn latency(store: &dyn Store, n: usize) -> (Duration, Duration) {
    let one = Amount::exactly(1).unwrap();
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let d = format!("d{}", i % 100);
        let start = Instant::now();
        store
            .request("api/bench", &d, limits(), one, Enforcement::Enforce)
            .await
            .unwrap();
        times.push(start.elapsed());
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

async fn throughput(store: Arc<dyn Store>, tasks: usize, for_: Duration) -> (f64, Duration) {
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let one = Amount::exactly(1).unwrap();
            let mut times = Vec::new();
            let mut i = 0usize;
            while start.elapsed() < for_ {
                let d = format!("d{}", (t * 7919 + i) % 1000);
                let s = Instant::now();
                store
                    .request("api/bench", &d, limits(), one, Enforcement::Enforce)
                    .await
                    .unwrap();
                times.push(s.elapsed());
                i += 1;
            }
            times
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort();
    (all.len() as f64 / secs, percentile(&all, 0.99))
}

/// (EVALSHA calls, microseconds Redis spent in them) since the last call.
/// Every command a client sends is counted under its name; the rate store
/// sends nothing but EVALSHA for a decision (the commands a script runs
/// are counted too, under theirs).
fn evalsha_stats(redis: &RedisServer) -> (u64, f64) {
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    let field = |line: &str, name: &str| -> f64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .map_or((0, 0.0), |l| (field(l, "calls") as u64, field(l, "usec")))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), RedisOptions::default())
        .await
        .unwrap();
    let _m = {
        let s = store.clone();
        tokio::spawn(async move { s.maintain().await })
    };
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(Arc::new(SystemClock::new())));

    // Warm up (scripts loaded, connection established).
    latency(&*store, 200).await;

    evalsha_stats(&redis);
    let n = 5_000;
    let (p50, p99) = latency(&*store, n).await;
    let (calls, usec) = evalsha_stats(&redis);
    println!(
        "redis  request, one at a time:  p50 {p50:?}  p99 {p99:?}  \
         EVALSHA per decision {:.2}, Redis time per decision {:.1}µs",
        calls as f64 / n as f64,
        usec / calls as f64
    );
    let (p50, p99) = latency(&*memory, n).await;
    println!("memory request, one at a time:  p50 {p50:?}  p99 {p99:?}");

    for tasks in [16, 64] {
        evalsha_stats(&redis);
        let (rate, p99) = throughput(store.clone(), tasks, Duration::from_secs(3)).await;
        let (calls, usec) = evalsha_stats(&redis);
        println!(
            "redis  request, {tasks:3} concurrent: {rate:9.0}/s  p99 {p99:?}  Redis time per decision {:.1}µs",
            usec / calls as f64
        );
        let (rate, p99) = throughput(memory.clone(), tasks, Duration::from_secs(3)).await;
        println!("memory request, {tasks:3} concurrent: {rate:9.0}/s  p99 {p99:?}");
    }

    // A copy round: reserve then release, one at a time.
    let l = CopyLimits {
        domain_limit: 1_000,
        global_limit: None,
        groups: vec![],
    };
    let one = Amount::exactly(1).unwrap();
    let hold = Hold::new("vm/bench", "d", []);
    let mut times = Vec::new();
    for _ in 0..2_000 {
        let s = Instant::now();
        store
            .reserve("vm/bench", "d", &l, one, Enforcement::Enforce)
            .await
            .unwrap();
        store.release(&hold, 1).await.unwrap();
        times.push(s.elapsed());
    }
    times.sort();
    println!(
        "redis  reserve + release:        p50 {:?}  p99 {:?}",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}
