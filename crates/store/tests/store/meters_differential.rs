//! The differential test of buckets, windows and queues: random meters of
//! every kind and policy (soft limits, bans) and random operations
//! (requests, dry runs, charges, refunds, multi-unit requests with
//! `min_copies`, time jumps across refills, window turns, ban ends and
//! forget times) through the in-memory store and the Redis store on one
//! manual clock must give identical replies and identical client errors.
//! This is what keeps `drain.lua` or `window.lua` equal to `charon_core::meter::decide`.
//!
//! The shapes come from `charon_core::meter::testing`, the generator of
//! core's naive-model property tests. `CHARON_DIFF_SEEDS=n` runs more
//! seeds; a failure prints its seed, and `CHARON_DIFF_SEED=s` replays it.

use std::collections::BTreeMap;
use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::meter::testing as shapes;
use charon_core::meter::{Meter, Op, Reply};
use charon_store::{MemoryStore, Store, StoreError};
use charon_testkit::RedisServer;
use charon_testkit::stores::{Seeded, assert_each_mutation_caught, meter};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["api/bucket", "api/window", "api/queue", "api/any"];
const DOMAINS: &[&str] = &["alice", "bob", "10.0.0.2"];

/// The domain that gets charges at the exact bound of the debt (and then
/// stays in debt for ages), apart from the others.
const DEBTOR: &str = "debtor";

/// The most units `m` can be charged from an empty state.
fn most_charged(m: &Meter) -> u64 {
    match m {
        Meter::Bucket(p) => p.ticks().max_ahead / p.ticks().per_unit,
        Meter::Queue(p) => p.ticks().max_ahead / p.ticks().per_unit,
        Meter::Window(p) => p.max_count(),
    }
}

/// Bad or extreme input: a charge or refund of 0, a count beyond 2^53 − 1,
/// or a charge around the exact bound of the debt (refused or not
/// depending on the state, so the script's own refusal is compared).
fn bad_input(rng: &mut StdRng, m: &Meter) -> (Op, bool) {
    match rng.random_range(0..5) {
        0 => (Op::Charge(0), false),
        1 => (Op::Refund(0), false),
        2 => (Op::Charge(charon_core::MAX_COUNT + 1), false),
        _ => {
            let most = most_charged(m);
            let n = most - rng.random_range(0..=m.limit().min(most - 1));
            let n = if rng.random_range(0..4) == 0 {
                most + 1
            } else {
                n
            };
            (Op::Charge(n), true)
        }
    }
}

fn outcome(r: &Result<Reply, StoreError>) -> String {
    match r {
        Ok(r) => format!("{r:?}"),
        Err(StoreError::Refused(e)) => format!("client error: {e}"),
        Err(e) => panic!("a store failed: {e}"),
    }
}

/// What kind of outcome a reply is, to show the scenarios reach them all.
fn class(kind: &str, op: &Op, r: &Result<Reply, StoreError>) -> String {
    let op = match op {
        Op::Request { dry_run: false, .. } => "request",
        Op::Request { dry_run: true, .. } => "dry run",
        Op::Charge(_) => "charge",
        Op::Refund(_) => "refund",
    };
    let what = match r {
        Err(_) => "client error",
        Ok(r) if r.banned => "banned",
        Ok(r) if r.granted == 0 => "rejected",
        Ok(r) if r.warning => "granted with a warning",
        Ok(r) if r.delay_ms.is_some_and(|d| d > 0) => "granted with a delay",
        Ok(_) => "granted",
    };
    format!("{kind} {op} {what}")
}

fn kind_name(m: &Meter) -> &'static str {
    match m {
        Meter::Bucket(_) => "bucket",
        Meter::Window(_) => "window",
        Meter::Queue(_) => "queue",
    }
}

/// Charges at the exact bound of the debt, which the random walk reaches
/// too rarely to hold the scripts to it: on fresh pairs of random buckets
/// and queues, a first charge of `k` units (no time passes, so the debt is
/// exactly `k` units), then `most - k` (the last that fits: granted) on one
/// pair and `most - k + 1` (refused) on another, `most` being what an
/// empty level can be charged. `Err` with the story when the stores
/// disagree.
async fn exact_debt_bounds(
    seed: u64,
    redis: &RedisServer,
    mutation: Option<(&str, &str)>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let memory = MemoryStore::new(clock.clone());
    let (store, maintain) =
        charon_testkit::stores::seed_store_mutated(redis, &clock, "mbound", seed, mutation).await;
    let mut outcomes = BTreeMap::<String, usize>::new();
    for i in 0..24 {
        let unit = [1, 7, 50][rng.random_range(0..3usize)];
        let m = meter(&mut rng, [0, 2][i % 2], unit);
        let most = most_charged(&m);
        let k = [0, 1, rng.random_range(0..=most / 2)][rng.random_range(0..3usize)];
        for (pair, last) in [("fits", most - k), ("past", most - k + 1)] {
            let domain = format!("{pair}-{i}");
            let mut ops = vec![Op::Charge(last)];
            if k > 0 {
                ops.insert(0, Op::Charge(k));
            }
            for op in ops {
                let a = outcome(&memory.meter(RESOURCES[0], &domain, &m, op).await);
                let b = outcome(&store.meter(RESOURCES[0], &domain, &m, op).await);
                if a != b {
                    maintain.abort();
                    return Err(format!(
                        "seed {seed}: {m:?}, {domain} {op:?} (most {most}, k {k})\n  \
                         memory: {a}\n  redis:  {b}"
                    ));
                }
                *outcomes.entry(format!("{pair} {}", &a[..2])).or_default() += 1;
            }
        }
    }
    maintain.abort();
    // Both sides of the bound were reached (a grant is `Reply..`, a
    // refusal `client error..`).
    for k in ["fits Re", "past cl"] {
        if !outcomes.contains_key(k) {
            return Err(format!("seed {seed}: never reached {k}: {outcomes:?}"));
        }
    }
    Ok(())
}

/// One seed; `Err` with the story when the stores disagree. `mutation`
/// breaks the Redis store's scripts (see `RedisOptions::meters_mutation`).
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
        1_700_000_000_000 + rng.random_range(0..1_000_000)
    };
    let unit = [1, 7, 50][rng.random_range(0..3usize)];
    let mut meters: Vec<Meter> = (0..RESOURCES.len() as u64)
        .map(|i| {
            let kind = if i < 3 { i } else { rng.random_range(0..3) };
            meter(&mut rng, kind, unit)
        })
        .collect();
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(clock.clone());
    let (store, maintain) =
        charon_testkit::stores::seed_store_mutated(redis, &clock, "mdiff", seed, mutation).await;
    let mut log: Vec<String> = Vec::new();
    for i in 0..steps {
        let r = rng.random_range(0..RESOURCES.len());
        if rng.random_range(0..150) == 0 {
            // A configuration change: new parameters, maybe another kind,
            // over the state the old ones left.
            let kind = rng.random_range(0..3);
            meters[r] = meter(&mut rng, kind, unit);
            log.push(format!("{} is now {:?}", RESOURCES[r], meters[r]));
            *seen.entry("configuration changed".into()).or_default() += 1;
        }
        let mut domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
        let m = &meters[r];
        let (gap, mut op) = shapes::step(&mut Seeded(&mut rng), unit, m.limit() + 2);
        if rng.random_range(0..40) == 0 {
            let (bad, debtor) = bad_input(&mut rng, m);
            op = bad;
            if debtor {
                domain = DEBTOR;
            }
        } else if rng.random_range(0..40) == 0 {
            domain = DEBTOR;
        }
        // Now and then a single millisecond, to land just after a boundary.
        let gap = if rng.random_range(0..10) == 0 { 1 } else { gap };
        clock.advance(gap);
        if rng.random_range(0..50) == 0 {
            let swept = memory.sweep();
            if swept.pairs > 0 {
                *seen.entry("idle state swept".into()).or_default() += 1;
            }
        }
        let before = memory.meter_count();
        let stateless = m.decide(&mut m.empty(), 0, op).is_ok();
        let a = memory.meter(RESOURCES[r], domain, m, op).await;
        let b = store.meter(RESOURCES[r], domain, m, op).await;
        if memory.meter_count() < before {
            *seen
                .entry("idle state dropped on access".into())
                .or_default() += 1;
        }
        let (a, b_text) = (outcome(&a), outcome(&b));
        let what = format!(
            "step {i} t={} +{gap} {}/{domain} {op:?}",
            charon_core::Clock::now(&*clock),
            RESOURCES[r]
        );
        log.push(format!("{what} -> {a}"));
        if a != b_text {
            let tail: Vec<&String> = log.iter().rev().take(30).rev().collect();
            maintain.abort();
            return Err(format!(
                "seed {seed}: the stores disagree at {what}\n  memory: {a}\n  redis:  {b_text}\n\
                 meters (unit {unit}):\n{}\nlast steps:\n{}\n\
                 replay with CHARON_DIFF_SEED={seed}",
                RESOURCES
                    .iter()
                    .zip(&meters)
                    .map(|(r, m)| format!("  {r}: {m:?}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                tail.iter()
                    .map(|s| format!("  {s}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
        }
        *seen.entry(class(kind_name(m), &op, &b)).or_default() += 1;
        if stateless && b.is_err() {
            *seen.entry("refusal by the script".into()).or_default() += 1;
        }
    }
    maintain.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_meters_give_identical_replies() {
    let redis = RedisServer::start();
    let seeds = charon_testkit::stores::diff_seeds();
    let replay = seeds.len() == 1;
    let mut seen = BTreeMap::new();
    for seed in seeds {
        if let Err(story) = run(seed, 800, &redis, None, &mut seen).await {
            panic!("{story}");
        }
    }
    charon_testkit::stores::print_outcomes(&seen);
    if replay {
        return;
    }
    let mut missing = Vec::new();
    for kind in ["bucket", "window", "queue"] {
        for what in [
            "request granted",
            "request rejected",
            "request banned",
            "request granted with a warning",
            "dry run granted",
            "dry run rejected",
            "charge granted",
            "charge client error",
        ] {
            let k = format!("{kind} {what}");
            if !seen.contains_key(&k) {
                missing.push(k);
            }
        }
    }
    for k in [
        "bucket refund granted",
        "window refund client error",
        "queue refund client error",
        "refusal by the script",
        "queue request granted with a delay",
        "idle state dropped on access",
        "idle state swept",
    ] {
        if !seen.contains_key(k) {
            missing.push(k.to_owned());
        }
    }
    assert!(missing.is_empty(), "never reached: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_at_the_exact_bound_of_the_debt_agree() {
    let redis = RedisServer::start();
    for seed in 1..=3 {
        if let Err(story) = exact_debt_bounds(seed, &redis, None).await {
            panic!("{story}");
        }
    }
}

/// A script that lets a charge one unit past the bound of the debt is
/// caught by the charges at the exact bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_past_the_debt_bound_in_the_script_is_caught() {
    let redis = RedisServer::start();
    let redis = &redis;
    assert_each_mutation_caught(
        &[(
            "if copies > math.floor((MAX_AHEAD - d) / P) then",
            "if copies > math.floor((MAX_AHEAD - d) / P) + 1 then",
        )],
        1..=3,
        async |seed, mutation| {
            exact_debt_bounds(seed, redis, Some(mutation))
                .await
                .is_err()
        },
    )
    .await;
}

/// Each mutation breaks one rule of the lean scripts of single operations
/// (`lean_drain.lua`, `lean_window.lua`); the differential must find every
/// one within a few seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_differential_catches_a_broken_lean_script() {
    let redis = RedisServer::start();
    let redis = &redis;
    assert_each_mutation_caught(
        &[
            // Buckets and queues: one more unit fits than the level leaves.
            (
                "if d < FULL then room = math.floor((FULL - d) / P) end",
                "if d < FULL then room = math.floor((FULL - d) / P) + 1 end",
            ),
            // Queues: the wait before a request's first unit one millisecond
            // long.
            (
                "if kind == 'q' then delay = math.floor(d / C);",
                "if kind == 'q' then delay = math.floor(d / C) + 1;",
            ),
            // A rejection while banned extends the ban (both kinds).
            (
                "if not banned and ban_ms > 0 then new_ban = now + ban_ms end",
                "if ban_ms > 0 then new_ban = now + ban_ms end",
            ),
            // Windows: a sliding window forgets its current count a window
            // early.
            (
                "if sliding and c ~= 0 then return (i + 2) * W end",
                "if sliding and c ~= 0 then return (i + 1) * W end",
            ),
            // Windows: a fixed window's retry one millisecond late.
            (
                "if c + min <= LIMIT then retry = 0 else retry = to_next end",
                "if c + min <= LIMIT then retry = 0 else retry = to_next + 1 end",
            ),
        ],
        1..=8,
        async |seed, mutation| {
            run(seed, 400, redis, Some(mutation), &mut BTreeMap::new())
                .await
                .is_err()
        },
    )
    .await;
}
