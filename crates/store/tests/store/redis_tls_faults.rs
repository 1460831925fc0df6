//! Faults of a TLS Redis (mutual TLS, a private CA), which the plain fault
//! tests do not cover: a TLS connection has its own state (a handshake,
//! records in flight) that a stall or a restart must not wedge.
//! - a stall shorter than the operation timeout answers every decision in
//!   flight, exactly;
//! - a longer one fails them as server errors within the timeout, and the
//!   store answers again by itself once Redis does;
//! - a restart (empty, same port) is followed by a fresh handshake: the
//!   store decides again, without being reconnected by hand.

use std::sync::Arc;
use std::time::Duration;

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::rate::RateReply;
use charon_core::request::Amount;
use charon_store::{RedisStore, Store, StoreError};
use charon_testkit::stores::{eventually, options, spawn_maintain};
use charon_testkit::{RedisServer, RedisSetup, RedisTlsSetup, TestPki};

/// Liveness ttl: the operation timeout is a quarter of it (1 s), and the
/// longer stall below stays inside it, so the membership survives.
const TTL: Duration = Duration::from_millis(4_000);

const TIERS: [Tier; 1] = [Tier {
    limit: 1_000,
    window: 60_000,
    active: None,
    cooldown: 0,
    skippable: false,
}];

fn limits() -> RateLimits<'static> {
    RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &TIERS,
    }
}

async fn tls_store(pki: &TestPki, redis: &RedisServer) -> Arc<RedisStore> {
    let tls = charon_testkit::stores::redis_tls(pki, true);
    let store = RedisStore::connect(
        &redis.url(),
        charon_store::RedisOptions {
            tls,
            ..options(None, "tls-faults", TTL)
        },
    )
    .await
    .unwrap();
    spawn_maintain(&store);
    store
}

fn tls_redis(pki: &TestPki) -> RedisServer {
    RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(pki, "yes")),
        ..RedisSetup::default()
    })
}

/// One hit on the pair every test uses.
async fn hit(store: &RedisStore) -> Result<RateReply, StoreError> {
    store
        .request(
            "api",
            "d",
            limits(),
            Amount::exactly(1).unwrap(),
            Enforcement::Enforce,
        )
        .await
}

/// `n` single hits on one pair at once; their results in order.
async fn hits(store: &Arc<RedisStore>, n: usize) -> Vec<Result<u64, StoreError>> {
    let calls = (0..n).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { hit(&store).await.map(|r| r.granted) })
    });
    let mut out = Vec::with_capacity(n);
    for call in calls.collect::<Vec<_>>() {
        out.push(call.await.unwrap());
    }
    out
}

/// The hits Redis counted for the pair so far, through one more hit.
async fn granted_so_far(store: &Arc<RedisStore>) -> u64 {
    let r = hit(store).await.unwrap();
    assert_eq!(r.granted, 1);
    r.tier_hits - 1
}

/// Sends one hit at a time until one is answered (within 10 s, else the
/// test fails: the store did not recover `when`); how many were sent.
async fn decides_again(store: &Arc<RedisStore>, when: &str) -> u64 {
    let mut attempts = 0;
    let recovered = eventually(Duration::from_secs(10), async || {
        attempts += 1;
        hits(store, 1).await[0].is_ok()
    })
    .await;
    assert!(recovered.is_some(), "the store decides again {when}");
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_timeout_answers_every_decision_in_flight() {
    let pki = TestPki::new();
    let redis = tls_redis(&pki);
    let store = tls_store(&pki, &redis).await;
    assert_eq!(granted_so_far(&store).await, 0);

    redis.stop();
    let in_flight = tokio::spawn({
        let store = store.clone();
        async move { hits(&store, 20).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.resume();
    let results = in_flight.await.unwrap();
    assert!(
        results.iter().all(|r| matches!(r, Ok(1))),
        "every hit of a short stall is granted: {results:?}"
    );
    // Exactly once each: the probe hit before, the 20, and this one.
    assert_eq!(granted_so_far(&store).await, 1 + 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_stall_fails_decisions_as_server_errors_and_the_store_recovers() {
    let pki = TestPki::new();
    let redis = tls_redis(&pki);
    let store = tls_store(&pki, &redis).await;
    assert_eq!(granted_so_far(&store).await, 0);

    redis.stop();
    let results = hits(&store, 10).await;
    for r in &results {
        assert!(
            matches!(r, Err(StoreError::Unavailable(_))),
            "a decision during a stall past the timeout is a server error: {r:?}"
        );
    }
    // Still stalled: the next decision fails as well, and does not hang.
    assert!(matches!(
        hits(&store, 1).await[0],
        Err(StoreError::Unavailable(_))
    ));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    redis.resume();

    let attempts = decides_again(&store, "after the stall").await;
    // What timed out may or may not have reached Redis (a decision in doubt
    // errs towards leniency), but nothing was counted twice: at least the
    // probe and the hit that answered, at most every hit sent.
    let counted = granted_so_far(&store).await;
    assert!(
        (2..=1 + 11 + attempts).contains(&counted),
        "between the hits that surely ran and all of them: {counted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_tls_redis_gets_a_fresh_handshake_and_decisions_resume() {
    let pki = TestPki::new();
    let mut redis = tls_redis(&pki);
    let store = tls_store(&pki, &redis).await;
    assert_eq!(granted_so_far(&store).await, 0);

    redis.restart_after(Duration::from_millis(300));
    decides_again(&store, "on the restarted Redis").await;
    // Redis came back empty: the pair starts over.
    let counted = granted_so_far(&store).await;
    assert!(counted <= 2, "an empty Redis holds no old hits: {counted}");
}
