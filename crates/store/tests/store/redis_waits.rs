//! Waiting for a copy on the Redis store (SPEC §14) under load and faults:
//! 10,000 waiters on one key (bounded memory, clear statuses, nothing
//! left), Redis stalls shorter and longer than the store's time limit
//! while a caller waits (its copy after the stall, or a clear server error
//! and nothing leaked), and the queue on a Redis Cluster.
//!
//! Each fault test prints one `FAULT` line: what was injected, what was
//! expected, what was seen.

use std::sync::Arc;
use std::time::Duration;

use charon_core::ManualClock;
use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::{Hold, ReserveReply};
use charon_core::request::Amount;
use charon_store::{RedisOptions, RedisStore, Reserved, Store, StoreError, Ticket, WaitOptions};
use charon_testkit::RedisServer;
use charon_testkit::stores::{eventually, options, raw, spawn_maintain};

const WAITERS: u64 = 10_000;
/// The ten-thousand-waiter test's operation timeout (see there).
const OP_TIMEOUT: Duration = Duration::from_secs(6);
const TTL: Duration = Duration::from_secs(4);

fn one_copy() -> CopyLimits {
    CopyLimits {
        domain_limit: 1,
        global_limit: Some(1),
        groups: Vec::new(),
    }
}

fn one() -> Amount {
    Amount::new(1, 1).unwrap()
}

async fn wait_for(
    store: &dyn Store,
    domain: &str,
    wait_ms: u64,
    queue_limit: u64,
) -> Result<Reserved, StoreError> {
    let wait = WaitOptions {
        wait_ms,
        queue_limit,
    };
    store
        .reserve_or_wait(
            "page",
            domain,
            &one_copy(),
            one(),
            Enforcement::Enforce,
            wait,
        )
        .await
}

/// Redis' `used_memory`, in bytes.
fn used_memory(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut raw(redis))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// The keys of `page` left in Redis.
fn page_keys(redis: &RedisServer, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{page}}:*"))
        .query(&mut raw(redis))
        .unwrap();
    keys.sort();
    keys
}

/// Follows a waiter up as a server does: woken (pub/sub, or the poll),
/// then its outcome, until it has one.
async fn answer(store: &RedisStore, t: &Ticket) -> Result<ReserveReply, StoreError> {
    loop {
        if let Some(r) = store.wait_outcome(t).await? {
            return Ok(r);
        }
        store.woken(t, Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_on_one_redis_key_use_bounded_memory_and_leave_nothing() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(0));
    let store = RedisStore::connect(
        &redis.url(),
        RedisOptions {
            // Rejecting 9,999 waiters at their deadline is one script: tens
            // of thousands of commands, which a busy machine may stretch
            // past the default 1 s, and has stretched past 3 s while the
            // whole suite ran beside it (what it took is printed below).
            // This test is about memory and answers, not about time. The
            // operation records live 10 × this (60 s), awaited below.
            op_timeout: OP_TIMEOUT,
            ..options(Some(clock.clone()), "many", Duration::from_secs(10))
        },
    )
    .await
    .unwrap();
    let _maintain = spawn_maintain(&store);
    let Reserved::Now(first) = wait_for(&*store, "holder", 1_000, WAITERS).await.unwrap() else {
        panic!("the first is answered at once");
    };
    assert_eq!(first.granted, 1);
    let before = used_memory(&redis);
    let mut tickets = Vec::new();
    for i in 0..WAITERS {
        clock.set(i / 100);
        match wait_for(&*store, &format!("d{i}"), 1_000, WAITERS)
            .await
            .unwrap()
        {
            Reserved::Waiting(t) => tickets.push(t),
            Reserved::Now(r) => panic!("waiter {i} answered at once: {r:?}"),
        }
    }
    let Reserved::Now(full) = wait_for(&*store, "late", 1_000, WAITERS).await.unwrap() else {
        panic!("the queue is full");
    };
    assert!(full.queue_full && full.granted == 0, "{full:?}");
    assert_eq!(
        store.queue_lengths().await.unwrap(),
        [("page".to_owned(), WAITERS)]
    );
    let queued = used_memory(&redis);
    let per_waiter = queued.saturating_sub(before) / WAITERS;
    println!(
        "10,000 waiters on one key: Redis used_memory {before} -> {queued} bytes ({per_waiter} bytes a waiter)"
    );
    assert!(per_waiter < 1_000, "{per_waiter} bytes a waiter");

    // The release hands the copy to the first waiter, and only to it.
    store
        .release(&Hold::new("page", "holder", Vec::new()), 1)
        .await
        .unwrap();
    let got = store.wait_outcome(&tickets[0]).await.unwrap().unwrap();
    assert_eq!((got.granted, got.waited_ms), (1, Some(99)));
    assert_eq!(store.wait_outcome(&tickets[1]).await.unwrap(), None);

    // Every other waiter is rejected when its wait runs out, in one tick.
    clock.set(2_000);
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(&mut raw(&redis))
        .unwrap();
    store.tick("page").await.unwrap();
    // Each slow-log entry: id, time, microseconds, command…
    let slowest: Vec<(u64, u64, u64)> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1)
        .query::<Vec<Vec<redis::Value>>>(&mut raw(&redis))
        .unwrap()
        .into_iter()
        .map(|e| redis::from_redis_value(redis::Value::Array(e[..3].to_vec())).unwrap())
        .collect();
    println!(
        "the tick that rejected 9,999 waiters ran {} µs in Redis (its slow log)",
        slowest.first().map_or(0, |e| e.2)
    );
    for t in &tickets[1..] {
        let r = store.wait_outcome(t).await.unwrap().expect("rejected");
        assert_eq!((r.granted, r.queue_full, r.result_ready), (0, false, false));
        assert!(r.waited_ms.unwrap() >= 1_000, "{r:?}");
    }
    assert!(store.queue_lengths().await.unwrap().is_empty());
    store
        .release(&Hold::new("page", "d0", Vec::new()), 1)
        .await
        .unwrap();
    let (counts, mine) = store.copy_log("page").await.unwrap();
    assert_eq!((counts.global, mine.global), (0, 0));
    // The queue, the waiters and the answers are gone at once; the
    // operation records (every copy operation's, kept for its undo should
    // its reply be lost) expire after the record ttl (10 × the operation
    // timeout here); then only the ticket counter is left (it expires a
    // day after the last deadline).
    let left = page_keys(&redis, "charon");
    assert!(
        left.iter()
            .all(|k| k == "charon:{page}:qn" || k.contains(":o:")),
        "only records and the counter are left ({} keys)",
        left.len()
    );
    let gone = eventually(OP_TIMEOUT * 10 + Duration::from_secs(30), async || {
        page_keys(&redis, "charon") == ["charon:{page}:qn"]
    })
    .await;
    assert!(gone.is_some(), "the operation records expired");
    let after = used_memory(&redis);
    println!("once the operation records expired: used_memory {after} bytes");
    // Back near where it was: what is left is the keyspace's own hash
    // tables, grown for the 10,000 records (Redis shrinks them later),
    // not anything of the queue's.
    assert!(
        after < before + 512 * 1024,
        "memory back near where it was: {before} -> {after}"
    );
}

/// A store on the real clock (Redis TIME) with a 1 s time limit.
async fn live_store(redis: &RedisServer, id: &str) -> Arc<RedisStore> {
    RedisStore::connect(&redis.url(), options(None, id, TTL))
        .await
        .unwrap()
}

/// A live store `id` (maintained in the background) on which "holder"
/// holds `page`'s one copy and "w" waits a minute for it: the stall tests'
/// start.
async fn held_and_awaited(
    redis: &RedisServer,
    id: &str,
) -> (
    Arc<RedisStore>,
    tokio::task::JoinHandle<StoreError>,
    Hold,
    Ticket,
) {
    let store = live_store(redis, id).await;
    let maintain = spawn_maintain(&store);
    let holder = Hold::new("page", "holder", Vec::new());
    let Reserved::Now(r) = wait_for(&*store, "holder", 0, 10).await.unwrap() else {
        panic!("granted at once");
    };
    assert_eq!(r.granted, 1);
    let Reserved::Waiting(t) = wait_for(&*store, "w", 60_000, 10).await.unwrap() else {
        panic!("it waits");
    };
    (store, maintain, holder, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_time_limit_only_delays_a_waiters_copy() {
    let redis = RedisServer::start();
    let (store, _maintain, holder, t) = held_and_awaited(&redis, "short").await;

    let stall = Duration::from_millis(300);
    redis.stop();
    let resume = {
        let pid = redis.pid();
        tokio::spawn(async move {
            tokio::time::sleep(stall).await;
            charon_testkit::signal(pid, "CONT");
        })
    };
    let released = store.release(&holder, 1).await;
    resume.await.unwrap();
    let got = answer(&store, &t).await;
    println!(
        "FAULT waiter_redis_stall_0_3s: injected a {stall:?} SIGSTOP of Redis while a caller waited \
         and the holder released; expected the release to succeed and the copy to reach the waiter; \
         saw {released:?}, then {got:?}"
    );
    released.unwrap();
    assert_eq!(got.unwrap().granted, 1);
    store
        .release(&Hold::new("page", "w", Vec::new()), 1)
        .await
        .unwrap();
    let (counts, _) = store.copy_log("page").await.unwrap();
    assert_eq!(counts.global, 0);
    assert!(store.queue_lengths().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_longer_than_the_time_limit_is_a_server_error_and_leaks_nothing() {
    let redis = RedisServer::start();
    let (store, _maintain, holder, t) = held_and_awaited(&redis, "long").await;

    // During the stall the waiter's look at its outcome is a server error;
    // it gives up and leaves (which fails too); the holder's release fails.
    redis.stop();
    let outcome = store.wait_outcome(&t).await;
    let left = store.leave_queue(&t).await;
    let released = store.release(&holder, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.resume();
    // Once Redis answers again the store settles by itself: the failed
    // release is undone (the holder was told it failed, so it still holds
    // its copy) and the abandoned waiter is taken out, giving back any
    // copy handed to it meanwhile.
    let settled = eventually(TTL * 3, async || {
        store.operations_in_doubt() == 0 && store.waiters_abandoned() == 0
    })
    .await;
    let (counts, mine) = store.copy_log("page").await.unwrap();
    let queued = store.queue_lengths().await.unwrap();
    println!(
        "FAULT waiter_redis_stall_3s: injected a 2 s SIGSTOP of Redis (time limit 1 s) while a caller \
         waited; expected server errors, then the holder's copy counted once and the waiter gone; saw \
         outcome {outcome:?}, leave {left:?}, release {released:?}, settled {settled:?}, counts \
         {counts:?}, queues {queued:?}"
    );
    assert!(
        matches!(outcome, Err(StoreError::Unavailable(_))),
        "{outcome:?}"
    );
    assert!(matches!(left, Err(StoreError::Unavailable(_))), "{left:?}");
    assert!(
        matches!(released, Err(StoreError::Unavailable(_))),
        "{released:?}"
    );
    assert!(settled.is_some(), "the store settled");
    assert_eq!((counts.global, mine.global), (1, 1), "the holder's copy");
    assert!(queued.is_empty(), "{queued:?}");
    // The holder gives it back for real; nothing is left.
    store.release(&holder, 1).await.unwrap();
    let (counts, _) = store.copy_log("page").await.unwrap();
    assert_eq!(counts.global, 0);
    // A new caller gets it at once.
    let Reserved::Now(r) = wait_for(&*store, "next", 60_000, 10).await.unwrap() else {
        panic!("granted at once");
    };
    assert_eq!(r.granted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_works_on_a_redis_cluster() {
    let f = charon_testkit::stores::redis_cluster().await;
    let store = &*f.store;
    let Reserved::Now(r) = wait_for(store, "holder", 0, 10).await.unwrap() else {
        panic!("granted at once");
    };
    assert_eq!(r.granted, 1);
    let Reserved::Waiting(t) = wait_for(store, "w", 60_000, 10).await.unwrap() else {
        panic!("it waits");
    };
    assert_eq!(store.queue_lengths().await.unwrap(), [("page".into(), 1)]);
    store
        .release(&Hold::new("page", "holder", Vec::new()), 1)
        .await
        .unwrap();
    let got = store.wait_outcome(&t).await.unwrap().expect("handed over");
    assert_eq!((got.granted, got.global_holds), (1, 1));
    assert!(store.queue_lengths().await.unwrap().is_empty());
    store
        .release(&Hold::new("page", "w", Vec::new()), 1)
        .await
        .unwrap();
}

/// Redis holds every write for `ms`: operations sent meanwhile time out
/// at the client (their replies are lost) and run when the pause ends.
fn pause_writes(redis: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut raw(redis))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_reply_was_lost_leaves_no_ghost_waiter_and_no_copy() {
    let redis = RedisServer::start();
    // Operations time out after 100 ms, long before the pause ends (the
    // connection is tried again should its start-up take longer on a busy
    // machine: what is tested comes after).
    let mut tries = 0;
    let store = loop {
        let connected = RedisStore::connect(
            &redis.url(),
            RedisOptions {
                op_timeout: Duration::from_millis(100),
                ..options(None, "lost", Duration::from_secs(3))
            },
        )
        .await;
        tries += 1;
        match connected {
            Ok(s) => break s,
            Err(e) if tries < 5 => println!("connect: {e}; trying again"),
            Err(e) => panic!("connect: {e}"),
        }
    };
    let holder = Hold::new("page", "holder", Vec::new());
    let Reserved::Now(r) = wait_for(&*store, "holder", 0, 10).await.unwrap() else {
        panic!("granted at once");
    };
    assert_eq!(r.granted, 1);
    // The join times out here and runs there when the pause ends: a waiter
    // nobody knows of joins the queue.
    pause_writes(&redis, 300);
    let joined = wait_for(&*store, "ghost", 600_000, 10).await;
    assert!(
        matches!(joined, Err(StoreError::Unavailable(_))),
        "{joined:?}"
    );
    assert_eq!(store.operations_in_doubt(), 1);
    let queued = eventually(Duration::from_secs(5), async || {
        store.queue_lengths().await.ok() == Some(vec![("page".to_owned(), 1)])
    })
    .await;
    assert!(queued.is_some(), "the join ran when the pause ended");
    // Before the store settles, the holder's copy is handed to the ghost.
    store.release(&holder, 1).await.unwrap();
    let (counts, _) = store.copy_log("page").await.unwrap();
    assert_eq!(counts.global, 1, "handed to the ghost");
    // The store settles: the ghost leaves and its copy comes back.
    let _maintain = spawn_maintain(&store);
    let settled = eventually(Duration::from_secs(10), async || {
        store.operations_in_doubt() == 0
            && store.copy_log("page").await.ok().map(|(c, _)| c.global) == Some(0)
    })
    .await;
    let queues = store.queue_lengths().await.unwrap();
    println!(
        "FAULT waiter_join_reply_lost: a join timed out and ran later, and was handed a copy; \
         expected the undo to take it out and give the copy back; saw settled {settled:?}, \
         queues {queues:?}"
    );
    assert!(settled.is_some(), "{:?}", store.copy_log("page").await);
    assert!(queues.is_empty(), "{queues:?}");
    let Reserved::Now(r) = wait_for(&*store, "next", 60_000, 10).await.unwrap() else {
        panic!("granted at once");
    };
    assert_eq!(r.granted, 1);
}

/// Redis comes back empty (flushed, or restarted without its data) while a
/// caller waits: the waiter's next look is a server error that says its
/// queue is gone (never a copy nobody counts, never a wait for ever), and
/// the waiter leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_emptied_while_a_caller_waits_is_a_server_error_that_says_so() {
    let redis = RedisServer::start();
    let (store, _maintain, _holder, t) = held_and_awaited(&redis, "emptied").await;
    redis::cmd("FLUSHALL")
        .query::<()>(&mut raw(&redis))
        .unwrap();
    let mut looked = None;
    eventually(Duration::from_secs(10), async || {
        looked = store.wait_outcome(&t).await.err();
        looked.is_some()
    })
    .await;
    println!("FAULT waiter_redis_emptied: Redis flushed while a caller waited; saw {looked:?}");
    let e = looked.expect("a server error, not a wait for ever");
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("lost its data")),
        "{e:?}"
    );
    // The caller gives up: its leave answers, or fails while the counts are
    // rebuilt and is settled by maintenance; either way nothing is left.
    let left = store.leave_queue(&t).await;
    assert!(!matches!(left, Ok(Some(_))), "no copy for it: {left:?}");
    let settled = eventually(Duration::from_secs(10), async || {
        store.waiters_abandoned() == 0 && store.queue_lengths().await.is_ok_and(|q| q.is_empty())
    })
    .await;
    assert!(
        settled.is_some(),
        "{left:?}; abandoned {}",
        store.waiters_abandoned()
    );
}
