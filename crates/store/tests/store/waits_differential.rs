//! The differential test of waiting for a copy (SPEC §14): random
//! sequences of reserves that may wait (random `wait_ms`, `queue_limit`,
//! amounts, `ignore_configured`), releases (some with `result_ready`),
//! transfers left to expire, waiters leaving, ticks and time jumps past
//! deadlines, on copy resources with random domain, global and group
//! limits (drawn again now and then, over waiters and holds made under
//! the old ones), through the in-memory store and the Redis store on one manual
//! clock: every reply, every waiter's outcome and the queue lengths must
//! be identical. This is what keeps `lua/wait.lua` (and `reserve.lua`,
//! `release.lua`, `wait_op.lua`) equal to `charon_core::copy::wait`.
//!
//! `CHARON_DIFF_SEEDS=n` runs more seeds; a failure prints its seed, and
//! `CHARON_DIFF_SEED=s` replays it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use charon_core::config::{CopyLimits, Enforcement, GroupLimit};
use charon_core::copy::{Hold, ReserveReply};
use charon_core::request::Amount;
use charon_core::{ManualClock, UNBOUNDED};
use charon_store::{MemoryStore, RedisOptions, RedisStore, Reserved, Store, Ticket, WaitOptions};
use charon_testkit::RedisServer;
use charon_testkit::stores::assert_each_mutation_caught;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["vm/a", "vm/b{x}"];
const DOMAINS: &[&str] = &["alice", "bob", "carol", "dave"];
const GROUPS: &[&str] = &["g1", "g2"];

/// A seed's configuration: limits per (resource, domain), queue limit per
/// resource.
struct Config {
    limits: Vec<Vec<CopyLimits>>,
    queue_limit: Vec<u64>,
}

fn config(rng: &mut StdRng) -> Config {
    let mut limits = Vec::new();
    let mut queue_limit = Vec::new();
    for _ in RESOURCES {
        let global = match rng.random_range(0..4) {
            0 => None,
            _ => Some(rng.random_range(1..=5)),
        };
        let group_limits: Vec<u64> = GROUPS.iter().map(|_| rng.random_range(1..=3)).collect();
        let per_domain = DOMAINS
            .iter()
            .map(|_| CopyLimits {
                domain_limit: match rng.random_range(0..5) {
                    0 => UNBOUNDED,
                    _ => rng.random_range(1..=3),
                },
                global_limit: global,
                groups: GROUPS
                    .iter()
                    .zip(&group_limits)
                    .filter(|_| rng.random_range(0..3) == 0)
                    .map(|(g, l)| GroupLimit {
                        name: (*g).to_owned(),
                        limit: *l,
                    })
                    .collect(),
            })
            .collect();
        limits.push(per_domain);
        queue_limit.push(rng.random_range(0..=4));
    }
    Config {
        limits,
        queue_limit,
    }
}

/// A reserve waiting on both stores: its ticket in each, and its domain.
struct Waiting {
    memory: Ticket,
    redis: Ticket,
    domain: String,
}

fn shown(r: &Result<ReserveReply, charon_store::StoreError>) -> String {
    match r {
        Ok(r) => format!("{r:?}"),
        Err(e) => format!("error: {e}"),
    }
}

fn class(r: &ReserveReply, waited: bool) -> &'static str {
    match (waited, r.granted > 0, r.queue_full, r.result_ready) {
        (_, _, true, _) => "queue full",
        (_, _, _, true) => "result ready",
        (false, true, _, _) => "granted at once",
        (false, false, _, _) => "rejected at once",
        (true, true, _, _) => "handed over after waiting",
        (true, false, _, _) => "rejected after waiting",
    }
}

/// What the stores hold for the sessions of the scenario.
#[derive(Default)]
struct Holds(BTreeMap<Hold, u64>);

impl Holds {
    fn add(&mut self, resource: &str, domain: &str, r: &ReserveReply) {
        if r.granted > 0 {
            let hold = Hold::new(resource, domain, r.group_set());
            *self.0.entry(hold).or_default() += r.granted;
        }
    }

    fn pick(&self, rng: &mut StdRng) -> Option<(Hold, u64)> {
        if self.0.is_empty() {
            return None;
        }
        let (h, n) = self.0.iter().nth(rng.random_range(0..self.0.len()))?;
        Some((h.clone(), rng.random_range(1..=*n)))
    }

    fn take(&mut self, hold: &Hold, n: u64) {
        let left = self.0.get_mut(hold).expect("held");
        *left -= n;
        if *left == 0 {
            self.0.remove(hold);
        }
    }
}

/// One seed; `Err` with the story when the stores disagree.
async fn run(
    seed: u64,
    steps: usize,
    redis: &RedisServer,
    mutation: Option<(&str, &str)>,
    seen: &mut BTreeMap<String, usize>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = if seed.is_multiple_of(2) {
        0
    } else {
        1_700_000_000_000
    };
    let unit = [1, 10, 50][rng.random_range(0..3usize)];
    let mut cfg = config(&mut rng);
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(clock.clone());
    let options = RedisOptions {
        key_prefix: format!("wdiff{}{seed}", if mutation.is_some() { "m" } else { "" }),
        copies_mutation: mutation.map(|(a, b)| (a.to_owned(), b.to_owned())),
        ..charon_testkit::stores::options(
            Some(clock.clone()),
            &format!("seed{seed}"),
            Duration::from_secs(10),
        )
    };
    let store = RedisStore::connect(&redis.url(), options)
        .await
        .expect("connect to the private redis");
    let maintain = charon_testkit::stores::spawn_maintain(&store);
    let stores: [&dyn Store; 2] = [&memory, &*store];
    let mut holds = Holds::default();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut log: Vec<String> = Vec::new();
    let mut failure = None;
    'steps: for i in 0..steps {
        let gap = match rng.random_range(0..6) {
            0 | 1 => 0,
            2 => 1,
            _ => unit * rng.random_range(1..=8),
        };
        clock.advance(gap);
        if rng.random_range(0..80) == 0 {
            // New limits: waiters keep those they arrived with, holds the
            // group sets they were reserved under.
            cfg = config(&mut rng);
            log.push(format!("step {i}: new limits"));
            *seen.entry("new limits".into()).or_default() += 1;
        }
        let r = rng.random_range(0..RESOURCES.len());
        let resource = RESOURCES[r];
        let mut outcomes: Vec<String> = Vec::new();
        let what: String;
        match rng.random_range(0..10) {
            0..=4 => {
                let d = rng.random_range(0..DOMAINS.len());
                let domain = DOMAINS[d];
                let limits = &cfg.limits[r][d];
                let copies = rng.random_range(1..=3);
                let amount = Amount::new(copies, rng.random_range(1..=copies)).unwrap();
                let enforcement = if rng.random_range(0..20) == 0 {
                    Enforcement::Ignore
                } else {
                    Enforcement::Enforce
                };
                let wait = WaitOptions {
                    wait_ms: match rng.random_range(0..4) {
                        0 => 0,
                        _ => unit * rng.random_range(1..=12),
                    },
                    queue_limit: cfg.queue_limit[r],
                };
                what = format!(
                    "reserve {resource}/{domain} {amount:?} {enforcement:?} wait {} limit {}",
                    wait.wait_ms, wait.queue_limit
                );
                let a = memory
                    .reserve_or_wait(resource, domain, limits, amount, enforcement, wait)
                    .await;
                let b = store
                    .reserve_or_wait(resource, domain, limits, amount, enforcement, wait)
                    .await;
                match (a, b) {
                    (Ok(Reserved::Now(a)), Ok(Reserved::Now(b))) => {
                        let (sa, sb) = (shown(&Ok(a.clone())), shown(&Ok(b)));
                        if sa != sb {
                            failure = Some(format!("{what}\n  memory: {sa}\n  redis:  {sb}"));
                            break 'steps;
                        }
                        *seen.entry(class(&a, false).into()).or_default() += 1;
                        // Granted at once: the hold is the session's.
                        holds.add(resource, domain, &a);
                        outcomes.push(sa);
                    }
                    (Ok(Reserved::Waiting(m)), Ok(Reserved::Waiting(t))) => {
                        *seen.entry("waiting".into()).or_default() += 1;
                        outcomes.push("waiting".into());
                        waiting.push(Waiting {
                            memory: m,
                            redis: t,
                            domain: domain.to_owned(),
                        });
                    }
                    (a, b) => {
                        failure = Some(format!("{what}\n  memory: {a:?}\n  redis:  {b:?}"));
                        break 'steps;
                    }
                }
            }
            5 | 6 => {
                let Some((hold, n)) = holds.pick(&mut rng) else {
                    continue;
                };
                let ready = rng.random_range(0..3) == 0;
                what = format!("release {hold:?} {n} ready {ready}");
                let a = memory.release_ready(&hold, n, ready).await;
                let b = store.release_ready(&hold, n, ready).await;
                let (a, b) = (format!("{a:?}"), format!("{b:?}"));
                if a != b {
                    failure = Some(format!("{what}\n  memory: {a}\n  redis:  {b}"));
                    break 'steps;
                }
                holds.take(&hold, n);
                *seen
                    .entry(if ready { "release ready" } else { "release" }.into())
                    .or_default() += 1;
            }
            7 => {
                let Some((hold, n)) = holds.pick(&mut rng) else {
                    continue;
                };
                let ttl = unit * rng.random_range(1..=6);
                what = format!("transfer {hold:?} {n} ttl {ttl}");
                let a = memory.transfer(&hold, n, ttl).await.is_ok();
                let b = store.transfer(&hold, n, ttl).await.is_ok();
                if !(a && b) {
                    failure = Some(format!("{what}\n  memory: {a}\n  redis:  {b}"));
                    break 'steps;
                }
                // Never seized: the copies come back when the ttl passes.
                holds.take(&hold, n);
                *seen.entry("transfer".into()).or_default() += 1;
            }
            8 if !waiting.is_empty() => {
                let w = waiting.swap_remove(rng.random_range(0..waiting.len()));
                what = format!("leave {} ({})", w.memory.id, w.domain);
                let a = memory.leave_queue(&w.memory).await;
                let b = store.leave_queue(&w.redis).await;
                let (sa, sb) = (format!("{a:?}"), format!("{b:?}"));
                if sa != sb {
                    failure = Some(format!("{what}\n  memory: {sa}\n  redis:  {sb}"));
                    break 'steps;
                }
                if let Ok(Some(r)) = a {
                    holds.add(&w.memory.resource, &w.domain, &r);
                    *seen.entry("left with an answer".into()).or_default() += 1;
                } else {
                    *seen.entry("left the queue".into()).or_default() += 1;
                }
            }
            _ => {
                what = format!("tick {resource}");
                for s in stores {
                    s.tick(resource).await.expect("tick");
                }
            }
        }
        // Every waiter looks at its outcome, in order of arrival.
        let mut k = 0;
        while k < waiting.len() {
            let w = &waiting[k];
            let a = memory.wait_outcome(&w.memory).await;
            let b = store.wait_outcome(&w.redis).await;
            let (sa, sb) = (format!("{a:?}"), format!("{b:?}"));
            if sa != sb {
                failure = Some(format!(
                    "{what}, then the outcome of waiter {} ({})\n  memory: {sa}\n  redis:  {sb}",
                    w.memory.id, w.domain
                ));
                break 'steps;
            }
            if let Ok(Some(r)) = a {
                *seen.entry(class(&r, true).into()).or_default() += 1;
                holds.add(&w.memory.resource, &w.domain, &r);
                outcomes.push(format!("waiter {}: {r:?}", w.memory.id));
                waiting.remove(k);
            } else {
                k += 1;
            }
        }
        let mut qa = memory.queue_lengths().await.expect("lengths");
        let qb = store.queue_lengths().await.expect("lengths");
        qa.sort();
        if qa != qb {
            failure = Some(format!(
                "{what}: queue lengths\n  memory: {qa:?}\n  redis:  {qb:?}"
            ));
            break 'steps;
        }
        log.push(format!(
            "step {i} t={} +{gap} {what} -> {}",
            charon_core::Clock::now(&*clock),
            outcomes.join("; ")
        ));
    }
    maintain.abort();
    match failure {
        None => Ok(()),
        Some(f) => {
            let tail: Vec<&String> = log.iter().rev().take(30).rev().collect();
            Err(format!(
                "seed {seed}: the stores disagree at {f}\nlast steps:\n{}\n\
                 replay with CHARON_DIFF_SEED={seed}",
                tail.iter()
                    .map(|s| format!("  {s}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_waits_give_identical_replies() {
    let redis = RedisServer::start();
    let seeds = charon_testkit::stores::diff_seeds();
    let replay = seeds.len() == 1;
    let mut seen = BTreeMap::new();
    for seed in seeds {
        if let Err(story) = run(seed, 400, &redis, None, &mut seen).await {
            panic!("{story}");
        }
    }
    charon_testkit::stores::print_outcomes(&seen);
    if replay {
        return;
    }
    let missing: Vec<&str> = [
        "granted at once",
        "rejected at once",
        "queue full",
        "waiting",
        "handed over after waiting",
        "rejected after waiting",
        "result ready",
        "release ready",
        "transfer",
        "left the queue",
        "left with an answer",
        "new limits",
    ]
    .into_iter()
    .filter(|k| !seen.contains_key(*k))
    .collect();
    assert!(missing.is_empty(), "never reached: {missing:?}");
}

/// Each mutation breaks one rule of the queue's Lua (`wait.lua`,
/// `reserve.lua`); the differential must find every one within a few seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_differential_catches_a_broken_queue_script() {
    let redis = RedisServer::start();
    let redis = &redis;
    assert_each_mutation_caught(
        &[
            // The last waiter served first.
            (
                "redis.call('ZRANGE', W.q, rank, rank + 63)",
                "redis.call('ZRANGE', W.q, rank, rank + 63, 'REV')",
            ),
            // The group limits skipped for a handed-over copy.
            (
                "for k = 1, #fs do room = math.min(",
                "for k = 1, 2 do room = math.min(",
            ),
            // A waiter blocked by the global limit does not stop the
            // serving: those behind it overtake it.
            (
                "if own >= w[4] and global < w[4] then return id end",
                "if false then return id end",
            ),
            // result_ready answers the waiters of every domain.
            ("if w[2] == domain then", "if true then"),
            // A deadline counts one millisecond late.
            (
                "redis.call('ZRANGEBYSCORE', W.d, '-inf', fmt(now), 'WITHSCORES')",
                "redis.call('ZRANGEBYSCORE', W.d, '-inf', fmt(now - 1), 'WITHSCORES')",
            ),
            // The queue holds one waiter more than its limit.
            (
                "redis.call('ZCARD', W.q) <= queue_limit",
                "redis.call('ZCARD', W.q) <= queue_limit + 1",
            ),
        ],
        1..=8,
        async |seed, mutation| {
            run(seed, 300, redis, Some(mutation), &mut BTreeMap::new())
                .await
                .is_err()
        },
    )
    .await;
}
