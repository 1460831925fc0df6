//! The Redis store on a Redis Cluster (issue 13, item 4), against a real
//! private cluster of six `redis-server` processes (three masters, three
//! replicas, `charon_testkit::RedisCluster`): exact decisions across
//! masters, a master killed under load, a slot moved while serving, and an
//! ACL user with the documented rights. The conformance suite runs a
//! subset on a cluster too (`tests/store/conformance.rs`, `redis_cluster::`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

use charon_core::config::{CopyLimits, Enforcement, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::meter::{Op, Policy};
use charon_core::request::Amount;
use charon_store::{Limit, MeterOp, RedisOptions, RedisStore, Store, StoreError};
use charon_testkit::stores::{eventually, options, spawn_maintain};
use charon_testkit::{RedisCluster, RedisTlsSetup, TestPki};

/// The single-Redis rules of docs/redis.md and the cluster's two more.
const ACL_RULES: &str = "~charon:* -@all +evalsha +script|load +scan +time +get +set +del \
     +exists +sadd +srem +smembers +sismember +scard +hget +hset +hdel +hexists +hgetall \
     +hincrby +hmget +hvals +lindex +llen +lpop +lrange +lset +ltrim +rpush +persist +pexpire +pexpireat \
     +zadd +zcard +zrangebyscore +zrem +zremrangebyscore +cluster|slots +wait +asking";

const TTL: Duration = Duration::from_secs(3);

async fn connect(url: &str, id: &str, op_timeout: Duration) -> Result<Arc<RedisStore>, StoreError> {
    RedisStore::connect(
        url,
        RedisOptions {
            op_timeout,
            ..options(None, id, TTL)
        },
    )
    .await
}

/// A connected store whose maintenance runs, once it can serve copies.
async fn serve(
    url: &str,
    id: &str,
    op_timeout: Duration,
) -> (Arc<RedisStore>, JoinHandle<StoreError>) {
    let store = connect(url, id, op_timeout).await.unwrap();
    let maintain = spawn_maintain(&store);
    let ready = eventually(TTL * 3, async || store.ping().await.is_ok()).await;
    assert!(ready.is_some(), "{id} can serve copies");
    (store, maintain)
}

fn one_tier(limit: u64) -> [Tier; 1] {
    [Tier {
        limit,
        window: 600_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }]
}

fn rate(tiers: &[Tier]) -> RateLimits<'_> {
    RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers,
    }
}

fn copies(global: u64) -> CopyLimits {
    CopyLimits {
        domain_limit: global * 10,
        global_limit: Some(global),
        groups: Vec::new(),
    }
}

fn one() -> Amount {
    Amount::exactly(1).unwrap()
}

/// `per_master` resources on each master of `cluster`.
fn resources_on_every_master(cluster: &RedisCluster, per_master: usize) -> Vec<String> {
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "three masters");
    let mut chosen = Vec::new();
    for m in &masters {
        let mut i = 0;
        let mut here = 0;
        while here < per_master {
            let name = format!("res-{i}");
            i += 1;
            if chosen.contains(&name) {
                continue;
            }
            let slot = cluster.slot_of(&format!("charon:{{{name}}}:c"));
            if cluster.master_of(slot) == *m {
                chosen.push(name);
                here += 1;
            }
        }
    }
    chosen
}

/// Waits until the store has settled every operation in doubt.
async fn settled(store: &RedisStore) {
    let done = eventually(TTL * 10, async || store.operations_in_doubt() == 0).await;
    assert!(done.is_some(), "operations in doubt were settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_exact_across_masters_under_concurrent_load() {
    let cluster = RedisCluster::start();
    let names = resources_on_every_master(&cluster, 3);
    let url = cluster.url();
    // Two servers sharing the cluster.
    let (a, ma) = serve(&url, "a", Duration::from_secs(3)).await;
    let (b, mb) = serve(&url, "b", Duration::from_secs(3)).await;
    let tiers = one_tier(10);
    let mut tasks = Vec::new();
    for name in &names {
        for i in 0..25 {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            let name = name.clone();
            tasks.push(tokio::spawn(async move {
                let rate = s
                    .request(&name, "d", rate(&one_tier(10)), one(), Enforcement::Enforce)
                    .await
                    .unwrap()
                    .granted;
                let copy = s
                    .reserve(
                        &name,
                        &format!("d{}", i % 3),
                        &copies(7),
                        one(),
                        Enforcement::Enforce,
                    )
                    .await
                    .unwrap()
                    .granted;
                (name, rate, copy)
            }));
        }
    }
    let mut granted = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for t in tasks {
        let (name, r, c) = t.await.unwrap();
        let e = granted.entry(name).or_default();
        e.0 += r;
        e.1 += c;
    }
    for name in &names {
        assert_eq!(
            granted[name],
            (10, 7),
            "{name}: 10 hits and 7 copies exactly"
        );
        let (counts, mine_a) = a.copy_log(name).await.unwrap();
        let (_, mine_b) = b.copy_log(name).await.unwrap();
        assert_eq!(counts.global, 7, "{name}");
        assert_eq!(mine_a.global + mine_b.global, 7, "{name}");
        let more = a
            .request(name, "d", rate(&tiers), one(), Enforcement::Enforce)
            .await
            .unwrap();
        assert_eq!(more.granted, 0, "{name}: the tier is full");
    }

    // Server a dies without leaving; b leaves cleanly. The next server
    // starts alone and finds a's copies on every master (SCAN per master)
    // and releases them.
    ma.abort();
    drop(a);
    b.leave().await.unwrap();
    mb.abort();
    drop(b);
    tokio::time::sleep(TTL * 2).await;
    let (next, maintain) = serve(&url, "next", Duration::from_secs(3)).await;
    for name in &names {
        let (counts, _) = next.copy_log(name).await.unwrap();
        assert_eq!(counts.global, 0, "{name}: copies of dead servers are freed");
    }
    maintain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_gives_server_errors_never_an_extra_copy() {
    let mut cluster = RedisCluster::start();
    // A resource whose master is not the membership's: the failover is of
    // the resource's counts.
    let members_master = cluster.master_of(cluster.slot_of("charon:{%m}:gen"));
    let name = (0..)
        .map(|i| format!("vm-{i}"))
        .find(|n| {
            cluster.master_of(cluster.slot_of(&format!("charon:{{{n}}}:c"))) != members_master
        })
        .unwrap();
    let (store, maintain) = serve(&cluster.url(), "s", Duration::from_millis(500)).await;
    const LIMIT: u64 = 40;
    let acked = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (s, name, acked, errors, stop) = (
            store.clone(),
            name.clone(),
            acked.clone(),
            errors.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match s
                    .reserve(&name, "d", &copies(LIMIT), one(), Enforcement::Enforce)
                    .await
                {
                    Ok(r) => {
                        let total = acked.fetch_add(r.granted, Ordering::SeqCst) + r.granted;
                        assert!(total <= LIMIT, "{total} copies acknowledged, limit {LIMIT}");
                    }
                    Err(StoreError::Unavailable(_)) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("only server errors during a failover: {e:?}"),
                }
                let _ = s
                    .request(
                        &name,
                        "d",
                        rate(&one_tier(1_000_000)),
                        one(),
                        Enforcement::Enforce,
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }));
    }
    let started = eventually(Duration::from_secs(10), async || {
        acked.load(Ordering::SeqCst) >= 5
    })
    .await;
    assert!(started.is_some(), "grants before the failover");
    let killed = cluster.kill_master_of(&format!("charon:{{{name}}}:c"));
    tokio::task::block_in_place(|| cluster.wait_for_failover());
    // The promoted master has no replica: copy writes cannot be confirmed
    // until the old master is back as its replica.
    tokio::task::block_in_place(|| cluster.restart(killed));
    // Generous: it returns as soon as the limit is reached; a loaded box
    // may take a while to promote, restart and resync.
    let recovered = eventually(Duration::from_secs(60), async || {
        acked.load(Ordering::SeqCst) >= LIMIT
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert!(
        recovered.is_some(),
        "service recovered by itself: {acked:?} of {LIMIT} acknowledged, {} in doubt, counts {:?}",
        store.operations_in_doubt(),
        store.copy_log(&name).await
    );
    assert!(errors.load(Ordering::Relaxed) > 0, "the failover was seen");
    settled(&store).await;
    let (counts, mine) = store.copy_log(&name).await.unwrap();
    assert_eq!(
        (counts.global, mine.global),
        (LIMIT, LIMIT),
        "copy counts exact"
    );
    let r = store
        .reserve(&name, "d", &copies(LIMIT), one(), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!(r.granted, 0, "the limit holds after the failover");
    maintain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_slot_with_live_keys_while_serving_keeps_decisions_exact() {
    let cluster = Arc::new(RedisCluster::start());
    let name = "hot";
    let slot = cluster.slot_of("charon:{hot}:c");
    let from = cluster.master_of(slot);
    let to = *cluster.masters().iter().find(|m| **m != from).unwrap();
    let (store, maintain) = serve(&cluster.url(), "s", Duration::from_secs(2)).await;
    const RATE: u64 = 60;
    const COPIES: u64 = 30;
    let hits = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicU64::new(0));
    let timeouts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..4 {
        let (s, hits, held, timeouts, stop) = (
            store.clone(),
            hits.clone(),
            held.clone(),
            timeouts.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match s
                    .request(
                        name,
                        "d",
                        rate(&one_tier(RATE)),
                        one(),
                        Enforcement::Enforce,
                    )
                    .await
                {
                    Ok(r) => {
                        hits.fetch_add(r.granted, Ordering::SeqCst);
                    }
                    Err(e) if e.to_string().contains("did not answer") => {
                        timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(StoreError::Unavailable(_)) => {}
                    Err(e) => panic!("{e:?}"),
                }
                let d = format!("d{i}");
                if let Ok(r) = s
                    .reserve(name, &d, &copies(COPIES), one(), Enforcement::Enforce)
                    .await
                {
                    held.fetch_add(r.granted, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }
    let busy = eventually(Duration::from_secs(10), async || {
        hits.load(Ordering::SeqCst) >= 10
    })
    .await;
    assert!(busy.is_some(), "serving before the move");
    let mover = cluster.clone();
    tokio::task::spawn_blocking(move || mover.migrate_slot(slot, to))
        .await
        .unwrap();
    assert_eq!(cluster.master_of(slot), to, "the slot moved");
    // Serve on the new master until the limits are reached.
    let full = eventually(Duration::from_secs(20), async || {
        hits.load(Ordering::SeqCst) >= RATE && held.load(Ordering::SeqCst) >= COPIES
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert!(full.is_some(), "served after the move");
    settled(&store).await;
    assert_eq!(held.load(Ordering::SeqCst), COPIES, "copies exact");
    let (counts, _) = store.copy_log(name).await.unwrap();
    assert_eq!(counts.global, COPIES, "copy counts exact");
    let granted = hits.load(Ordering::SeqCst);
    if timeouts.load(Ordering::Relaxed) == 0 {
        assert_eq!(granted, RATE, "hits exact");
    } else {
        // A reply lost to a timeout may hide a granted hit: never more.
        assert!(granted <= RATE, "{granted} hits, limit {RATE}");
    }
    maintain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_the_documented_rights_works_and_a_wrong_password_is_refused() {
    let cluster = RedisCluster::start_with_users(vec![
        format!("charon on >charon-pw {ACL_RULES}"),
        format!("nowait on >pw {ACL_RULES} -wait"),
    ]);
    let names = resources_on_every_master(&cluster, 1);
    let url = cluster.url_as("charon", "charon-pw");
    let (store, maintain) = serve(&url, "s", Duration::from_secs(2)).await;
    for name in &names {
        let r = store
            .request(name, "d", rate(&one_tier(1)), one(), Enforcement::Enforce)
            .await
            .unwrap();
        assert_eq!(r.granted, 1);
        let r = store
            .reserve(
                name,
                "d",
                &copies(2),
                Amount::exactly(2).unwrap(),
                Enforcement::Enforce,
            )
            .await
            .unwrap();
        assert_eq!(r.granted, 2);
        let hold = Hold::new(name.as_str(), "d", Vec::<String>::new());
        let id = store.transfer(&hold, 1, 60_000).await.unwrap();
        assert_eq!(store.seize(&id).await.unwrap().unwrap().copies, 1);
        store.release(&hold, 2).await.unwrap();
        assert_eq!(store.copy_log(name).await.unwrap().0.global, 0);
    }
    store.ping().await.unwrap();
    store.leave().await.unwrap();
    maintain.abort();

    // A wrong password: a denial that never shows it.
    let wrong = cluster.url_as("charon", "wrong-secret");
    let e = connect(&wrong, "w", Duration::from_secs(2))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::Denied(_)), "{e:?}");
    assert!(
        !text.contains("wrong-secret") && text.contains("***"),
        "{text}"
    );

    // A user without WAIT (needed after copy writes) is refused at
    // connect, clearly.
    let e = connect(&cluster.url_as("nowait", "pw"), "n", Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Denied(t) if t.contains("NOPERM") && t.contains("docs/redis.md")),
        "{e:?}"
    );
    assert!(!charon_store::redacted(&url).contains("charon-pw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_as_an_acl_user_the_store_decides_on_every_master() {
    let pki = TestPki::new();
    let cluster = RedisCluster::start_with(
        vec![format!("charon on >charon-pw {ACL_RULES}")],
        Some(RedisTlsSetup::from_pki(&pki, "yes")),
    );
    let names = resources_on_every_master(&cluster, 1);
    let url = cluster.url_as("charon", "charon-pw");
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let tls = charon_testkit::stores::redis_tls(&pki, true);
    let store = RedisStore::connect(
        &url,
        RedisOptions {
            tls: tls.clone(),
            op_timeout: Duration::from_secs(2),
            ..options(None, "tls", TTL)
        },
    )
    .await
    .unwrap();
    let maintain = spawn_maintain(&store);
    let ready = eventually(TTL * 3, async || store.ping().await.is_ok()).await;
    assert!(ready.is_some(), "ready over TLS");
    for name in &names {
        let r = store
            .request(name, "d", rate(&one_tier(2)), one(), Enforcement::Enforce)
            .await
            .unwrap();
        assert_eq!(r.granted, 1);
        let r = store
            .reserve(name, "d", &copies(1), one(), Enforcement::Enforce)
            .await
            .unwrap();
        assert_eq!(r.granted, 1);
        let r = store
            .reserve(name, "d", &copies(1), one(), Enforcement::Enforce)
            .await
            .unwrap();
        assert_eq!(r.granted, 0, "{name}: the global limit");
    }
    store.leave().await.unwrap();
    maintain.abort();

    // Certificates with a plain cluster URL are a mistake, not ignored.
    let plain = url.replacen("rediss+cluster", "redis+cluster", 1);
    let e = RedisStore::connect(
        &plain,
        RedisOptions {
            tls,
            ..options(None, "plain", TTL)
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, StoreError::Denied(t) if t.contains("rediss+cluster")),
        "{e:?}"
    );
}

/// An Envoy-style batch (`Store::meters`) over resources in different
/// slots is one script across slots, which a cluster cannot run: a clear
/// error naming `same_slot`, never a partial batch; with `same_slot`
/// (one hash tag for the Envoy domain) it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_across_slots_is_refused_clearly_and_same_slot_runs() {
    let cluster = RedisCluster::start();
    let names = resources_on_every_master(&cluster, 1);
    let (store, maintain) = serve(&cluster.url(), "s", Duration::from_secs(2)).await;
    let tiers = one_tier(1);
    let batch = |slot: Option<&'static str>| -> Vec<MeterOp<'_>> {
        names
            .iter()
            .map(|name| MeterOp {
                resource: name,
                domain: "d",
                limit: Limit::Tiers {
                    limits: rate(&tiers),
                    policy: Policy::default(),
                    enforcement: Enforcement::Enforce,
                },
                op: Op::request(one()),
                shadow: false,
                slot,
            })
            .collect()
    };
    let e = store.meters(&batch(None)).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::BadData(t) if t.contains("same_slot")),
        "{e:?}"
    );
    let b = store.meters(&batch(Some("edge"))).await.unwrap();
    assert!(b.committed, "one slot: the batch runs");
    let b = store.meters(&batch(Some("edge"))).await.unwrap();
    assert!(!b.committed, "and counts: the tier of 1 is full");
    maintain.abort();
}
