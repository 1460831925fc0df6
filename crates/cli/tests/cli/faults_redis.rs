//! Redis faults under real `charon serve` processes with the DEFAULT
//! liveness ttl (10 s) and store timeout (1 s): Redis stopped (SIGSTOP)
//! for 0.3, 1.3, 3, 6 and 15 s around a liveness renewal, and Redis
//! restarted empty. In every case both servers stay up, answer server
//! errors during the outage (within the store timeout, no hangs), decide
//! correctly after it, and Redis' copy counts are exactly what the
//! sessions hold. Each case is its own test so that they run in parallel.
//!
//! `--nocapture` shows one `FAULT` line per test: what was injected, what
//! was expected and what was observed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{bin, holder, redis_cli, within};
use charon_client::{Client, ClientOptions, Hold};
use charon_testkit::{CharonProcess, RedisServer};

const LIMITS: &str = crate::support::FLEET_LIMITS;

/// `charon serve`'s defaults.
const TTL: Duration = Duration::from_secs(10);
const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// What an answer during an outage may take beyond the store timeout on
/// this loaded machine (a hang would take far longer).
const ANSWER_MARGIN: Duration = Duration::from_secs(4);

/// Two servers on one private Redis, a client of each, and the copies the
/// test holds through them.
struct Fleet {
    redis: RedisServer,
    servers: Vec<CharonProcess>,
    clients: Vec<Client>,
    held: Arc<Mutex<Vec<Hold>>>,
}

fn client(server: &CharonProcess) -> Client {
    let mut o = ClientOptions::new(server.endpoint());
    o.fail_open = false;
    o.backoff_base = Duration::from_millis(50);
    o.request_timeout = Duration::from_secs(30);
    Client::connect(o).expect("client")
}

async fn fleet() -> Fleet {
    let redis = RedisServer::start();
    let url = redis.url();
    let servers: Vec<CharonProcess> = (0..2)
        .map(|_| CharonProcess::start(bin(), LIMITS, &["--store", url.as_str()]))
        .collect();
    let clients: Vec<Client> = servers.iter().map(client).collect();
    let a = clients[0]
        .reserve("vm", "a")
        .copies(3)
        .send()
        .await
        .expect("reserve");
    let b = clients[1]
        .reserve("vm", "b")
        .copies(4)
        .send()
        .await
        .expect("reserve");
    assert_eq!((a.copies(), b.copies()), (3, 4));
    Fleet {
        redis,
        servers,
        clients,
        held: Arc::new(Mutex::new(vec![a, b])),
    }
}

/// Redis' copy counts of `vm`: `g` and `d:<domain>`.
fn copy_counts(redis: &RedisServer) -> BTreeMap<String, u64> {
    let out = redis_cli(redis, &["HGETALL", "charon:{vm}:c"]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .filter_map(|kv| Some((kv[0].to_owned(), kv.get(1)?.trim().parse().ok()?)))
        .collect()
}

/// What the test's sessions hold, as Redis should count it.
fn held_counts(held: &[Hold]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for h in held.iter().filter(|h| h.copies() > 0) {
        *counts.entry("g".to_owned()).or_default() += h.copies();
        *counts.entry(format!("d:{}", h.domain())).or_default() += h.copies();
    }
    counts
}

/// Returns just after the first server's next liveness renewal (its key's
/// time to live jumps back up).
fn after_a_renewal(redis: &RedisServer, server: &CharonProcess) -> Instant {
    let pattern = format!("charon:{{%m}}:live:*-{}.*", server.pid());
    let key = redis_cli(redis, &["KEYS", &pattern]);
    let key = key.trim();
    assert!(!key.is_empty(), "no liveness key matches {pattern}");
    let pttl = || -> i64 {
        redis_cli(redis, &["PTTL", key])
            .trim()
            .parse()
            .unwrap_or(-1)
    };
    let mut last = pttl();
    let deadline = Instant::now() + TTL;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        let now = pttl();
        if now > last {
            return Instant::now();
        }
        last = now;
    }
    panic!("no liveness renewal seen within {TTL:?}");
}

/// What the servers answered while Redis was out.
#[derive(Debug, Default)]
struct Outage {
    server_errors: u64,
    decisions: u64,
    slowest: Duration,
}

/// Asks both servers for a rate decision and a copy, over and over, until
/// `stop`; every answer must be a server error or a correct decision, and
/// come within the store timeout and a margin.
fn probe(fleet: &Fleet, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Outage> {
    let clients = fleet.clients.clone();
    let held = fleet.held.clone();
    tokio::spawn(async move {
        let mut seen = Outage::default();
        while !stop.load(Ordering::Relaxed) {
            for c in &clients {
                let asked = Instant::now();
                let rate = c.request("api", "p").send().await;
                let reserve = c.reserve("vm", "c").send().await;
                let took = asked.elapsed();
                seen.slowest = seen.slowest.max(took);
                assert!(
                    took < (STORE_TIMEOUT + ANSWER_MARGIN) * 2,
                    "two answers took {took:?} during the outage"
                );
                match rate {
                    Ok(g) => {
                        assert!(g.is_granted(), "{g:?}");
                        seen.decisions += 1;
                    }
                    Err(ref e) if e.is_server() => seen.server_errors += 1,
                    Err(e) => panic!("a server error, not {e:?}"),
                }
                match reserve {
                    Ok(h) => {
                        seen.decisions += 1;
                        held.lock().expect("held").push(h);
                    }
                    Err(ref e) if e.is_server() => seen.server_errors += 1,
                    Err(e) => panic!("a server error, not {e:?}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

/// Traffic as production has it, after the outage until `until`: on both
/// servers, a rate request and a reserve released at once, over and over.
/// Copy operations in this stretch are what made servers resign when their
/// last renewal was more than half a ttl old. Returns (decisions, server
/// errors).
async fn traffic_until(fleet: &Fleet, until: Instant) -> (u64, u64) {
    let (mut decisions, mut errors) = (0, 0);
    while Instant::now() < until {
        for c in &fleet.clients {
            match c.request("api", "t").send().await {
                Ok(_) => decisions += 1,
                Err(_) => errors += 1,
            }
            match c.reserve("vm", "t").send().await {
                Ok(mut h) => {
                    decisions += 1;
                    if h.release_all().await.is_err() {
                        fleet.held.lock().expect("held").push(h);
                    }
                }
                Err(_) => errors += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (decisions, errors)
}

/// After the outage: both servers still run and decide again, Redis
/// counts exactly what the sessions hold, and a reserve of everything
/// left gets exactly that. Returns how long deciding again took.
async fn check_after(fleet: &mut Fleet, what: &str) -> (Duration, Duration) {
    let decided = within(TTL * 3, async || {
        let mut all = true;
        for c in &fleet.clients {
            let rate = c.request("api", "q").send().await;
            let reserve = c.reserve("vm", "c").send().await;
            match reserve {
                Ok(h) => fleet.held.lock().expect("held").push(h),
                Err(_) => all = false,
            }
            all &= rate.is_ok_and(|g| g.is_granted());
        }
        all
    })
    .await;
    let decided = decided.unwrap_or_else(|| {
        panic!(
            "{what}: the servers do not decide again:\n{}\n{}",
            fleet.servers[0].log(),
            fleet.servers[1].log()
        )
    });
    for s in &mut fleet.servers {
        assert!(
            s.wait_exit(Duration::ZERO).is_none(),
            "{what}: a server stopped:\n{}",
            s.log()
        );
        assert!(!s.log().contains("resigned"), "{what}:\n{}", s.log());
    }
    // Operations that timed out during the outage ran when Redis came
    // back and are undone; holds of ended sessions are released: the
    // counts converge to exactly what the sessions hold.
    let expected = held_counts(&fleet.held.lock().expect("held"));
    let exact = within(TTL * 3, async || copy_counts(&fleet.redis) == expected).await;
    let exact = exact.unwrap_or_else(|| {
        panic!(
            "{what}: Redis counts {:?}, sessions hold {expected:?}\n{}\n{}",
            copy_counts(&fleet.redis),
            fleet.servers[0].log(),
            fleet.servers[1].log()
        )
    });
    // Deciding correctly: never more than the global limit, and what is
    // left of it, exactly.
    let total = expected.get("g").copied().unwrap_or(0);
    assert!(
        total <= 10,
        "{what}: {total} held against a global limit of 10"
    );
    let left = 10 - total;
    let rest = fleet.clients[1]
        .reserve("vm", "z")
        .copies(10)
        .min_copies(1)
        .send()
        .await
        .expect("reserve");
    assert_eq!(rest.copies(), left, "{what}: the rest of the global limit");
    (decided, exact)
}

/// Redis stopped for `stall`, from just before the first server's next
/// renewal.
async fn stall_around_a_renewal(stall: Duration, name: &str) {
    let mut fleet = fleet().await;
    let renewed = tokio::task::block_in_place(|| after_a_renewal(&fleet.redis, &fleet.servers[0]));
    // The stall starts just before the next renewal, so that the renewal
    // is sent into it (and fails, if the stall outlasts the store timeout).
    let next = renewed + TTL / 3;
    let start = next
        .checked_sub((stall / 4).min(Duration::from_millis(200)))
        .unwrap_or(renewed);
    tokio::time::sleep(start.saturating_duration_since(Instant::now())).await;

    let stop = Arc::new(AtomicBool::new(false));
    fleet.redis.stop();
    let probes = probe(&fleet, stop.clone());
    tokio::time::sleep(stall).await; // the fault itself
    fleet.redis.resume();
    stop.store(true, Ordering::Relaxed);
    let resumed = Instant::now();
    let seen = probes.await.expect("probes");
    if stall > STORE_TIMEOUT {
        assert!(seen.server_errors > 0, "{name}: {seen:?}");
    }
    // Keep the traffic going past the moment the last renewal before the
    // stall is two thirds of a ttl old (when the next one is due).
    let until =
        (renewed + TTL * 2 / 3 + Duration::from_secs(1)).max(resumed + Duration::from_secs(1));
    let (after, errors_after) = traffic_until(&fleet, until).await;
    let (decided, exact) = check_after(&mut fleet, name).await;
    let held = held_counts(&fleet.held.lock().expect("held"));
    println!(
        "FAULT {name}: injected SIGSTOP of Redis for {stall:?} around a liveness renewal (ttl 10 s, store timeout 1 s); \
         expected no resignation, server errors during it within the store timeout, correct decisions and exact counts after; \
         observed {} server errors and {} decisions during it (slowest pair of answers {:?}), \
         then {after} decisions and {errors_after} server errors in {:?} of traffic after resume, both servers up, \
         deciding again {decided:?} later, counts exact ({held:?}) {exact:?} after that",
        seen.server_errors,
        seen.decisions,
        seen.slowest,
        until.saturating_duration_since(resumed),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_0_3s_around_a_renewal_keeps_the_fleet_up_and_exact() {
    stall_around_a_renewal(Duration::from_millis(300), "redis-stall-0.3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_1_3s_around_a_renewal_keeps_the_fleet_up_and_exact() {
    stall_around_a_renewal(Duration::from_millis(1_300), "redis-stall-1.3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_3s_around_a_renewal_keeps_the_fleet_up_and_exact() {
    stall_around_a_renewal(Duration::from_secs(3), "redis-stall-3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_6s_around_a_renewal_keeps_the_fleet_up_and_exact() {
    stall_around_a_renewal(Duration::from_secs(6), "redis-stall-6s").await;
}

/// Longer than the ttl: every liveness key lapses at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_15s_longer_than_the_ttl_keeps_the_fleet_up_and_exact() {
    stall_around_a_renewal(Duration::from_secs(15), "redis-stall-15s").await;
}

/// Redis restarted without its data, while a session that ended during
/// the outage still had copies to give back: the servers rebuild the
/// counts from their sessions' holds before anyone reserves again, so the
/// global limit holds (before the fix: 11 held against 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_keeps_the_fleet_up_and_the_counts_exact() {
    let mut fleet = fleet().await;
    // Two more copies of `a` on the first server, held by a process that
    // will die during the outage.
    let mut doomed = holder(&fleet.servers[0], "vm", "a", 2);
    assert_eq!(copy_counts(&fleet.redis).get("g"), Some(&9));

    let stop = Arc::new(AtomicBool::new(false));
    let probes = probe(&fleet, stop.clone());
    let down = Duration::from_secs(2);
    let killed = Instant::now();
    let redis = &mut fleet.redis;
    let restart = async {
        tokio::task::block_in_place(|| {
            redis.kill();
            // Its session ends while Redis is down: the release fails.
            let _ = doomed.kill();
            let _ = doomed.wait();
            std::thread::sleep(down); // the fault itself
            redis.restart_after(Duration::ZERO);
        });
    };
    restart.await;
    // Until the counts are rebuilt, reserves are refused: none of these
    // may be granted (the sessions still hold 7 of 10, and must not get
    // more than 3).
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = probes.await.expect("probes");
    assert!(seen.server_errors > 0, "{seen:?}");
    let (decided, exact) = check_after(&mut fleet, "redis-restart").await;
    let held = held_counts(&fleet.held.lock().expect("held"));
    println!(
        "FAULT redis-restart-empty: injected SIGKILL of Redis, 2 s down, restart without data, \
         and a client holding 2 copies killed meanwhile (ttl 10 s); \
         expected no resignation, server errors during the outage and the rebuild, no over-grant, exact counts; \
         observed {} server errors and {} decisions during it (slowest pair of answers {:?}), both servers up, \
         deciding again {decided:?} after the restart, counts exact ({held:?}) {exact:?} after that, \
         {:?} from the kill",
        seen.server_errors,
        seen.decisions,
        seen.slowest,
        killed.elapsed()
    );
}
