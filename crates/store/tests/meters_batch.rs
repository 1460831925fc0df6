//! The differential test of all-or-nothing batches (`Store::meters`, what
//! Envoy's descriptors use, SPEC §11): random batches of one to six
//! operations over random buckets, windows and queues (pairs repeating
//! within a batch, requests, dry runs, charges, refunds, costs, shadowed
//! operations whose rejection does not stop the batch, time jumps
//! between batches) through the in-memory store and the Redis store on
//! one manual clock must give identical batches (committed or not, every
//! reply) and identical client errors; and a batch that does not commit
//! must leave every pair it named as it was (checked by dry runs before
//! and after). Single operations are mixed in, so a batch reads what
//! `meter` wrote and the reverse.
//!
//! The second test breaks `meters.lua` on purpose (through
//! `RedisOptions::meters_mutation`) and checks that the first catches it.
//! `CHARON_DIFF_SEEDS` and `CHARON_DIFF_SEED` work as in
//! `meters_differential.rs`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::meter::testing as shapes;
use charon_core::meter::{Meter, Op};
use charon_core::request::Amount;
use charon_store::{Batch, MemoryStore, MeterOp, RedisOptions, RedisStore, Store, StoreError};
use charon_testkit::RedisServer;
use charon_testkit::stores::{Seeded, meter};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["api/bucket", "api/window", "api/queue", "api/any"];
const DOMAINS: &[&str] = &["alice", "bob", "2001:db8::/48"];

fn outcome(r: &Result<Batch, StoreError>) -> String {
    match r {
        Ok(b) => format!("{b:?}"),
        Err(StoreError::Refused(e)) => format!("client error: {e}"),
        Err(e) => panic!("a store failed: {e}"),
    }
}

/// One seed; `Err` with the story when the stores disagree.
async fn run(
    seed: u64,
    batches: usize,
    redis: &RedisServer,
    mutation: Option<(&str, &str)>,
    seen: &mut BTreeMap<String, usize>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = 1_700_000_000_000 + rng.random_range(0..1_000_000);
    let unit = [1, 7, 50][rng.random_range(0..3usize)];
    let mut meters: Vec<Meter> = (0..RESOURCES.len() as u64)
        .map(|i| {
            let kind = if i < 3 { i } else { rng.random_range(0..3) };
            meter(&mut rng, kind, unit)
        })
        .collect();
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(clock.clone());
    let options = RedisOptions {
        key_prefix: format!("mbatch{seed}{}", u8::from(mutation.is_some())),
        meters_mutation: mutation.map(|(a, b)| (a.to_owned(), b.to_owned())),
        ..charon_testkit::stores::options(
            Some(clock.clone()),
            &format!("seed{seed}"),
            std::time::Duration::from_secs(10),
        )
    };
    let store = RedisStore::connect(&redis.url(), options).await.unwrap();
    let maintain = charon_testkit::stores::spawn_maintain(&store);
    let mut log: Vec<String> = Vec::new();
    let mut result = Ok(());
    for b in 0..batches {
        if rng.random_range(0..60) == 0 {
            let r = rng.random_range(0..RESOURCES.len());
            let kind = rng.random_range(0..3);
            meters[r] = meter(&mut rng, kind, unit);
            log.push(format!("{} is now {:?}", RESOURCES[r], meters[r]));
        }
        let n = rng.random_range(1..=6);
        let mut ops = Vec::with_capacity(n);
        let mut gap = 0;
        for _ in 0..n {
            let r = rng.random_range(0..RESOURCES.len());
            let m = &meters[r];
            let (g, mut op) = shapes::step(&mut Seeded(&mut rng), unit, m.limit() + 2);
            gap = gap.max(g);
            // Envoy's costs are exact: whole or nothing, most of the time.
            if let Op::Request { amount, dry_run } = op
                && rng.random_range(0..3) > 0
            {
                let amount = Amount::exactly(amount.copies()).unwrap();
                op = Op::Request { amount, dry_run };
            }
            // A refund on a window or queue fails the whole batch: keep
            // it rare, so that most batches decide something.
            if let (Op::Refund(c), false) = (op, matches!(m, Meter::Bucket(_)))
                && rng.random_range(0..20) > 0
            {
                op = Op::Charge(c);
            }
            ops.push(MeterOp {
                resource: RESOURCES[r],
                domain: DOMAINS[rng.random_range(0..DOMAINS.len())],
                meter: m,
                op,
                shadow: rng.random_range(0..8) == 0,
                slot: (rng.random_range(0..4) == 0).then_some("edge"),
            });
        }
        clock.advance(gap);
        let before = dry_runs(&memory, &ops).await;
        let a = memory.meters(&ops).await;
        let c = store.meters(&ops).await;
        let (a_text, c_text) = (outcome(&a), outcome(&c));
        let what = format!(
            "batch {b} t={} +{gap} {:?}",
            charon_core::Clock::now(&*clock),
            ops.iter()
                .map(|o| format!("{}/{} {:?}", o.resource, o.domain, o.op))
                .collect::<Vec<_>>()
        );
        log.push(format!("{what} -> {a_text}"));
        if a_text != c_text {
            let tail: Vec<&String> = log.iter().rev().take(12).rev().collect();
            result = Err(format!(
                "seed {seed}: the stores disagree at {what}\n  memory: {a_text}\n  redis:  {c_text}\n\
                 last batches:\n{}\nreplay with CHARON_DIFF_SEED={seed}",
                tail.iter()
                    .map(|s| format!("  {s}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
            break;
        }
        let key = match &a {
            Err(_) => "client error",
            Ok(b) if b.committed => "committed",
            Ok(_) => "not committed",
        };
        *seen.entry(format!("batch {key}")).or_default() += 1;
        if n > 1
            && ops
                .iter()
                .any(|o| (o.resource, o.domain) != (ops[0].resource, ops[0].domain))
            && matches!(&a, Ok(b) if !b.committed)
            && ops
                .iter()
                .zip(&a.as_ref().unwrap().replies)
                .any(|(o, r)| !o.op.rejects(r))
        {
            *seen
                .entry("not committed with some granted".into())
                .or_default() += 1;
        }
        if !matches!(&a, Ok(b) if b.committed) {
            let after = dry_runs(&memory, &ops).await;
            assert_eq!(before, after, "seed {seed}: {what} changed state");
        }
        // Now and then one operation on its own, through `meter`.
        if rng.random_range(0..4) == 0 {
            let o = ops[0];
            let a = memory.meter(o.resource, o.domain, o.meter, o.op).await;
            let c = store.meter(o.resource, o.domain, o.meter, o.op).await;
            if format!("{a:?}") != format!("{c:?}") {
                result = Err(format!(
                    "seed {seed}: the stores disagree on one operation after {what}\n  \
                     memory: {a:?}\n  redis:  {c:?}"
                ));
                break;
            }
        }
    }
    maintain.abort();
    result
}

/// A dry run of 1 on every pair of `ops`: what the pairs hold, seen from
/// outside.
async fn dry_runs(store: &MemoryStore, ops: &[MeterOp<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for o in ops {
        // A batch of one dry run, so that a `slot`'s own counts are read.
        let dry = MeterOp {
            resource: o.resource,
            domain: o.domain,
            meter: o.meter,
            op: Op::dry_run(Amount::exactly(1).unwrap()),
            shadow: false,
            slot: o.slot,
        };
        let r = store.meters(&[dry]).await.map(|b| b.replies);
        out.push(format!("{r:?}"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_batches_agree_and_uncommitted_batches_change_nothing() {
    let redis = RedisServer::start();
    let seeds = charon_testkit::stores::diff_seeds();
    let replay = seeds.len() == 1;
    let mut seen = BTreeMap::new();
    for seed in seeds {
        if let Err(e) = run(seed, 300, &redis, None, &mut seen).await {
            panic!("{e}");
        }
    }
    charon_testkit::stores::print_outcomes(&seen);
    if replay {
        return;
    }
    for k in [
        "batch committed",
        "batch not committed",
        "batch client error",
        "not committed with some granted",
    ] {
        assert!(seen.contains_key(k), "never reached: {k}");
    }
}

/// Each mutation breaks one rule of `meters.lua`; the differential must
/// find every one within a few seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_differential_catches_a_broken_script() {
    let redis = RedisServer::start();
    for (from, to) in [
        // Writes even when a request was rejected: not all or nothing.
        ("if out[1] == 1 then", "if true then"),
        // Decides every operation on the stored state, ignoring the
        // earlier operations of the same batch.
        ("states[key] = write", "states[key] = st"),
        // Forgets that a dry run that is rejected also stops the batch.
        ("(m.op == 'r' or m.op == 'd')", "(m.op == 'r')"),
        // Lets a shadowed rejection stop the batch.
        ("if not shadow and", "if"),
    ] {
        let mut caught = false;
        for seed in 1..=8 {
            if run(seed, 300, &redis, Some((from, to)), &mut BTreeMap::new())
                .await
                .is_err()
            {
                caught = true;
                break;
            }
        }
        assert!(caught, "the mutation {from:?} -> {to:?} went unnoticed");
    }
}
