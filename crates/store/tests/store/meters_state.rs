//! What each store keeps for buckets, windows and queues: idle state is
//! gone once its forget time has passed (the in-memory store's table
//! shrinks; Redis keys expire by themselves at the time `drain.lua` or `window.lua` set),
//! a rejection without a ban writes nothing, and Redis `MEMORY USAGE` of
//! one key of each kind (printed). The in-memory store's bytes per pair are
//! measured by `cargo bench -p charon-store --bench meter_footprint`.

use std::sync::Arc;
use std::time::Duration;

use charon_core::meter::{Ban, Meter, Op, Policy};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{ManualClock, bucket, queue, window};
use charon_store::{MemoryStore, RedisStore, Store};
use charon_testkit::RedisServer;
use charon_testkit::stores::{options, raw, spawn_maintain};

fn one() -> Op {
    Op::request(Amount::exactly(1).unwrap())
}

fn bucket(burst: u64, count: u64, period: u64, ban: Option<u64>) -> Meter {
    let policy = Policy {
        soft_limit: None,
        ban: ban.map(|b| Ban::new(b).unwrap()),
    };
    Meter::Bucket(bucket::Params::new(burst, count, period, policy).unwrap())
}

fn window(algorithm: Algorithm, limit: u64, span: u64) -> Meter {
    Meter::Window(window::Params::new(algorithm, limit, span, Policy::default()).unwrap())
}

fn queue(rate: u64, period: u64, size: u64) -> Meter {
    Meter::Queue(queue::Params::new(rate, period, size, Policy::default()).unwrap())
}

#[tokio::test]
async fn memory_forgets_idle_meters_and_writes_nothing_on_a_plain_rejection() {
    let clock = Arc::new(ManualClock::new(1_000));
    let store = MemoryStore::new(clock.clone());
    let b = bucket(2, 1, 200, None);
    // A rejection of an empty bucket (more than the burst) keeps nothing.
    let big = Op::request(Amount::exactly(3).unwrap());
    assert_eq!(store.meter("r", "a", &b, big).await.unwrap().granted, 0);
    assert_eq!(
        store.meter_count(),
        0,
        "a rejection without a ban writes nothing"
    );
    // Two tokens: full again at 1 400.
    store.meter("r", "a", &b, one()).await.unwrap();
    store.meter("r", "a", &b, one()).await.unwrap();
    assert_eq!(store.meter_count(), 1);
    let rejected = store.meter("r", "a", &b, one()).await.unwrap();
    assert_eq!((rejected.granted, rejected.reset_after_ms), (0, 400));
    clock.set(1_399);
    assert_eq!(store.sweep().pairs, 0, "not idle before its forget time");
    clock.set(1_400);
    assert_eq!(store.sweep().pairs, 1);
    assert_eq!(store.meter_count(), 0, "idle at its forget time, swept");
    // Dropped on access as well: a dry run at the forget time.
    store.meter("r", "b", &b, one()).await.unwrap();
    clock.set(1_600);
    let dry = Op::dry_run(Amount::exactly(1).unwrap());
    store.meter("r", "b", &b, dry).await.unwrap();
    assert_eq!(store.meter_count(), 0, "idle state dropped when next used");
    // A ban is kept until it ends, a window until it turns (two for a
    // sliding counter), a queue until it is empty.
    let banned = bucket(1, 1, 100, Some(1_000));
    store.meter("r", "c", &banned, one()).await.unwrap();
    store.meter("r", "c", &banned, one()).await.unwrap();
    let w = window(Algorithm::SlidingCounter, 5, 300);
    store.meter("w", "c", &w, one()).await.unwrap();
    let q = queue(1, 100, 5);
    store
        .meter("q", "c", &q, Op::request(Amount::exactly(3).unwrap()))
        .await
        .unwrap();
    assert_eq!(store.meter_count(), 3);
    clock.set(1_899);
    store.sweep();
    assert_eq!(store.meter_count(), 3);
    clock.set(1_900);
    store.sweep();
    assert_eq!(store.meter_count(), 2, "the queue is empty at 1 900");
    clock.set(2_100);
    store.sweep();
    assert_eq!(
        store.meter_count(),
        1,
        "the sliding window of [1 500, 1 800) is forgotten at 2 100"
    );
    clock.set(2_600);
    store.sweep();
    assert_eq!(store.meter_count(), 0, "the ban ends at 2 600");
}

async fn redis_store(server: &RedisServer) -> Arc<RedisStore> {
    // Redis TIME decides, so keys expire at the times the script set.
    RedisStore::connect(
        &server.url(),
        options(None, "meters", Duration::from_secs(10)),
    )
    .await
    .unwrap()
}

fn get(c: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

#[tokio::test]
async fn redis_keys_expire_when_idle_and_are_not_written_on_a_plain_rejection() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let maintain = spawn_maintain(&store);
    let mut c = raw(&server);
    let key = "charon:{r}:m:a";
    let b = bucket(2, 1, 300, None);
    let big = Op::request(Amount::exactly(3).unwrap());
    assert_eq!(store.meter("r", "a", &b, big).await.unwrap().granted, 0);
    assert_eq!(
        get(&mut c, key),
        None,
        "a rejection without a ban writes nothing"
    );
    store.meter("r", "a", &b, one()).await.unwrap();
    store.meter("r", "a", &b, one()).await.unwrap();
    let value = get(&mut c, key).unwrap();
    assert!(value.starts_with("b:") && !value.contains(';'), "{value}");
    let ttl = pttl(&mut c, key);
    assert!(0 < ttl && ttl <= 600, "expires when full again: {ttl}");
    let r = store.meter("r", "a", &b, one()).await.unwrap();
    assert_eq!(r.granted, 0);
    assert_eq!(
        get(&mut c, key).unwrap(),
        value,
        "a rejection without a ban writes nothing"
    );
    assert!(pttl(&mut c, key) <= ttl, "nor moves the expiry");
    let usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(&mut c)
        .unwrap();
    println!("redis store, bucket: MEMORY USAGE {key} = {usage} bytes (value {value:?})");

    // A window and a queue, and a ban that outlives the refill.
    let w = window(Algorithm::SlidingCounter, 5, 200);
    store.meter("r", "w", &w, one()).await.unwrap();
    let q = queue(1, 100, 5);
    store
        .meter("r", "q", &q, Op::request(Amount::exactly(2).unwrap()))
        .await
        .unwrap();
    let banned = bucket(1, 1, 100, Some(700));
    store.meter("r", "ban", &banned, one()).await.unwrap();
    store.meter("r", "ban", &banned, one()).await.unwrap();
    for (what, key) in [
        ("sliding counter", "charon:{r}:m:w"),
        ("queue", "charon:{r}:m:q"),
        ("bucket with a ban", "charon:{r}:m:ban"),
    ] {
        let usage: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query(&mut c)
            .unwrap();
        let value = get(&mut c, key).unwrap();
        println!("redis store, {what}: MEMORY USAGE {key} = {usage} bytes (value {value:?})");
    }
    let ban_ttl = pttl(&mut c, "charon:{r}:m:ban");
    assert!(
        300 < ban_ttl && ban_ttl <= 700,
        "kept until the ban ends: {ban_ttl}"
    );
    assert!(pttl(&mut c, "charon:{r}:m:w") <= 400, "at most two windows");
    assert!(
        pttl(&mut c, "charon:{r}:m:q") <= 200,
        "until the queue is empty"
    );
    tokio::time::sleep(Duration::from_millis(650)).await;
    for k in [key, "charon:{r}:m:w", "charon:{r}:m:q"] {
        let exists: i64 = redis::cmd("EXISTS").arg(k).query(&mut c).unwrap();
        assert_eq!(exists, 0, "{k} expired by itself once idle");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg("charon:{r}:m:ban")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        exists, 0,
        "the banned bucket's key expired when the ban ended"
    );
    maintain.abort();
}

/// Redis CPU per decision (`INFO commandstats`, `usec_per_call` of
/// `EVALSHA`) for each kind: 2 000 decisions on 100 domains. Debug builds
/// do not matter here: the time is Redis'.
#[tokio::test]
async fn redis_cpu_per_decision() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let mut c = raw(&server);
    for (name, m) in [
        ("bucket", bucket(100, 100, 60_000, None)),
        ("fixed window", window(Algorithm::Fixed, 100, 60_000)),
        (
            "sliding counter",
            window(Algorithm::SlidingCounter, 100, 60_000),
        ),
        ("queue", queue(10, 1_000, 50)),
    ] {
        let () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
        for i in 0..2_000 {
            store
                .meter("api/search", &format!("d{}", i % 100), &m, one())
                .await
                .unwrap();
        }
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .unwrap();
        let line = info
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .unwrap_or("cmdstat_evalsha: none")
            .to_owned();
        println!("redis store, {name}: {line}");
        assert!(
            line.contains("calls=2000,"),
            "one script call per decision: {line}"
        );
    }
}
