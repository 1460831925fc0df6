//! Crash bookkeeping of the Redis store (paper §4.3.2) at the store level:
//! several `RedisStore`s with their own server ids on one private Redis,
//! simulated deaths (a store that stops maintaining), resignation, a start
//! alone after dead generations, and Redis itself restarting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::config::{CopyLimits, Enforcement, GroupLimit, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_store::{CopyLog, RedisOptions, RedisStore, Store, StoreError};
use charon_testkit::RedisServer;
use charon_testkit::stores::{
    copy_log as log, eventually, member as connect, options, raw, spawn_maintain,
};

const TTL: Duration = Duration::from_millis(1_000);

fn amount(n: u64) -> Amount {
    Amount::exactly(n).unwrap()
}

fn limits() -> CopyLimits {
    CopyLimits {
        domain_limit: 10,
        global_limit: Some(20),
        groups: vec![GroupLimit {
            name: "g1".into(),
            limit: 15,
        }],
    }
}

fn hold(domain: &str) -> Hold {
    Hold::new("vm", domain, ["g1".to_owned()])
}

async fn reserve(s: &RedisStore, domain: &str, n: u64) {
    let r = s
        .reserve("vm", domain, &limits(), amount(n), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!(r.granted, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_removes_a_dead_servers_contributions_and_keeps_its_own() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let b = connect(&redis, "b", TTL).await;
    assert_ne!(a.member_id(), b.member_id());
    let a_maintain = spawn_maintain(&a);
    let _b_maintain = spawn_maintain(&b);

    reserve(&a, "d1", 3).await;
    reserve(&b, "d1", 2).await;
    reserve(&b, "d2", 1).await;
    // A transfer staged by A belongs to no server: it must outlive A.
    let id = a.transfer(&hold("d1"), 1, 60_000).await.unwrap();
    let (counts, mine) = b.copy_log("vm").await.unwrap();
    assert_eq!(counts, log(6, &[("d1", 5), ("d2", 1)], 6));
    assert_eq!(mine, log(3, &[("d1", 2), ("d2", 1)], 3));

    // A dies: it stops renewing (and so stops serving on its own clock).
    a_maintain.abort();
    let died = Instant::now();
    let removed = eventually(TTL * 3, async || {
        b.copy_log("vm").await.unwrap().0.global == 4
    })
    .await
    .expect("the survivor removes the dead server's contributions");
    assert!(
        removed <= TTL * 2,
        "removed {removed:?} after the death, liveness ttl {TTL:?}"
    );
    let (counts, mine) = b.copy_log("vm").await.unwrap();
    assert_eq!(
        counts,
        log(4, &[("d1", 3), ("d2", 1)], 4),
        "B's 3 and A's staged 1"
    );
    assert_eq!(
        mine,
        log(3, &[("d1", 2), ("d2", 1)], 3),
        "B's holds are exact"
    );

    // The dead server, still running, must not touch the counts again:
    // its copy operations get server errors, and it resigns as soon as it
    // tries to renew.
    assert!(died.elapsed() > TTL / 2);
    assert!(matches!(
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        a.release(&hold("d1"), 2).await,
        Err(StoreError::Unavailable(_))
    ));
    let e = tokio::time::timeout(TTL * 2, a.maintain()).await.unwrap();
    assert!(matches!(e, StoreError::Resigned(_)), "{e:?}");
    assert!(matches!(
        a.release(&hold("d1"), 2).await,
        Err(StoreError::Resigned(_))
    ));

    // Its staged transfer survived; B seizes and releases it.
    let staged = b.seize(&id).await.unwrap().unwrap();
    assert_eq!((staged.hold, staged.copies), (hold("d1"), 1));
    b.release(&hold("d1"), 3).await.unwrap();
    b.release(&Hold::new("vm", "d2", ["g1".to_owned()]), 1)
        .await
        .unwrap();
    let (counts, mine) = b.copy_log("vm").await.unwrap();
    assert_eq!((counts, mine), (CopyLog::default(), CopyLog::default()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_fenced_by_the_others_resigns() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let b = connect(&redis, "b", TTL).await;
    let _b_maintain = spawn_maintain(&b);
    reserve(&a, "d1", 1).await;
    // A stops renewing; B counts it dead and removes its contributions.
    let removed = eventually(TTL * 5, async || {
        b.copy_log("vm").await.unwrap().0.global == 0
    })
    .await;
    assert!(removed.is_some(), "B removes A's contributions");
    // A comes back: it must stop, its holds no longer match Redis.
    let e = tokio::time::timeout(TTL * 2, a.maintain())
        .await
        .expect("maintain returns at the first renewal");
    assert!(matches!(e, StoreError::Resigned(_)), "{e:?}");
    assert!(matches!(
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await,
        Err(StoreError::Resigned(_))
    ));
    // Rate requests do not depend on membership.
    let tiers = [Tier {
        limit: 1,
        window: 1_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let l = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    assert!(
        a.request("api/x", "d", l, amount(1), Enforcement::Enforce)
            .await
            .is_ok()
    );
    println!(
        "FAULT fenced-member: injected a member that stopped renewing until the others removed its contributions; \
         expected it to resign when it comes back; observed {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_liveness_lapsed_but_was_not_fenced_renews_it() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let maintain = spawn_maintain(&a);
    reserve(&a, "d1", 1).await;
    // The liveness key vanishes (as after a Redis stall longer than the
    // ttl), but nobody removed A's contributions.
    let live = format!("charon:{{%m}}:live:{}", a.member_id());
    let _: () = redis::cmd("DEL")
        .arg(&live)
        .query(&mut raw(&redis))
        .unwrap();
    let back = eventually(TTL * 3, async || {
        redis::cmd("EXISTS")
            .arg(&live)
            .query::<i64>(&mut raw(&redis))
            .unwrap()
            == 1
    })
    .await;
    assert!(back.is_some(), "the liveness key is written again");
    tokio::time::sleep(TTL / 2).await;
    assert!(!maintain.is_finished(), "no resignation: nothing was lost");
    reserve(&a, "d1", 1).await;
    assert_eq!(a.copy_log("vm").await.unwrap().0, log(2, &[("d1", 2)], 2));
    println!(
        "FAULT lapsed-unfenced: injected deletion of a member's liveness key; \
         expected the member to renew it and keep serving; observed renewed after {back:?}, maintain running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_operations_wait_for_a_renewal_after_half_the_ttl() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    reserve(&a, "d1", 1).await;
    // Nobody renews: past half the ttl, copy operations are refused as
    // server errors (another member may soon count this one dead), but
    // the member does not resign.
    tokio::time::sleep(TTL / 2 + Duration::from_millis(50)).await;
    let e = a
        .reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    let _m = spawn_maintain(&a);
    let back = eventually(TTL * 2, async || {
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await
            .is_ok()
    })
    .await;
    assert!(back.is_some(), "copy operations resume after a renewal");
    assert_eq!(a.copy_log("vm").await.unwrap().0, log(2, &[("d1", 2)], 2));
}

/// Both members keep serving through a Redis stall of `stall`, answer
/// server errors while it lasts, and their counts are exact afterwards.
async fn members_survive_a_redis_stall(stall: Duration, name: &str) {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let b = connect(&redis, "b", TTL).await;
    let a_maintain = spawn_maintain(&a);
    let b_maintain = spawn_maintain(&b);
    reserve(&a, "d1", 3).await;
    reserve(&b, "d2", 2).await;

    redis.stop();
    let stopped = Instant::now();
    tokio::time::sleep(stall.saturating_sub(Duration::from_millis(300))).await;
    let asked = Instant::now();
    let during = a
        .reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
        .await;
    let answered = asked.elapsed();
    tokio::time::sleep(stall.saturating_sub(stopped.elapsed())).await;
    redis.resume();
    assert!(
        matches!(during, Err(StoreError::Unavailable(_))),
        "a server error during the stall: {during:?}"
    );

    let recovered = eventually(TTL * 5, async || {
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await
            .is_ok()
    })
    .await;
    assert!(recovered.is_some(), "A decides again after the stall");
    reserve(&b, "d2", 1).await;
    assert!(!a_maintain.is_finished(), "A did not resign");
    assert!(!b_maintain.is_finished(), "B did not resign");
    // The reserve that timed out during the stall ran when Redis resumed
    // and is undone: counts are exactly what the two members hold.
    let exact = eventually(TTL * 5, async || {
        a.operations_in_doubt() == 0
            && a.copy_log("vm").await.unwrap().0 == log(7, &[("d1", 4), ("d2", 3)], 7)
    })
    .await;
    assert!(exact.is_some(), "counts: {:?}", a.copy_log("vm").await);
    assert_eq!(a.copy_log("vm").await.unwrap().1, log(4, &[("d1", 4)], 4));
    assert_eq!(b.copy_log("vm").await.unwrap().1, log(3, &[("d2", 3)], 3));
    println!(
        "FAULT {name}: injected SIGSTOP of Redis for {stall:?} (liveness ttl {TTL:?}); \
         expected server errors during it, no resignation, exact counts after; \
         observed {during:?} answered in {answered:?}, decisions again {recovered:?} after resume, both members serving, counts exact"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_longer_than_half_the_ttl_makes_no_member_resign() {
    members_survive_a_redis_stall(TTL * 7 / 10, "store-stall-0.7ttl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_longer_than_the_ttl_makes_no_member_resign() {
    members_survive_a_redis_stall(TTL * 16 / 10, "store-stall-1.6ttl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_starting_while_the_others_liveness_lapsed_does_not_reset_their_counts() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let b = connect(&redis, "b", TTL).await;
    let a_maintain = spawn_maintain(&a);
    let b_maintain = spawn_maintain(&b);
    reserve(&a, "d1", 3).await;
    reserve(&b, "d2", 2).await;
    // Every liveness key lapses at once (Redis stalled past the ttl), and
    // a new server starts right then: it finds nobody live.
    for m in [a.member_id(), b.member_id()] {
        let _: () = redis::cmd("DEL")
            .arg(format!("charon:{{%m}}:live:{m}"))
            .query(&mut raw(&redis))
            .unwrap();
    }
    let c = connect(&redis, "c", TTL).await;
    let _c_maintain = spawn_maintain(&c);
    assert_eq!(
        c.copy_log("vm").await.unwrap().0,
        log(5, &[("d1", 3), ("d2", 2)], 5),
        "the newcomer kept the counts of members that were only late"
    );
    tokio::time::sleep(TTL).await;
    reserve(&a, "d1", 1).await;
    reserve(&b, "d2", 1).await;
    assert!(!a_maintain.is_finished() && !b_maintain.is_finished());
    assert_eq!(
        c.copy_log("vm").await.unwrap().0,
        log(7, &[("d1", 4), ("d2", 3)], 7)
    );
    println!(
        "FAULT join-after-lapse: injected every liveness key lapsing and a server starting then; \
         expected no reset of the lapsed members' counts; observed counts kept, no resignation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refusing_writes_gives_server_errors_and_no_resignation() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", TTL).await;
    let maintain = spawn_maintain(&a);
    reserve(&a, "d1", 1).await;
    // Redis refuses every write, as it does when it cannot persist
    // (MISCONF on a full disk) or lacks replicas (NOREPLICAS).
    let set = |n: u32| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("min-replicas-to-write")
            .arg(n)
            .query(&mut raw(&redis))
            .unwrap();
    };
    set(1);
    let e = a
        .reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    tokio::time::sleep(TTL * 2).await;
    let during = a
        .reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
        .await;
    assert!(
        matches!(during, Err(StoreError::Unavailable(_))),
        "{during:?}"
    );
    set(0);
    let back = eventually(TTL * 3, async || {
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await
            .is_ok()
    })
    .await;
    assert!(back.is_some(), "decides again once Redis accepts writes");
    assert!(!maintain.is_finished(), "no resignation");
    assert_eq!(a.copy_log("vm").await.unwrap().0, log(2, &[("d1", 2)], 2));
    println!(
        "FAULT redis-refuses-writes: injected min-replicas-to-write 1 for {:?} (writes refused with NOREPLICAS, as MISCONF on a full disk); \
         expected server errors (unavailable) and no resignation; observed {e:?}, then decisions again after {back:?}",
        TTL * 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_starting_alone_cleans_up_what_dead_generations_left() {
    let redis = RedisServer::start();
    let ttl = Duration::from_millis(300);
    {
        let a = connect(&redis, "a", ttl).await;
        reserve(&a, "d1", 3).await;
        let _id = a.transfer(&hold("d1"), 1, 600_000).await.unwrap();
        // A crash without bookkeeping: nothing ever renews or cleans.
    }
    // Leftovers of a server nobody even remembers.
    let mut c = raw(&redis);
    let _: () = redis::pipe()
        .hset("charon:{vm}:s:ghost.00000000", "g", 5)
        .hset("charon:{vm}:s:ghost.00000000", "d:d9", 5)
        .hincr("charon:{vm}:c", "g", 5)
        .hincr("charon:{vm}:c", "d:d9", 5)
        .sadd("charon:{%m}:keys:ghost.00000000", "vm")
        .query(&mut c)
        .unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;

    let fresh = connect(&redis, "fresh", TTL).await;
    let _m = spawn_maintain(&fresh);
    let (counts, mine) = fresh.copy_log("vm").await.unwrap();
    assert_eq!(
        counts,
        log(1, &[("d1", 1)], 1),
        "only the staged transfer is left"
    );
    assert_eq!(mine, CopyLog::default());
    let registered: Vec<String> = redis::cmd("SMEMBERS")
        .arg("charon:{%m}:servers")
        .query(&mut c)
        .unwrap();
    assert_eq!(registered, [fresh.member_id().to_owned()]);
    let ghost_keys: i64 = redis::cmd("EXISTS")
        .arg("charon:{%m}:keys:ghost.00000000")
        .query(&mut c)
        .unwrap();
    assert_eq!(ghost_keys, 0);

    // A server joining a live one does not reset anything.
    reserve(&fresh, "d2", 2).await;
    let other = connect(&redis, "other", TTL).await;
    let (counts, _) = other.copy_log("vm").await.unwrap();
    assert_eq!(counts, log(3, &[("d1", 1), ("d2", 2)], 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarting_gives_unavailable_then_recovery_and_no_negative_count() {
    let mut redis = RedisServer::start();
    let ttl = Duration::from_secs(4);
    let s = RedisStore::connect(
        &redis.url(),
        RedisOptions {
            op_timeout: Duration::from_millis(200),
            ..options(None, "a", ttl)
        },
    )
    .await
    .unwrap();
    let maintain = spawn_maintain(&s);
    let tiers = [Tier {
        limit: 100,
        window: 1_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let l = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    assert_eq!(
        s.request("api/x", "d", l, amount(1), Enforcement::Enforce)
            .await
            .unwrap()
            .granted,
        1
    );
    reserve(&s, "d1", 2).await;

    redis.kill();
    let asked = Instant::now();
    let e = s
        .request("api/x", "d", l, amount(1), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "fails fast: {:?}",
        asked.elapsed()
    );
    let e = s
        .reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");

    // Back, empty and without the scripts.
    redis.restart();
    let back = eventually(Duration::from_secs(3), async || {
        s.request("api/x", "d", l, amount(1), Enforcement::Enforce)
            .await
            .is_ok()
    })
    .await;
    assert!(back.is_some(), "recovers by itself");
    // Copies wait until the counts of the new generation are rebuilt (no
    // hold sets are attached to this bare store: nothing to rebuild).
    let copies_back = eventually(ttl * 2, async || s.ping().await.is_ok()).await;
    assert!(copies_back.is_some(), "copies are served again");
    reserve(&s, "d2", 1).await;
    let key_set: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("charon:{{%m}}:keys:{}", s.member_id()))
        .query(&mut raw(&redis))
        .unwrap();
    assert_eq!(
        key_set,
        ["vm"],
        "the key set lost with Redis' data is written again"
    );
    // The hold from before the restart is gone with Redis' data: releasing
    // it is refused rather than taking the count below zero.
    let e = s.release(&hold("d1"), 2).await;
    assert!(matches!(e, Err(StoreError::BadData(_))), "{e:?}");
    let (counts, mine) = s.copy_log("vm").await.unwrap();
    assert_eq!(counts, log(1, &[("d2", 1)], 1));
    assert_eq!(mine, counts);
    // And the store kept its membership (a new generation).
    tokio::time::sleep(ttl / 3).await;
    assert!(
        !maintain.is_finished(),
        "no resignation after a Redis restart"
    );
    let live: i64 = redis::cmd("EXISTS")
        .arg(format!("charon:{{%m}}:live:{}", s.member_id()))
        .query(&mut raw(&redis))
        .unwrap();
    assert_eq!(live, 1);
}

#[tokio::test]
async fn scripts_flushed_from_redis_are_loaded_again() {
    let redis = RedisServer::start();
    let s = connect(&redis, "a", Duration::from_secs(10)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut raw(&redis))
        .unwrap();
    reserve(&s, "d1", 1).await;
    s.release(&hold("d1"), 1).await.unwrap();
}

#[tokio::test]
async fn idle_rate_state_expires_by_itself_in_redis_time() {
    let redis = RedisServer::start();
    let s = connect(&redis, "a", Duration::from_secs(10)).await;
    let tiers = [
        Tier {
            limit: 1,
            window: 1_000,
            active: None,
            cooldown: 0,
            skippable: false,
        },
        Tier {
            limit: 5,
            window: 1_000,
            active: Some(5_000_000),
            cooldown: 2_000_000,
            skippable: false,
        },
    ];
    let l = RateLimits {
        hard_limit: None,
        global_limit: Some(100),
        tiers: &tiers,
    };
    let r = s
        .request("api/x", "d", l, amount(3), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!((r.granted, r.tier), (3, 2));
    let mut c = raw(&redis);
    let pttl = |c: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PTTL").arg(key).query(c).unwrap()
    };
    // The state goes when tier 2's cooldown ends; its lists a minute later
    // (so that they need not be re-expired on every request).
    let state = pttl(&mut c, "charon:{api/x}:r:d");
    assert!((6_990_000..=7_000_000).contains(&state), "{state}");
    for key in [
        "charon:{api/x}:rs:d",
        "charon:{api/x}:rt1:d",
        "charon:{api/x}:rt2:d",
    ] {
        let ttl = pttl(&mut c, key);
        assert!(
            (state..=state + 60_000).contains(&ttl),
            "{key}: {ttl}, state {state}"
        );
    }
    let total = pttl(&mut c, "charon:{api/x}:gn");
    assert!((900..=1_001).contains(&total), "the last second: {total}");
    let list = pttl(&mut c, "charon:{api/x}:g");
    assert!((total..=total + 60_000).contains(&list), "{list}");
    // Once forgotten, nothing is left behind.
    let short = [Tier {
        limit: 1,
        window: 100,
        active: Some(200),
        cooldown: 0,
        skippable: false,
    }];
    let l = RateLimits {
        hard_limit: None,
        global_limit: Some(100),
        tiers: &short,
    };
    s.request("api/z", "d", l, amount(1), Enforcement::Enforce)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("charon:{api/z}*")
        .query(&mut c)
        .unwrap();
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "charon:{api/z}:g",
            "charon:{api/z}:rs:d",
            "charon:{api/z}:rt1:d"
        ],
        "only lists are left"
    );
    for key in keys {
        let ttl = pttl(&mut c, key);
        assert!((0..=60_000).contains(&ttl), "{key} goes by itself: {ttl}");
    }
}

/// A member whose operations time out after 100 ms: long before a
/// [`pause_writes`] ends.
async fn impatient(redis: &RedisServer) -> Arc<RedisStore> {
    RedisStore::connect(
        &redis.url(),
        RedisOptions {
            op_timeout: Duration::from_millis(100),
            ..options(None, "a", Duration::from_secs(3))
        },
    )
    .await
    .unwrap()
}

/// Redis holds every write for `ms`: operations sent meanwhile time out
/// at the client and run when the pause ends (their replies are lost).
fn pause_writes(redis: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut raw(redis))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_operations_whose_reply_was_lost_are_undone() {
    let redis = RedisServer::start();
    let s = impatient(&redis).await;
    let _m = spawn_maintain(&s);
    reserve(&s, "d1", 2).await;
    // Redis holds every write for a while: the operations time out here,
    // and run there when the pause ends.
    pause_writes(&redis, 300);
    let e = s
        .reserve("vm", "d1", &limits(), amount(3), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    let e = s.release(&hold("d1"), 1).await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    assert_eq!(s.operations_in_doubt(), 2);
    // Both were reported as failed: the session still holds 2 copies, and
    // so must the counts once both are undone.
    let settled = eventually(Duration::from_secs(4), async || {
        s.operations_in_doubt() == 0
            && s.copy_log("vm").await.unwrap() == (log(2, &[("d1", 2)], 2), log(2, &[("d1", 2)], 2))
    })
    .await;
    assert!(settled.is_some(), "{:?}", s.copy_log("vm").await);
    s.release(&hold("d1"), 2).await.unwrap();
    assert_eq!(s.copy_log("vm").await.unwrap().0, CopyLog::default());
}

/// An undo whose reply is lost too (during a failover: no replica yet to
/// confirm it) ran anyway; run again, it finds its own `undone` mark. The
/// operations in doubt after it must still be undone, not forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_whose_reply_was_lost_is_run_again_and_the_rest_still_undone() {
    // As a server logs (on every thread: the housekeeping runs on the
    // runtime's workers): the undo's warning is built only when enabled.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    let redis = RedisServer::start();
    let s = impatient(&redis).await;
    reserve(&s, "d1", 2).await;
    pause_writes(&redis, 300);
    let e = s
        .reserve("vm", "d1", &limits(), amount(3), Enforcement::Enforce)
        .await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    let e = s.release(&hold("d1"), 1).await;
    assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    assert_eq!(s.operations_in_doubt(), 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Both ran when the pause ended. The first round of undos starts with
    // the housekeeping, inside a second pause: the first undo times out
    // (and runs when it ends), the second waits behind it.
    pause_writes(&redis, 300);
    let _m = spawn_maintain(&s);
    let settled = eventually(Duration::from_secs(6), async || {
        s.operations_in_doubt() == 0
            && s.copy_log("vm").await.ok()
                == Some((log(2, &[("d1", 2)], 2), log(2, &[("d1", 2)], 2)))
    })
    .await;
    assert!(settled.is_some(), "{:?}", s.copy_log("vm").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_leaves_takes_its_contributions_and_registration_along() {
    let redis = RedisServer::start();
    let a = connect(&redis, "a", Duration::from_secs(10)).await;
    let b = connect(&redis, "b", Duration::from_secs(10)).await;
    reserve(&a, "d1", 2).await;
    reserve(&b, "d1", 1).await;
    a.leave().await.unwrap();
    assert_eq!(b.copy_log("vm").await.unwrap().0, log(1, &[("d1", 1)], 1));
    let registered: Vec<String> = redis::cmd("SMEMBERS")
        .arg("charon:{%m}:servers")
        .query(&mut raw(&redis))
        .unwrap();
    assert_eq!(registered, [b.member_id().to_owned()]);
    assert!(matches!(
        a.reserve("vm", "d1", &limits(), amount(1), Enforcement::Enforce)
            .await,
        Err(StoreError::Resigned(_))
    ));
    assert!(matches!(a.maintain().await, StoreError::Resigned(_)));
}
