//! The differential test of all-or-nothing batches (`Store::meters`, what
//! Envoy's descriptors use, SPEC §11): random batches of one to six
//! operations over random buckets, windows, queues and burst tiers (H, G,
//! soft limits, bans, `ignore_configured` now and then; pairs repeating
//! within a batch, requests, dry runs, charges, refunds, costs, shadowed
//! operations whose rejection does not stop the batch, time jumps
//! between batches) through the in-memory store and the Redis store on
//! one manual clock must give identical batches (committed or not, every
//! reply) and identical client errors; and a batch that does not commit
//! must leave every pair it named as it was (checked by dry runs before
//! and after). Single operations are mixed in, so a batch reads what
//! `meter` (or `tiers`) wrote and the reverse.
//!
//! The second test breaks `meters.lua` on purpose (through
//! `RedisOptions::meters_mutation`), in the meters' rules and in the
//! tiers' (their rule and the overlay that holds their writes), and checks
//! that the first catches it.
//! `CHARON_DIFF_SEEDS` and `CHARON_DIFF_SEED` work as in
//! `meters_differential.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::meter::testing as shapes;
use charon_core::meter::{Meter, Op};
use charon_core::request::Amount;
use charon_store::{Batch, Limit, MemoryStore, MeterOp, Store, StoreError};
use charon_testkit::RedisServer;
use charon_testkit::stores::{Kind, Seeded, assert_each_mutation_caught, kind, single};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &[
    "api/bucket",
    "api/window",
    "api/queue",
    "api/tiers",
    "api/any",
];
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
    let mut kinds: Vec<Kind> = (0..RESOURCES.len() as u64)
        .map(|i| {
            let k = if i < 4 { i } else { rng.random_range(0..4) };
            kind(&mut rng, k, unit)
        })
        .collect();
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(clock.clone());
    let (store, maintain) =
        charon_testkit::stores::seed_store_mutated(redis, &clock, "mbatch", seed, mutation).await;
    let mut log: Vec<String> = Vec::new();
    let mut result = Ok(());
    for b in 0..batches {
        if rng.random_range(0..60) == 0 {
            let r = rng.random_range(0..RESOURCES.len());
            let k = rng.random_range(0..4);
            kinds[r] = kind(&mut rng, k, unit);
            log.push(format!("{} is now {:?}", RESOURCES[r], kinds[r]));
        }
        let n = rng.random_range(1..=6);
        let mut ops: Vec<MeterOp<'_>> = Vec::with_capacity(n);
        let mut gap = 0;
        for _ in 0..n {
            // The same pair twice in a row, now and then.
            let again = ops.last().filter(|_| rng.random_range(0..4) == 0).copied();
            let r = match again {
                Some(o) => RESOURCES.iter().position(|r| *r == o.resource).unwrap(),
                None => rng.random_range(0..RESOURCES.len()),
            };
            let k = &kinds[r];
            let most = match k {
                Kind::Meter(m) => m.limit() + 2,
                Kind::Tiers(..) => 6,
            };
            let (g, mut op) = shapes::step(&mut Seeded(&mut rng), unit, most);
            gap = gap.max(g);
            // Envoy's costs are exact: whole or nothing, most of the time.
            if let Op::Request { amount, dry_run } = op
                && rng.random_range(0..3) > 0
            {
                let amount = Amount::exactly(amount.copies()).unwrap();
                op = Op::Request { amount, dry_run };
            }
            // A refund on a window, queue or tiers fails the whole batch:
            // keep it rare, so that most batches decide something.
            if let (Op::Refund(c), false) = (op, matches!(k, Kind::Meter(Meter::Bucket(_))))
                && rng.random_range(0..20) > 0
            {
                op = Op::Charge(c);
            }
            let domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
            let slot = (rng.random_range(0..4) == 0).then_some("edge");
            ops.push(MeterOp {
                resource: RESOURCES[r],
                domain: again.map_or(domain, |o| o.domain),
                limit: k.limit(),
                op,
                shadow: rng.random_range(0..8) == 0,
                slot: again.map_or(slot, |o| o.slot),
            });
        }
        clock.advance(gap);
        // On both stores, twice: a dry run on burst tiers writes, as on its
        // own, the forget time a changed configuration gives the pair's
        // state (which may then be forgotten at once), so the first pass
        // settles that and the second is what the pairs hold.
        dry_runs(&memory, &ops).await;
        dry_runs(&*store, &ops).await;
        let before = dry_runs(&memory, &ops).await;
        let before_redis = dry_runs(&*store, &ops).await;
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
            let tail: Vec<&String> = log.iter().rev().take(40).rev().collect();
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
        let tiers = ops
            .iter()
            .filter(|o| matches!(o.limit, Limit::Tiers { .. }))
            .count();
        if tiers > 0 && tiers < n {
            *seen.entry(format!("mixed batch {key}")).or_default() += 1;
        }
        if ops.windows(2).any(|w| {
            matches!(w[0].limit, Limit::Tiers { .. })
                && (w[0].resource, w[0].domain, w[0].slot)
                    == (w[1].resource, w[1].domain, w[1].slot)
        }) {
            *seen.entry("tiers pair twice".into()).or_default() += 1;
        }
        if n > 1
            && ops
                .iter()
                .any(|o| (o.resource, o.domain) != (ops[0].resource, ops[0].domain))
            && matches!(&a, Ok(b) if !b.committed)
            && ops
                .iter()
                .zip(&a.as_ref().unwrap().replies)
                .any(|(o, r)| !r.rejects(o.op))
        {
            *seen
                .entry("not committed with some granted".into())
                .or_default() += 1;
        }
        if before != before_redis {
            result = Err(format!(
                "seed {seed}: the stores disagree on dry runs before {what}\n  \
                 memory: {before:?}\n  redis:  {before_redis:?}"
            ));
            break;
        }
        if !matches!(&a, Ok(b) if b.committed) {
            let after = dry_runs(&memory, &ops).await;
            assert_eq!(before, after, "seed {seed}: {what} changed state");
            let after = dry_runs(&*store, &ops).await;
            if before_redis != after {
                result = Err(format!(
                    "seed {seed}: {what} changed Redis\n  before: {before_redis:?}\n  after:  {after:?}"
                ));
                break;
            }
        }
        // Now and then one operation on its own, through `meter` or
        // `tiers`.
        if rng.random_range(0..4) == 0 {
            let o = ops[0];
            let a = single(&memory, &o).await;
            let c = single(&*store, &o).await;
            log.push(format!(
                "alone {}/{} {:?} -> {a}",
                o.resource, o.domain, o.op
            ));
            if a != c {
                result = Err(format!(
                    "seed {seed}: the stores disagree on one operation after {what}\n  \
                     memory: {a}\n  redis:  {c}"
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
async fn dry_runs(store: &dyn Store, ops: &[MeterOp<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for o in ops {
        // A batch of one dry run, so that a `slot`'s own counts are read.
        let dry = MeterOp {
            resource: o.resource,
            domain: o.domain,
            limit: o.limit,
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
        "mixed batch committed",
        "mixed batch not committed",
        "tiers pair twice",
    ] {
        assert!(seen.contains_key(k), "never reached: {k}");
    }
}

/// Each mutation breaks one rule of `meters.lua` (the meters' or the
/// tiers'); the differential must find every one within a few seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_differential_catches_a_broken_script() {
    let redis = RedisServer::start();
    let redis = &redis;
    assert_each_mutation_caught(
        &[
            // Writes even when a request was rejected: not all or nothing.
            ("if out[1] == 1 then", "if true then"),
            // Decides every operation on the stored state, ignoring the
            // earlier operations of the same batch.
            ("states[key] = write", "states[key] = st"),
            // Forgets that a dry run that is rejected also stops the batch.
            ("(m.op == 'r' or m.op == 'd')", "(m.op == 'r')"),
            // Lets a shadowed rejection stop the batch.
            ("if not shadow and", "if"),
            // Tiers: forgets that a rejected dry run stops the batch.
            (
                "rejected = (op == 'r' or op == 'd')",
                "rejected = (op == 'r')",
            ),
            // Meters alone (meters_lean.lua): a shadowed rejection stops the
            // batch.
            ("if ARGV[a] ~= '1' and (op == 'r'", "if (op == 'r'"),
            // Meters alone: the states are written although a request was
            // rejected.
            (
                "if out[1] == 1 then\n  for _, key in ipairs(order) do\n    lean_store",
                "if true then\n  for _, key in ipairs(order) do\n    lean_store",
            ),
            // Tiers: the rule itself, inside the batch only (one more hit fits
            // in the current tier).
            (
                "local room = math.max(tiers[at].limit - tier_hits(st, at), 0)",
                "local room = math.max(tiers[at].limit + 1 - tier_hits(st, at), 0)",
            ),
            // Tiers: each operation reads the stored state, not what the
            // earlier ones of the batch left.
            ("if not e.str then", "if true then"),
            // Tiers: a committed batch does not drop the hits its operations
            // pruned from the front of the lists.
            ("if e.off > 0 then", "if false then"),
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
