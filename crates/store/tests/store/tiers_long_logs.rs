//! Burst tiers whose logs grow long and short again, through the in-memory
//! store against a naive model (`charon_core::rate::decide_op` on a plain
//! `RateState` per pair, forgotten from its forget time, as
//! `tiers_batch_model.rs` models it). The store keeps a pair's state
//! encoded in a few bytes while its logs are short and as it is once they
//! hold many entries (spilled), and encodes it again when they shrink:
//! every reply must be the model's across those moves, with operations
//! alone and in batches, client errors, sweeps, pairs going idle and
//! windows emptying while a state is spilled, an hour passing (a dormant
//! tier 1 forgotten).

use std::collections::HashMap;
use std::sync::Arc;

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::meter::testing as shapes;
use charon_core::meter::{Op, Policy};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateState, decide_op};
use charon_core::request::Amount;
use charon_core::testing::Draw;
use charon_core::{Clock, ManualClock, Millis};
use charon_store::{Batch, Limit, MemoryStore, MeterOp, OpReply, Store, StoreError};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["api/a", "api/b"];
const DOMAINS: &[&str] = &["alice", "bob", "carol"];

struct Seeded<'a>(&'a mut StdRng);

impl Draw for Seeded<'_> {
    fn draw(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        self.0.random_range(range)
    }
}

/// One resource's limits: tiers roomy enough that a domain hitting every
/// millisecond or two keeps tens to hundreds of entries in its logs.
struct Config {
    tiers: Vec<Tier>,
    hard: Option<u64>,
    policy: Policy,
}

impl Config {
    fn random(rng: &mut StdRng) -> Self {
        let n = rng.random_range(1..=3);
        let tiers = (0..n)
            .map(|i| Tier {
                limit: rng.random_range(20..=150),
                window: rng.random_range(50..=400),
                active: (i > 0 || rng.random_range(0..4) == 0)
                    .then(|| rng.random_range(100..=2_000)),
                cooldown: rng.random_range(0..=1_000),
                skippable: rng.random_range(0..3) == 0,
            })
            .collect();
        let hard = (rng.random_range(0..3) == 0).then(|| rng.random_range(30..=300));
        let policy = shapes::policy(&mut Seeded(rng), 50);
        Config {
            tiers,
            hard,
            policy,
        }
    }

    fn limits(&self) -> RateLimits<'_> {
        RateLimits {
            hard_limit: self.hard,
            global_limit: None,
            tiers: &self.tiers,
        }
    }
}

/// Every pair's state with its forget time, every resource's last second.
#[derive(Clone, Default)]
struct Model {
    pairs: HashMap<(usize, usize), (RateState, Millis)>,
    globals: HashMap<usize, HitLog>,
}

/// Operations `(resource, domain, op)` decided in turn on the model; kept
/// only if every request was granted (a batch; an operation alone is a
/// batch of one that keeps what it did either way).
fn decide(
    model: &mut Model,
    ops: &[(usize, usize, Op)],
    configs: &[Config],
    now: Millis,
    all_or_nothing: bool,
) -> Result<Vec<OpReply>, String> {
    let mut next = model.clone();
    let mut committed = true;
    let mut replies = Vec::new();
    for &(r, d, op) in ops {
        let c = &configs[r];
        let (state, forget) = next
            .pairs
            .entry((r, d))
            .or_insert_with(|| (RateState::default(), Millis::MAX));
        if now >= *forget {
            *state = RateState::default();
        }
        let global = next.globals.entry(r).or_default();
        let reply = decide_op(
            c.limits(),
            c.policy,
            state,
            global,
            now,
            op,
            Enforcement::Enforce,
        )
        .map_err(|e| format!("client error: {e}"))?;
        *forget = state
            .forget_at(&c.tiers, DORMANT_GRACE)
            .unwrap_or(Millis::MAX);
        committed &= !(matches!(op, Op::Request { .. }) && reply.granted == 0);
        replies.push(OpReply::Tiers(reply));
    }
    if committed || !all_or_nothing {
        *model = next;
    }
    Ok(replies)
}

fn entries(state: &RateState) -> usize {
    state
        .tiers
        .iter()
        .map(|t| t.hits.entries().len())
        .sum::<usize>()
        + state.last_second.entries().len()
}

fn op(rng: &mut StdRng) -> Op {
    let amount = |rng: &mut StdRng| {
        let n = rng.random_range(1..=3);
        Amount::new(n, rng.random_range(1..=n)).unwrap()
    };
    match rng.random_range(0..40) {
        0 => Op::Refund(1),
        1..=3 => Op::Charge(rng.random_range(1..=2)),
        4..=6 => Op::dry_run(amount(rng)),
        _ => Op::request(amount(rng)),
    }
}

/// Runs `steps` steps of seed `seed`; returns the most entries a pair's
/// logs held and how often a pair went from more than 16 entries (spilled) to
/// 8 or fewer (packed again).
async fn run(seed: u64, steps: usize) -> Result<(usize, usize), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(clock.clone());
    let configs: Vec<Config> = RESOURCES.iter().map(|_| Config::random(&mut rng)).collect();
    let mut model = Model::default();
    let mut was_long: HashMap<(usize, usize), bool> = HashMap::new();
    let (mut most, mut shrunk) = (0, 0);
    for step in 0..steps {
        clock.advance(match rng.random_range(0..400) {
            // Long enough for a dormant tier 1 to be forgotten.
            0 => DORMANT_GRACE + rng.random_range(0..=5_000),
            1 => rng.random_range(1_000..=5_000),
            2..=9 => rng.random_range(100..=600),
            10..=120 => 0,
            _ => rng.random_range(1..=3),
        });
        let now = clock.now();
        if rng.random_range(0..100) == 0 {
            // Sweeping never changes a decision.
            store.sweep();
        }
        let n = if rng.random_range(0..5) == 0 {
            rng.random_range(2..=4)
        } else {
            1
        };
        let ops: Vec<(usize, usize, Op)> = (0..n)
            .map(|_| {
                (
                    rng.random_range(0..RESOURCES.len()),
                    rng.random_range(0..DOMAINS.len()),
                    op(&mut rng),
                )
            })
            .collect();
        let want = decide(&mut model, &ops, &configs, now, n > 1);
        let got = if n == 1 {
            let (r, d, o) = ops[0];
            let c = &configs[r];
            store
                .tiers(
                    RESOURCES[r],
                    DOMAINS[d],
                    c.limits(),
                    c.policy,
                    o,
                    Enforcement::Enforce,
                )
                .await
                .map(|reply| vec![OpReply::Tiers(reply)])
        } else {
            let batch: Vec<MeterOp<'_>> = ops
                .iter()
                .map(|&(r, d, op)| MeterOp {
                    resource: RESOURCES[r],
                    domain: DOMAINS[d],
                    limit: Limit::Tiers {
                        limits: configs[r].limits(),
                        policy: configs[r].policy,
                        enforcement: Enforcement::Enforce,
                    },
                    op,
                    shadow: false,
                    slot: None,
                })
                .collect();
            store
                .meters(&batch)
                .await
                .map(|Batch { replies, .. }| replies)
        };
        let got = match got {
            Ok(replies) => Ok(replies),
            Err(StoreError::Refused(e)) => Err(format!("client error: {e}")),
            Err(e) => panic!("the store failed: {e}"),
        };
        if got != want {
            return Err(format!(
                "seed {seed}, step {step} at {now}: {ops:?}\n  store: {got:?}\n  model: {want:?}"
            ));
        }
        for (&pair, (state, _)) in &model.pairs {
            let e = entries(state);
            most = most.max(e);
            let long = was_long.entry(pair).or_default();
            if *long && e <= 8 {
                shrunk += 1;
            }
            *long = e > 16 || (*long && e > 8);
        }
    }
    Ok((most, shrunk))
}

#[tokio::test]
async fn long_logs_spilled_and_packed_again_decide_as_the_model() {
    let (mut most, mut shrunk) = (0, 0);
    for seed in 0..12 {
        let (m, s) = run(seed, 3_000).await.unwrap_or_else(|e| panic!("{e}"));
        most = most.max(m);
        shrunk += s;
    }
    println!("logs held up to {most} entries; {shrunk} times a long state came down to 8 or fewer");
    assert!(
        most > 100 && shrunk > 10,
        "{most} entries at most, {shrunk} shrunk"
    );
}
