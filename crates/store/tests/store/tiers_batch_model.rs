//! A naive model of an all-or-nothing batch of burst tiers operations
//! (`Store::meters` with `Limit::Tiers`, SPEC §11): `charon_core::rate::
//! decide_op` applied to each operation in turn on a copy of every pair's
//! state and every resource's last second, the copy kept only if no
//! request or dry run (shadowed ones aside) was rejected. The in-memory
//! store must give the same batch (committed or not, every reply) and the
//! same client errors, over random tiers, H, G, policies, operations,
//! shadow flags and time jumps. The Redis store is held to the in-memory
//! one by `meters_batch.rs`.
//!
//! As on its own (`Store::tiers`), a pair whose state may be forgotten
//! (`RateState::forget_at`, with the tiers that last decided it) starts
//! from nothing. `CHARON_DIFF_SEEDS` and `CHARON_DIFF_SEED` work as in
//! `meters_differential.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::meter::testing as shapes;
use charon_core::meter::{Op, Policy};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateState, decide_op};
use charon_core::testing::{self as rate_shapes, Draw};
use charon_core::{Clock, ManualClock, Millis};
use charon_store::{Batch, Limit, MemoryStore, MeterOp, OpReply, Store, StoreError};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["api/a", "api/b"];
const DOMAINS: &[&str] = &["alice", "bob"];

struct Seeded<'a>(&'a mut StdRng);

impl Draw for Seeded<'_> {
    fn draw(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        self.0.random_range(range)
    }
}

struct Tiers {
    tiers: Vec<Tier>,
    hard: Option<u64>,
    global: Option<u64>,
    policy: Policy,
    enforcement: Enforcement,
}

impl Tiers {
    fn random(rng: &mut StdRng, unit: Millis) -> Self {
        let d = &mut Seeded(rng);
        let (tiers, hard, global) = rate_shapes::rate_limits(d, unit);
        let policy = shapes::policy(d, unit);
        let enforcement = if d.one_in(12) {
            Enforcement::Ignore
        } else {
            Enforcement::Enforce
        };
        Tiers {
            tiers,
            hard,
            global,
            policy,
            enforcement,
        }
    }

    fn limits(&self) -> RateLimits<'_> {
        RateLimits {
            hard_limit: self.hard,
            global_limit: self.global,
            tiers: &self.tiers,
        }
    }
}

/// Every pair's state with its forget time, every resource's last second.
#[derive(Clone, Default)]
struct Model {
    pairs: HashMap<(&'static str, &'static str), (RateState, Millis)>,
    globals: HashMap<&'static str, HitLog>,
}

/// The batch as the model decides it; the model moves on only if it
/// commits.
fn decide(
    model: &mut Model,
    ops: &[(usize, usize, Op, bool)],
    configs: &[Tiers],
    now: Millis,
) -> Result<Batch, String> {
    let mut next = model.clone();
    let mut committed = true;
    let mut replies = Vec::new();
    for &(r, d, op, shadow) in ops {
        let c = &configs[r];
        let (state, forget) = next
            .pairs
            .entry((RESOURCES[r], DOMAINS[d]))
            .or_insert_with(|| (RateState::default(), Millis::MAX));
        if now >= *forget {
            *state = RateState::default();
        }
        let global = next.globals.entry(RESOURCES[r]).or_default();
        let reply = decide_op(c.limits(), c.policy, state, global, now, op, c.enforcement)
            .map_err(|e| format!("client error: {e}"))?;
        *forget = state
            .forget_at(&c.tiers, DORMANT_GRACE)
            .unwrap_or(Millis::MAX);
        committed &= shadow || !(matches!(op, Op::Request { .. }) && reply.granted == 0);
        replies.push(OpReply::Tiers(reply));
    }
    if committed {
        *model = next;
    }
    Ok(Batch { committed, replies })
}

fn outcome(r: &Result<Batch, StoreError>) -> Result<Batch, String> {
    match r {
        Ok(b) => Ok(b.clone()),
        Err(StoreError::Refused(e)) => Err(format!("client error: {e}")),
        Err(e) => panic!("the store failed: {e}"),
    }
}

async fn run(seed: u64, batches: usize) -> Result<(usize, usize), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let unit = [1, 7, 50][rng.random_range(0..3usize)];
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(clock.clone());
    let mut configs: Vec<Tiers> = RESOURCES
        .iter()
        .map(|_| Tiers::random(&mut rng, unit))
        .collect();
    let mut model = Model::default();
    let (mut committed, mut rolled_back) = (0, 0);
    for b in 0..batches {
        if rng.random_range(0..50) == 0 {
            let r = rng.random_range(0..RESOURCES.len());
            configs[r] = Tiers::random(&mut rng, unit);
        }
        let n = rng.random_range(1..=5);
        let mut gap = 0;
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            let (g, mut op) = shapes::step(&mut Seeded(&mut rng), unit, 6);
            gap = gap.max(g);
            // A refund is a client error on tiers: rare.
            if let Op::Refund(c) = op
                && rng.random_range(0..20) > 0
            {
                op = Op::Charge(c);
            }
            ops.push((
                rng.random_range(0..RESOURCES.len()),
                rng.random_range(0..DOMAINS.len()),
                op,
                rng.random_range(0..6) == 0,
            ));
        }
        clock.advance(gap);
        let now = clock.now();
        let batch: Vec<MeterOp<'_>> = ops
            .iter()
            .map(|&(r, d, op, shadow)| MeterOp {
                resource: RESOURCES[r],
                domain: DOMAINS[d],
                limit: Limit::Tiers {
                    limits: configs[r].limits(),
                    policy: configs[r].policy,
                    enforcement: configs[r].enforcement,
                },
                op,
                shadow,
                slot: None,
            })
            .collect();
        let got = outcome(&store.meters(&batch).await);
        let want = decide(&mut model, &ops, &configs, now);
        if got != want {
            return Err(format!(
                "seed {seed}, batch {b} at {now}: {ops:?}\n  store: {got:?}\n  model: {want:?}\n\
                 replay with CHARON_DIFF_SEED={seed}"
            ));
        }
        match want {
            Ok(b) if b.committed => committed += 1,
            Ok(_) => rolled_back += 1,
            Err(_) => {}
        }
    }
    Ok((committed, rolled_back))
}

#[tokio::test]
async fn a_tiers_batch_is_decide_op_in_sequence_kept_only_if_none_is_rejected() {
    let (mut committed, mut rolled_back) = (0, 0);
    for seed in charon_testkit::stores::diff_seeds() {
        let (c, r) = run(seed, 400).await.unwrap_or_else(|e| panic!("{e}"));
        committed += c;
        rolled_back += r;
    }
    assert!(
        committed > 0 && rolled_back > 0,
        "{committed} committed, {rolled_back} rolled back"
    );
}
