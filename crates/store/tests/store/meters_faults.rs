//! Buckets, windows and queues when Redis misbehaves: a stall shorter
//! than the store's time limit only slows a decision; a longer one is a
//! prompt server error (never a hang, never a wrong grant), and the
//! decision that timed out counts at most once; a Redis that comes back
//! empty (restarted without its data) forgets the meters, so they err on
//! the side of leniency, and they decide at once, without waiting for the
//! copies' rebuild.
//!
//! Each test prints one `FAULT` line: what was injected, what was
//! expected, what was seen.

use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::bucket;
use charon_core::meter::{Meter, Op, Policy};
use charon_core::request::Amount;
use charon_store::{RedisStore, Store, StoreError};
use charon_testkit::RedisServer;
use charon_testkit::stores::{options, raw, spawn_maintain};

/// Liveness ttl of these stores; their time limit per operation is
/// `ttl / 4`, capped at 1 s (`charon_testkit::stores::options`).
const TTL: Duration = Duration::from_secs(4);
const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// Five tokens, one back an hour: nothing refills during a test.
fn slow_bucket() -> Meter {
    Meter::Bucket(bucket::Params::new(5, 1, 3_600_000, Policy::default()).unwrap())
}

fn units(n: u64) -> Amount {
    Amount::exactly(n).unwrap()
}

async fn store(server: &RedisServer) -> Arc<RedisStore> {
    RedisStore::connect(&server.url(), options(None, "meters", TTL))
        .await
        .unwrap()
}

/// Tokens left, by a dry run of one (its `remaining` is as if granted).
async fn tokens(store: &RedisStore, meter: &Meter) -> u64 {
    let r = store
        .meter("r", "d", meter, Op::dry_run(units(1)))
        .await
        .unwrap();
    r.remaining + r.granted
}

#[tokio::test]
async fn redis_stalled_shorter_than_the_time_limit_only_slows_a_meter() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let _maintain = spawn_maintain(&store);
    let b = slow_bucket();
    store
        .meter("r", "d", &b, Op::request(units(1)))
        .await
        .unwrap();

    let stall = Duration::from_millis(300);
    server.stop();
    let resume = {
        let pid = server.pid();
        tokio::spawn(async move {
            tokio::time::sleep(stall).await;
            charon_testkit::signal(pid, "CONT");
        })
    };
    let asked = Instant::now();
    let during = store.meter("r", "d", &b, Op::request(units(1))).await;
    let took = asked.elapsed();
    resume.await.unwrap();
    println!(
        "FAULT meter_redis_stall_0_3s: injected a {stall:?} SIGSTOP of Redis (time limit {OP_TIMEOUT:?}); \
         expected a grant after the stall; saw {during:?} after {took:?}"
    );
    let during = during.unwrap();
    assert_eq!(during.granted, 1);
    assert_eq!(during.remaining, 3);
    assert!(took >= stall - Duration::from_millis(50), "{took:?}");
    assert!(took < OP_TIMEOUT, "{took:?}");
    assert_eq!(tokens(&store, &b).await, 3);
}

#[tokio::test]
async fn redis_stalled_longer_than_the_time_limit_is_a_prompt_server_error() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let _maintain = spawn_maintain(&store);
    let b = slow_bucket();
    store
        .meter("r", "d", &b, Op::request(units(1)))
        .await
        .unwrap();

    server.stop();
    let asked = Instant::now();
    let during = store.meter("r", "d", &b, Op::request(units(1))).await;
    let took = asked.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.resume();
    let recovered = async {
        let deadline = Instant::now() + TTL * 3;
        loop {
            if let Ok(n) = store
                .meter("r", "d", &b, Op::dry_run(units(1)))
                .await
                .map(|r| r.remaining + r.granted)
            {
                return Some(n);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    .await;
    println!(
        "FAULT meter_redis_stall_3s: injected a 3 s SIGSTOP of Redis (time limit {OP_TIMEOUT:?}); \
         expected a server error within the limit, then decisions again with the timed-out one counted at most once; \
         saw {during:?} after {took:?}, then {recovered:?} tokens of 5"
    );
    assert!(
        matches!(during, Err(StoreError::Unavailable(_))),
        "a server error during the stall: {during:?}"
    );
    assert!(took < OP_TIMEOUT + Duration::from_millis(500), "{took:?}");
    let left = recovered.expect("meters decide again once Redis resumes");
    // The request that timed out was already sent: Redis may run it when
    // it resumes (3 left) or not (4 left); never twice, never a refund.
    assert!(left == 3 || left == 4, "{left} tokens left of 5");
}

#[tokio::test]
async fn redis_back_empty_forgets_meters_and_they_decide_at_once() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let _maintain = spawn_maintain(&store);
    let b = slow_bucket();
    let all = store
        .meter("r", "d", &b, Op::request(units(5)))
        .await
        .unwrap();
    assert_eq!(all.granted, 5);
    let refused = store
        .meter("r", "d", &b, Op::request(units(1)))
        .await
        .unwrap();
    assert_eq!(refused.granted, 0);

    redis::cmd("FLUSHALL")
        .query::<()>(&mut raw(&server))
        .unwrap();
    let asked = Instant::now();
    let after = store.meter("r", "d", &b, Op::request(units(1))).await;
    let took = asked.elapsed();
    println!(
        "FAULT meter_redis_back_empty: injected FLUSHALL (Redis restarted without its data); \
         expected a full bucket again (lenient) and no wait for the copies' rebuild; saw {after:?} after {took:?}"
    );
    let after = after.unwrap();
    assert_eq!(after.granted, 1);
    assert_eq!(after.remaining, 4);
    assert!(took < OP_TIMEOUT, "{took:?}");
}
