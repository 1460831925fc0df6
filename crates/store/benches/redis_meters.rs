//! What each kind costs Redis, on a private redis-server: the bytes per
//! pair (`MEMORY USAGE` of its keys, and `used_memory` grown per pair, the
//! keyspace's own tables included) and the Redis CPU per decision
//! (`INFO commandstats`: EVALSHA calls per decision and microseconds per
//! call, the commands the script runs included).
//!
//! Run: `cargo bench -p charon-store --bench redis_meters`
//! (`REDIS_METER_PAIRS`, default 100000: pairs written per kind).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::meter::{Meter, Op, Policy, SoftLimit};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{bucket, queue, window};
use charon_store::{RedisOptions, RedisStore, Store};
use charon_testkit::RedisServer;

/// Requests in flight at once while the pairs are written.
const CONCURRENCY: usize = 32;

/// Decisions timed per kind (on pairs already written).
const TIMED: usize = 20_000;

const TIERS: &[Tier] = &[
    Tier {
        limit: 5,
        window: 1_000,
        active: None,
        cooldown: 0,
        skippable: false,
    },
    Tier {
        limit: 25,
        window: 1_000,
        active: Some(5_000),
        cooldown: 15_000,
        skippable: false,
    },
];

/// What is decided: burst tiers, or one of the meters.
#[derive(Clone)]
enum Kind {
    Tiers,
    Meter(Meter),
}

async fn decide(store: &RedisStore, resource: &str, domain: &str, kind: &Kind) {
    let one = Amount::exactly(1).unwrap();
    match kind {
        Kind::Tiers => {
            let limits = RateLimits {
                hard_limit: Some(100),
                global_limit: None,
                tiers: TIERS,
            };
            store
                .request(resource, domain, limits, one, Enforcement::Enforce)
                .await
                .unwrap();
        }
        Kind::Meter(m) => {
            store
                .meter(resource, domain, m, Op::request(one))
                .await
                .unwrap();
        }
    }
}

/// `domain` number `i`: 16 bytes, as the in-memory footprint bench.
fn domain(i: usize) -> String {
    format!("customer-{i:07}")
}

/// One request for each of `pairs` domains, `CONCURRENCY` at a time.
async fn write_pairs(store: &Arc<RedisStore>, resource: &str, kind: &Kind, pairs: usize) {
    let mut tasks = Vec::new();
    for t in 0..CONCURRENCY {
        let (store, resource, kind) = (store.clone(), resource.to_owned(), kind.clone());
        tasks.push(tokio::spawn(async move {
            for i in (t..pairs).step_by(CONCURRENCY) {
                decide(&store, &resource, &domain(i), &kind).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn info_field(info: &str, line_start: &str, name: &str) -> f64 {
    info.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn used_memory(c: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pairs: usize = std::env::var("REDIS_METER_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let p = Policy {
        soft_limit: Some(SoftLimit::percent(80).expect("valid")),
        ban: None,
    };
    // Per day: no key expires while the bench runs (a pair's key lives
    // until its state is idle, here at most a day).
    const DAY: u64 = 86_400_000;
    let kinds = [
        ("burst tiers (5/s; 25/s)", "tiers", Kind::Tiers),
        (
            "bucket (100 per day)",
            "bucket",
            Kind::Meter(Meter::Bucket(
                bucket::Params::new(100, 100, DAY, p).unwrap(),
            )),
        ),
        (
            "fixed window (100 per day)",
            "fixed",
            Kind::Meter(Meter::Window(
                window::Params::new(Algorithm::Fixed, 100, DAY, p).unwrap(),
            )),
        ),
        (
            "sliding counter (100 per day)",
            "sliding",
            Kind::Meter(Meter::Window(
                window::Params::new(Algorithm::SlidingCounter, 100, DAY, p).unwrap(),
            )),
        ),
        (
            "queue (10 per day, size 5)",
            "queue",
            Kind::Meter(Meter::Queue(queue::Params::new(10, DAY, 5, p).unwrap())),
        ),
    ];
    println!(
        "{pairs} pairs per kind (16-byte domains), each kind on a redis-server of its own, \
         then {TIMED} timed decisions on them"
    );
    for (label, resource, kind) in &kinds {
        // A server per kind: the keyspace's tables grow from the same size.
        let redis = RedisServer::start();
        let store = RedisStore::connect(&redis.url(), RedisOptions::default())
            .await
            .unwrap();
        let mut c = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        // Scripts loaded, connections made.
        decide(&store, resource, "warm-up", kind).await;
        let before = used_memory(&mut c);
        write_pairs(&store, resource, kind, pairs).await;
        let grown = used_memory(&mut c) - before;
        // The keys of this kind's pairs; MEMORY USAGE of a sample.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{{{resource}}}*customer-0000???"))
            .query(&mut c)
            .unwrap();
        let per_pair_keys = keys.len() as f64 / 1_000.0;
        let mut usage = 0u64;
        for k in &keys {
            let u: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .arg("SAMPLES")
                .arg(0)
                .query(&mut c)
                .unwrap();
            usage += u.unwrap_or(0);
        }
        let sample: Vec<String> = keys
            .iter()
            .filter(|k| k.ends_with("customer-0000010"))
            .map(|k| {
                let t: String = redis::cmd("TYPE").arg(k).query(&mut c).unwrap();
                let v: Option<String> = (t == "string")
                    .then(|| redis::cmd("GET").arg(k).query(&mut c).ok())
                    .flatten();
                format!(
                    "{k} ({t}{})",
                    v.map(|v| format!(" {v:?}")).unwrap_or_default()
                )
            })
            .collect();
        let sample = sample.join(", ");
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
        for j in 0..TIMED {
            let i = (j * 7_919) % pairs;
            decide(&store, resource, &domain(i), kind).await;
        }
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .unwrap();
        let calls = info_field(&info, "cmdstat_evalsha:", "calls");
        let usec = info_field(&info, "cmdstat_evalsha:", "usec");
        println!(
            "{label:<34} {:5.1} keys/pair, MEMORY USAGE {:6.1} B/pair, used_memory +{:6.1} B/pair; \
             EVALSHA {:.2}/decision, {:5.2} µs/call",
            per_pair_keys,
            usage as f64 / 1_000.0,
            grown / pairs as f64,
            calls / TIMED as f64,
            usec / calls.max(1.0),
        );
        println!("    e.g. {sample}");
    }
}
