//! Stores under test (feature `store`): each fixture is a store on a manual
//! clock, the Redis one on a private `redis-server` with its membership
//! duties running as a server would run them, plus the helpers the store's
//! and the limiter's Redis tests share (members joining one Redis, a raw
//! connection to it, copy logs to compare with).
//!
//! One home, so the store's tests and the limiter's tests (which sit above
//! the store and must not need each other) set up a store the same way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::meter::testing as shapes;
use charon_core::meter::{Meter, Policy};
use charon_core::testing::{self as rate_shapes, Draw};
use charon_core::{ManualClock, bucket, queue, window};
use charon_store::{
    CopyLog, Limit, MemoryStore, MeterOp, RedisOptions, RedisStore, RedisTls, Store, StoreError,
};
use rand::RngExt;
use rand::rngs::StdRng;
use tokio::task::JoinHandle;

use crate::{RedisCluster, RedisServer};

/// A store under test, its clock, and whatever keeps it running.
#[derive(Debug)]
pub struct Fixture {
    /// The clock the store decides on.
    pub clock: Arc<ManualClock>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The private Redis behind it, if any (killed on drop).
    pub redis: Option<RedisServer>,
    /// The private Redis Cluster of [`redis_cluster`].
    pub cluster: Option<RedisCluster>,
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
        cluster: None,
        maintain: None,
    }
}

/// The Redis store on a private redis-server, deciding on a manual clock.
pub async fn redis() -> Fixture {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(0));
    let opts = options(Some(clock.clone()), "test", Duration::from_secs(10));
    let store = RedisStore::connect(&server.url(), opts)
        .await
        .expect("connect to the private redis");
    let maintain = spawn_maintain(&store);
    Fixture {
        clock,
        store,
        redis: Some(server),
        cluster: None,
        maintain: Some(maintain),
    }
}

/// The Redis store on a private Redis Cluster (three masters, three
/// replicas), on a manual clock.
pub async fn redis_cluster() -> Fixture {
    let cluster = RedisCluster::start();
    let clock = Arc::new(ManualClock::new(0));
    // Copy writes wait for a replica's acknowledgement for half the store
    // timeout: with six redis-servers beside a parallel test suite on two
    // cores, 500 ms was once not enough (CI: "no replica … confirmed
    // reserve within 500 ms"). The cluster's own tests of that wait use
    // their own timeouts.
    let opts = RedisOptions {
        op_timeout: Duration::from_secs(4),
        ..options(Some(clock.clone()), "test", Duration::from_secs(10))
    };
    let store = RedisStore::connect(&cluster.url(), opts)
        .await
        .expect("connect to the private Redis Cluster");
    let maintain = spawn_maintain(&store);
    Fixture {
        clock,
        store,
        redis: None,
        cluster: Some(cluster),
        maintain: Some(maintain),
    }
}

/// Options for tests with the given liveness ttl (crash tests use short
/// ones so that they are fast), deciding on `clock` (Redis `TIME` if
/// `None`).
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

/// A member with the production rebuild grace (half the ttl), once it
/// can serve copies: the first member of a new Redis waits out the window
/// in which servers holding copies could still show up.
pub async fn member(redis: &RedisServer, id: &str, ttl: Duration) -> Arc<RedisStore> {
    let s = RedisStore::connect(
        &redis.url(),
        RedisOptions {
            rebuild_grace: None,
            ..options(None, id, ttl)
        },
    )
    .await
    .expect("connect to the private redis");
    let maintain = spawn_maintain(&s);
    let ready = eventually(ttl * 3, async || s.ping().await.is_ok()).await;
    maintain.abort();
    assert!(ready.is_some(), "{id} can serve copies");
    s
}

/// A plain connection to `redis`, to look at or damage its keys.
pub fn raw(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("a raw connection to the private redis")
}

/// A copy log to compare with: `global` copies, these domain counts, and
/// `g1` in group `g1` (no group entry when 0).
pub fn copy_log(global: u64, domains: &[(&str, u64)], g1: u64) -> CopyLog {
    CopyLog {
        global,
        domains: domains.iter().map(|(d, n)| ((*d).to_owned(), *n)).collect(),
        groups: if g1 > 0 {
            [("g1".to_owned(), g1)].into()
        } else {
            Default::default()
        },
    }
}

/// Polls `f` until it returns true or `within` passes; returns how long it
/// took.
pub async fn eventually(within: Duration, mut f: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The seeds a differential test runs: `CHARON_DIFF_SEED` alone, to replay
/// one failure, else 1 to `CHARON_DIFF_SEEDS` (24 by default). One reading,
/// so every differential test replays the way its failure message says.
pub fn diff_seeds() -> Vec<u64> {
    match std::env::var("CHARON_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("CHARON_DIFF_SEED is a number")],
        Err(_) => {
            let n = std::env::var("CHARON_DIFF_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(24);
            (1..=n).collect()
        }
    }
}

/// Prints how often a differential test compared each outcome, so a run
/// shows which shapes it reached.
pub fn print_outcomes(seen: &BTreeMap<String, usize>) {
    println!("outcomes compared:");
    for (k, v) in seen {
        println!("  {v:6}  {k}");
    }
}

/// The Redis side of one differential seed, deciding on `clock` with its
/// maintenance running: every seed in its own keys (`{prefix}{seed}`), so
/// seeds can share one redis-server.
pub async fn seed_store(
    redis: &RedisServer,
    clock: &Arc<ManualClock>,
    prefix: &str,
    seed: u64,
) -> (Arc<RedisStore>, JoinHandle<StoreError>) {
    seed_store_mutated(redis, clock, prefix, seed, None).await
}

/// [`seed_store`] whose meters scripts carry a deliberate `mutation`
/// (`RedisOptions::meters_mutation`), in keys of their own
/// (`{prefix}mut{seed}`), so that a test can show its differential
/// catches a script that breaks a rule.
pub async fn seed_store_mutated(
    redis: &RedisServer,
    clock: &Arc<ManualClock>,
    prefix: &str,
    seed: u64,
    mutation: Option<(&str, &str)>,
) -> (Arc<RedisStore>, JoinHandle<StoreError>) {
    let mutated = if mutation.is_some() { "mut" } else { "" };
    let options = RedisOptions {
        key_prefix: format!("{prefix}{mutated}{seed}"),
        meters_mutation: mutation.map(|(from, to)| (from.to_owned(), to.to_owned())),
        ..options(
            Some(clock.clone()),
            &format!("seed{seed}"),
            Duration::from_secs(10),
        )
    };
    let store = RedisStore::connect(&redis.url(), options)
        .await
        .expect("connect to the private redis");
    let maintain = spawn_maintain(&store);
    (store, maintain)
}

/// `charon_core::testing`'s source of numbers from a seed's rng: the
/// differential tests draw core's shapes from it, so a seed replays them.
#[derive(Debug)]
pub struct Seeded<'a>(pub &'a mut StdRng);

impl Draw for Seeded<'_> {
    fn draw(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        self.0.random_range(range)
    }
}

/// A random meter of `kind` (0 bucket, 1 window, 2 queue), spans in
/// multiples of `unit` ms: the shapes of `charon_core::meter::testing`,
/// which core's naive-model property tests check the engine on, for the
/// stores' differential tests to run through both stores.
pub fn meter(rng: &mut StdRng, kind: u64, unit: u64) -> Meter {
    let d = &mut Seeded(rng);
    match kind {
        0 => {
            let (burst, count, period, policy) = shapes::bucket(d, unit);
            Meter::Bucket(bucket::Params::new(burst, count, period, policy).unwrap())
        }
        1 => {
            let (algorithm, limit, span, policy) = shapes::window(d, unit);
            Meter::Window(window::Params::new(algorithm, limit, span, policy).unwrap())
        }
        _ => {
            let (rate, period, size, policy) = shapes::queue(d, unit);
            Meter::Queue(queue::Params::new(rate, period, size, policy).unwrap())
        }
    }
}

/// What decides a resource in the batch differential tests: a meter, or
/// burst tiers with H, G, a policy and (one time in ten)
/// `ignore_configured`.
#[derive(Debug)]
pub enum Kind {
    /// A bucket, window or queue.
    Meter(Meter),
    /// Burst tiers.
    Tiers(Vec<Tier>, Option<u64>, Option<u64>, Policy, Enforcement),
}

impl Kind {
    /// The limit of a [`MeterOp`] on this kind.
    pub fn limit(&self) -> Limit<'_> {
        match self {
            Kind::Meter(m) => Limit::Meter(m),
            Kind::Tiers(tiers, hard, global, policy, enforcement) => Limit::Tiers {
                limits: RateLimits {
                    hard_limit: *hard,
                    global_limit: *global,
                    tiers,
                },
                policy: *policy,
                enforcement: *enforcement,
            },
        }
    }
}

/// A random kind: 0–2 a meter (bucket, window, queue), 3 burst tiers, in
/// core's shapes (see [`meter`]).
pub fn kind(rng: &mut StdRng, kind: u64, unit: u64) -> Kind {
    if kind < 3 {
        return Kind::Meter(meter(rng, kind, unit));
    }
    let d = &mut Seeded(rng);
    let (tiers, hard, global) = rate_shapes::rate_limits(d, unit);
    let policy = shapes::policy(d, unit);
    let enforcement = if d.one_in(10) {
        Enforcement::Ignore
    } else {
        Enforcement::Enforce
    };
    Kind::Tiers(tiers, hard, global, policy, enforcement)
}

/// One operation on its own, outside an all-or-nothing batch: `meter` or
/// `tiers`; its outcome as text, to compare between stores.
pub async fn single(store: &dyn Store, o: &MeterOp<'_>) -> String {
    match o.limit {
        Limit::Meter(m) => format!("{:?}", store.meter(o.resource, o.domain, m, o.op).await),
        Limit::Tiers {
            limits,
            policy,
            enforcement,
        } => format!(
            "{:?}",
            store
                .tiers(o.resource, o.domain, limits, policy, o.op, enforcement)
                .await
        ),
    }
}

/// The store's TLS options for a Redis whose certificates `pki` made:
/// trust its CA, and present its client certificate if `client`.
#[cfg(feature = "tls")]
pub fn redis_tls(pki: &crate::TestPki, client: bool) -> RedisTls {
    use crate::TestPki;
    RedisTls {
        ca_pem: Some(TestPki::read(&pki.ca())),
        client: client.then(|| charon_store::ClientCertificate {
            cert_pem: TestPki::read(&pki.client_cert()),
            key_pem: TestPki::read(&pki.client_key()),
        }),
    }
}

/// Asserts that a differential test catches each deliberate mutation of a
/// Redis script: `fails(seed, (from, to))` runs the test with `from`
/// replaced by `to` in the script and says whether it failed, for the
/// `seeds` in turn until one does. A mutation no seed catches means the
/// test cannot see the rule the mutation breaks.
pub async fn assert_each_mutation_caught(
    mutations: &[(&'static str, &'static str)],
    seeds: std::ops::RangeInclusive<u64>,
    mut fails: impl AsyncFnMut(u64, (&'static str, &'static str)) -> bool,
) {
    for &(from, to) in mutations {
        let mut caught = false;
        for seed in seeds.clone() {
            if fails(seed, (from, to)).await {
                caught = true;
                break;
            }
        }
        assert!(caught, "the mutation {from:?} -> {to:?} went unnoticed");
    }
}
