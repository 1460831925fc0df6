//! Capacity leases in the stores (SPEC §12): the same lease decisions give
//! the same leases in memory, on Redis and on a Redis Cluster; on Redis,
//! servers deciding at once on one resource never over-commit and lose no
//! decision (compare and set), and a set whose leases all lapsed leaves
//! Redis.

use std::sync::Arc;

use charon_core::lease::{
    Algorithm, LeaseContext, LeaseParams, LeaseReply, LeaseSet, Quantity, Want, get_capacity,
    release_capacity,
};
use charon_store::{RedisStore, Store};
use charon_testkit::stores::Fixture;

fn params(capacity: u64, algorithm: Algorithm) -> LeaseParams {
    LeaseParams::new(Quantity::units(capacity).unwrap(), algorithm, 10_000, 1_000)
        .unwrap()
        .with_learning_mode(0)
        .unwrap()
}

async fn get(
    store: &dyn Store,
    resource: &str,
    p: &LeaseParams,
    client: &str,
    wants: f64,
) -> LeaseReply {
    let want = Want::parse(wants, 0.0, 1).unwrap();
    let mut reply = None;
    store
        .leases(resource, client, &mut |set: &mut LeaseSet, now| {
            let ctx = LeaseContext::root(p, 0, now);
            reply = Some(get_capacity(set, p, ctx, client, want));
        })
        .await
        .unwrap();
    reply.unwrap()
}

async fn release(store: &dyn Store, resource: &str, client: &str) -> bool {
    let mut released = false;
    store
        .leases(resource, client, &mut |set: &mut LeaseSet, now| {
            released = release_capacity(set, client, now);
        })
        .await
        .unwrap();
    released
}

fn units(q: Quantity) -> f64 {
    q.to_f64()
}

/// The paper's fair-share table through a store, then expiry and release.
async fn fair_shares_expiry_and_release(f: &Fixture) {
    let p = params(160, Algorithm::FairShare);
    let s = &*f.store;
    f.clock.set(1_000);
    for (c, w) in [("a", 100.0), ("b", 50.0), ("c", 45.0), ("d", 10.0)] {
        get(s, "db/qps", &p, c, w).await;
    }
    // A second round: everyone refreshes with the same wants.
    let mut got = Vec::new();
    for (c, w) in [("a", 100.0), ("b", 50.0), ("c", 45.0), ("d", 10.0)] {
        let r = get(s, "db/qps", &p, c, w).await;
        assert_eq!(r.expires_at_ms, 11_000);
        assert_eq!(r.refresh_interval_ms, 1_000);
        got.push(units(r.capacity));
    }
    assert_eq!(got, [55.0, 50.0, 45.0, 10.0], "the paper's table");
    let (now, sets) = s.lease_sets().await.unwrap();
    assert_eq!(now, 1_000);
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].1.sum_has_micros(), 160_000_000);

    assert!(release(s, "db/qps", "d").await);
    assert!(!release(s, "db/qps", "d").await, "released already");
    // At 11 s every lease has lapsed: released is false, nothing is left.
    f.clock.set(11_000);
    assert!(!release(s, "db/qps", "a").await);
    let r = get(s, "db/qps", &p, "e", 500.0).await;
    assert_eq!(units(r.capacity), 160.0, "alone: all of it");
    assert!(release(s, "db/qps", "e").await);
    assert!(
        s.lease_sets().await.unwrap().1.is_empty(),
        "an empty set is dropped"
    );
}

macro_rules! on_every_store {
    ($($store:ident),*) => {$(
        mod $store {
            #[tokio::test]
            async fn fair_shares_expiry_and_release() {
                let f = charon_testkit::stores::$store().await;
                super::fair_shares_expiry_and_release(&f).await;
            }
        }
    )*};
}

on_every_store!(memory, redis, redis_cluster);

/// Two servers on one Redis, 8 clients each asking at once, many rounds
/// with changing wants: the leases never add up to more than the capacity,
/// neither in any decision's set nor in what a third store reads from
/// Redis all along, and no decision is lost (every client's last reply is
/// what the set holds). Compare and set without its version check fails
/// it ("over-committed"); a read that trusts a stale cached set does not
/// (the write's version check refuses what was decided on it, and the
/// retry reads the whole set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_on_one_redis_never_over_commit() {
    let redis = charon_testkit::RedisServer::start();
    let connect = |id: &'static str| {
        let url = redis.url();
        async move {
            let opts =
                charon_testkit::stores::options(None, id, std::time::Duration::from_secs(10));
            RedisStore::connect(&url, opts).await.unwrap()
        }
    };
    let servers: [Arc<RedisStore>; 2] = [connect("a").await, connect("b").await];
    // A third store reads what Redis holds, all along.
    let watcher = connect("watcher").await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn({
        let done = done.clone();
        async move {
            let (mut samples, mut most) = (0u32, 0u128);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (now, sets) = watcher.lease_sets().await.unwrap();
                for (_, mut set) in sets {
                    charon_core::lease::expire(&mut set, now);
                    most = most.max(set.sum_has_micros());
                }
                samples += 1;
                tokio::task::yield_now().await;
            }
            (samples, most)
        }
    });
    let p = Arc::new(params(100, Algorithm::ProportionalShare));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let store = servers[(i % 2) as usize].clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let client = format!("client-{i}");
            let mut last = Quantity::ZERO;
            for round in 0..25u64 {
                let wants = ((i * 7 + round * 13) % 40) as f64 + 1.0;
                let want = Want::parse(wants, last.to_f64(), 1).unwrap();
                let mut seen = None;
                store
                    .leases("db/qps", &client, &mut |set: &mut LeaseSet, now| {
                        let ctx = LeaseContext::root(&p, 0, now);
                        let r = get_capacity(set, &p, ctx, &client, want);
                        seen = Some((r.capacity, set.sum_has_micros()));
                    })
                    .await
                    .unwrap();
                let (has, total) = seen.unwrap();
                assert!(total <= 100_000_000, "over-committed: {total} millionths");
                assert!(has.to_f64() <= wants);
                last = has;
            }
            (client, last)
        }));
    }
    let mut finals = Vec::new();
    for t in tasks {
        finals.push(t.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (samples, most) = sampler.await.unwrap();
    assert!(samples > 10, "{samples} samples");
    assert!(most <= 100_000_000, "Redis held {most} millionths of 100");
    let (_, sets) = servers[0].lease_sets().await.unwrap();
    let set = &sets.iter().find(|(r, _)| r == "db/qps").unwrap().1;
    assert_eq!(set.len(), 16);
    for (client, has) in finals {
        assert_eq!(
            set.get(&client).unwrap().has,
            has,
            "{client}: a decision was lost"
        );
    }
    assert!(set.sum_has_micros() <= 100_000_000);
}

/// A server that must read a large set (5,000 leases) is not starved by
/// one deciding from its cache in a tight loop: servers take turns on the
/// resource's decision lock. Without the lock every decision of the slow
/// one lost the race 32 times and failed (seen with 10,000 clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reading_a_large_set_is_not_starved_by_a_fast_one() {
    let redis = charon_testkit::RedisServer::start();
    let connect = |id: &'static str| {
        let url = redis.url();
        async move {
            let opts = charon_testkit::stores::options(None, id, std::time::Duration::from_secs(2));
            RedisStore::connect(&url, opts).await.unwrap()
        }
    };
    let (fast, slow) = (connect("fast").await, connect("slow").await);
    let p = Arc::new(params(100_000, Algorithm::FairShare));
    for i in 0..5_000 {
        get(&*fast, "db/qps", &p, &format!("c{i}"), 1.0).await;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = tokio::spawn({
        let (fast, p, stop) = (fast.clone(), p.clone(), stop.clone());
        async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                get(&*fast, "db/qps", &p, "hot", 1.0 + f64::from(n % 7)).await;
                n += 1;
            }
            n
        }
    });
    for i in 0..20 {
        // `get` unwraps: a starved decision fails the test.
        get(&*slow, "db/qps", &p, &format!("slow-{i}"), 2.0).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(hammer.await.unwrap() > 0);
}

/// Redis' command counts (`INFO commandstats`) by command, without INFO
/// itself.
fn command_counts(c: &mut ::redis::Connection) -> std::collections::BTreeMap<String, u64> {
    let info: String = ::redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?;
            (name != "info").then(|| (name.to_owned(), calls.parse().unwrap()))
        })
        .collect()
}

/// What one call of `f` made Redis run, by command (inside scripts too).
async fn commands_of(
    c: &mut ::redis::Connection,
    f: impl Future<Output = ()>,
) -> std::collections::BTreeMap<String, u64> {
    let before = command_counts(c);
    f.await;
    let after = command_counts(c);
    after
        .into_iter()
        .filter_map(|(name, n)| {
            let d = n - before.get(&name).copied().unwrap_or(0);
            (d > 0).then_some((name, d))
        })
        .collect()
}

/// A refresh on the server's current copy of the set is two calls to
/// Redis: its clock (`TIME`) and one script call (`lease_put.lua`: `HMGET`
/// of the version and lock, one `HSET`), four commands in
/// `INFO commandstats`; under a virtual clock the `TIME` goes. The first
/// decision of a server reads the set; so does one whose copy is stale.
#[tokio::test]
async fn a_refresh_on_a_current_copy_is_one_clock_read_and_one_script_call() {
    let redis = charon_testkit::RedisServer::start();
    let mut c = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let p = params(100, Algorithm::FairShare);
    let clock = Arc::new(charon_core::ManualClock::new(1_000));
    for (id, clock, expected) in [
        (
            "redis-time",
            None,
            vec![("evalsha", 1), ("hmget", 1), ("hset", 1), ("time", 1)],
        ),
        (
            "virtual",
            Some(clock),
            vec![("evalsha", 1), ("hmget", 1), ("hset", 1)],
        ),
    ] {
        let opts = charon_testkit::stores::options(clock, id, std::time::Duration::from_secs(10));
        let store = RedisStore::connect(&redis.url(), opts).await.unwrap();
        let resource = format!("db/{id}");
        for client in ["a", "b", "c"] {
            get(&*store, &resource, &p, client, 10.0).await;
        }
        for wants in [20.0, 30.0] {
            let ran = commands_of(&mut c, async {
                let r = get(&*store, &resource, &p, "a", wants).await;
                assert_eq!(units(r.capacity), wants);
            })
            .await;
            let expected: std::collections::BTreeMap<String, u64> = expected
                .iter()
                .map(|(n, k)| ((*n).to_owned(), *k))
                .collect();
            assert_eq!(ran, expected, "{id}: one refresh");
            let top_level = ran["evalsha"] + ran.get("time").unwrap_or(&0);
            assert!(top_level <= 2, "{id}: {top_level} calls");
        }
    }
}

/// Two servers on one Redis (a virtual clock), the scripts changed by
/// `mutation`: `a` gets 60 of 100 through server A, which keeps the set as
/// written; `b` gets the 40 left through server B; then `c` asks server A,
/// whose copy is one write behind. Returns the stores and `c`'s reply.
async fn stale_copy(
    mutation: Option<(&str, &str)>,
) -> (
    charon_testkit::RedisServer,
    Arc<charon_core::ManualClock>,
    [Arc<RedisStore>; 2],
    LeaseReply,
) {
    let redis = charon_testkit::RedisServer::start();
    let clock = Arc::new(charon_core::ManualClock::new(1_000));
    let mut stores = Vec::new();
    for id in ["a", "b"] {
        let opts = charon_store::RedisOptions {
            leases_mutation: mutation.map(|(a, b)| (a.to_owned(), b.to_owned())),
            ..charon_testkit::stores::options(
                Some(clock.clone()),
                id,
                std::time::Duration::from_secs(10),
            )
        };
        stores.push(RedisStore::connect(&redis.url(), opts).await.unwrap());
    }
    let [a, b]: [Arc<RedisStore>; 2] = stores.try_into().unwrap();
    let p = params(100, Algorithm::ProportionalShare);
    assert_eq!(
        units(get(&*a, "db/qps", &p, "a", 60.0).await.capacity),
        60.0
    );
    assert_eq!(
        units(get(&*b, "db/qps", &p, "b", 60.0).await.capacity),
        40.0
    );
    clock.advance(10);
    // Decided on A's copy, `c` would get B's 40 again.
    let c = get(&*a, "db/qps", &p, "c", 60.0).await;
    (redis, clock, [a, b], c)
}

/// Two servers on one Redis, one step at a time: a decision made on a copy
/// another server's write made stale is refused by the version check of
/// `lease_put.lua`, and the server reads what changed (from the ring of
/// `lease_get.lua`) and decides again. Without the version check, or with
/// the ring read one write short, the third client is granted capacity
/// the second holds: over-committed.
#[tokio::test]
async fn a_decision_on_a_stale_copy_is_refused_and_made_again() {
    let (_redis, clock, [a, b], c) = stale_copy(None).await;
    assert_eq!(units(c.capacity), 0.0, "over-committed: c got {c:?}");
    let p = params(100, Algorithm::ProportionalShare);
    for store in [&a, &b] {
        let (_, sets) = store.lease_sets().await.unwrap();
        let set = &sets[0].1;
        assert_eq!(set.len(), 3);
        assert_eq!(set.sum_has_micros(), 100_000_000);
    }
    // Server B gives `a`'s lease back; A's copy is stale again, and its
    // next decision sees the 60 back in the pool (on its copy, `c` would
    // get nothing).
    assert!(release(&*b, "db/qps", "a").await);
    clock.advance(10);
    let c = get(&*a, "db/qps", &p, "c", 60.0).await;
    assert!(units(c.capacity) > 0.0, "decided on a stale copy: {c:?}");
}

/// The test above catches a broken compare and set: each of these changes
/// to the lease scripts makes server A decide on its stale copy and grant
/// `c` the 40 that `b` holds (what `a_decision_on_a_stale_copy_is_refused_and_made_again`
/// fails on).
#[tokio::test]
async fn a_broken_compare_and_set_over_commits_on_a_stale_copy() {
    for mutation in [
        // lease_put.lua without its version check.
        ("if version ~= ARGV[1] then return { 0 } end", ""),
        // lease_get.lua reading every changed lease as gone.
        ("out[#out + 1] = lease or ''", "out[#out + 1] = ''"),
    ] {
        let (_redis, _clock, _stores, c) = stale_copy(Some(mutation)).await;
        assert_eq!(units(c.capacity), 40.0, "{mutation:?}: {c:?}");
    }
}

/// Two servers on one Redis deciding on one resource: a slow one (each of
/// its decisions takes 20 ms, as on a large set or a loaded server) and a
/// fast one in a tight loop. The slow one's decisions succeed because a
/// server whose write was refused takes the set's decision lock when it
/// reads again (`lease_get.lua`), and the fast one waits for it. `mutation`
/// changes the lease scripts: without the lock, every decision of the slow
/// one loses the race to the fast one's writes.
async fn slow_and_fast(mutation: Option<(&str, &str)>) -> Result<(), charon_store::StoreError> {
    let redis = charon_testkit::RedisServer::start();
    let connect = |id: &'static str| {
        let url = redis.url();
        async move {
            let opts = charon_store::RedisOptions {
                leases_mutation: mutation.map(|(a, b)| (a.to_owned(), b.to_owned())),
                ..charon_testkit::stores::options(None, id, std::time::Duration::from_secs(2))
            };
            RedisStore::connect(&url, opts).await.unwrap()
        }
    };
    let (fast, slow) = (connect("fast").await, connect("slow").await);
    let p = Arc::new(params(1_000, Algorithm::FairShare));
    for i in 0..10 {
        get(&*fast, "db/qps", &p, &format!("c{i}"), 1.0).await;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = tokio::spawn({
        let (fast, p, stop) = (fast.clone(), p.clone(), stop.clone());
        async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                get(&*fast, "db/qps", &p, "hot", 1.0 + f64::from(n % 7)).await;
                n += 1;
            }
            n
        }
    });
    let mut outcome = Ok(());
    for i in 0..5 {
        let client = format!("slow-{i}");
        let want = Want::parse(2.0, 0.0, 1).unwrap();
        let r = slow
            .leases("db/qps", &client, &mut |set: &mut LeaseSet, now| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                let ctx = LeaseContext::root(&p, 0, now);
                get_capacity(set, &p, ctx, &client, want);
            })
            .await;
        if r.is_err() {
            outcome = r;
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(hammer.await.unwrap() > 0);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_gets_its_turn_against_a_fast_one() {
    slow_and_fast(None).await.unwrap();
}

/// What the test above catches: `lease_get.lua` reading without taking the
/// lock, and `lease_put.lua` not waiting for another server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_decision_lock_a_slow_server_is_starved() {
    let no_lock = (
        "  redis.call('HSET', KEYS[1], 'lk',",
        "  redis.call('EXISTS', KEYS[1], 'lk',",
    );
    // lease_put.lua writing whoever holds the lock.
    let put_ignores_it = ("if token ~= ARGV[3] then", "if false then");
    for mutation in [no_lock, put_ignores_it] {
        let e = slow_and_fast(Some(mutation)).await.unwrap_err();
        assert!(
            e.to_string().contains("decisions in a row"),
            "{mutation:?}: {e}"
        );
    }
}
