//! What the naive-model property tests of buckets, windows and queues
//! share: a tiny exact fraction type, random operation sequences, the
//! naive reading of SPEC §10 (bans, soft limits, dry runs, charge, refund)
//! and a runner for the engine. Each test file brings its own naive model
//! of the kind itself.

#![allow(dead_code)]

use std::cmp::Ordering;

use charon_core::meter::{self, Level, Op, Policy, Reply, testing};
use charon_core::testing::Raw;
use proptest::prelude::*;

/// An exact fraction `n / d`, `d > 0`. No cleverness: i128 everywhere.
#[derive(Debug, Clone, Copy)]
pub struct Q {
    n: i128,
    d: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

impl Q {
    pub fn new(n: i128, d: i128) -> Q {
        assert!(d != 0);
        let (n, d) = if d < 0 { (-n, -d) } else { (n, d) };
        let g = gcd(n, d).max(1);
        Q { n: n / g, d: d / g }
    }
    pub fn int(n: i128) -> Q {
        Q::new(n, 1)
    }
    pub fn add(self, o: Q) -> Q {
        Q::new(self.n * o.d + o.n * self.d, self.d * o.d)
    }
    pub fn sub(self, o: Q) -> Q {
        Q::new(self.n * o.d - o.n * self.d, self.d * o.d)
    }
    pub fn mul(self, o: Q) -> Q {
        Q::new(self.n * o.n, self.d * o.d)
    }
    pub fn div(self, o: Q) -> Q {
        Q::new(self.n * o.d, self.d * o.n)
    }
    pub fn floor(self) -> i128 {
        self.n.div_euclid(self.d)
    }
    pub fn ceil(self) -> i128 {
        -(-self.n).div_euclid(self.d)
    }
    pub fn min(self, o: Q) -> Q {
        if self <= o { self } else { o }
    }
    pub fn max(self, o: Q) -> Q {
        if self >= o { self } else { o }
    }
}

impl PartialEq for Q {
    fn eq(&self, o: &Q) -> bool {
        self.n * o.d == o.n * self.d
    }
}

impl PartialOrd for Q {
    fn partial_cmp(&self, o: &Q) -> Option<Ordering> {
        Some((self.n * o.d).cmp(&(o.n * self.d)))
    }
}

/// Whole milliseconds from a non-negative fraction.
pub fn ms(x: i128) -> u64 {
    u64::try_from(x.max(0)).expect("fits")
}

/// One operation of a timeline and the gap before it.
pub type Step = (u64, Op);

/// Random timelines from the shared generator (`meter::testing::step`, in
/// 1 ms units), shrinking towards short gaps and small requests.
pub fn steps(max_copies: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop::collection::vec(any::<u64>(), testing::STEP_DRAWS),
        1..100,
    )
    .prop_map(move |raws| {
        raws.iter()
            .map(|raw| testing::step(&mut Raw::new(raw), 1, max_copies))
            .collect()
    })
}

/// Raw numbers for one kind's parameters and policy.
pub fn params() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), testing::PARAMS_DRAWS)
}

/// A kind as the spec describes it, naively: how much room at a time,
/// what operations record, and the numbers the reply shows.
pub trait Naive: Clone {
    fn limit(&self) -> u64;
    fn room(&self, now: u64) -> u64;
    fn grant(&mut self, now: u64, n: u64);
    fn charge(&mut self, now: u64, n: u64);
    /// `false` if the kind has no refunds (windows and queues: hits
    /// already counted cannot be un-requested).
    fn refund(&mut self, now: u64, n: u64) -> bool {
        let _ = (now, n);
        false
    }
    /// Every kind shows its room as `remaining`.
    fn remaining(&self, now: u64) -> u64 {
        self.room(now)
    }
    fn reset_after(&self, now: u64) -> u64;
    /// The first `t ≥ from` at which `min` units would fit, counted from
    /// `now`, or `None`.
    fn retry_after(&self, now: u64, from: u64, min: u64) -> Option<u64>;
    /// Queues: the delay a grant at `now` would be told.
    fn delay(&self, now: u64) -> Option<u64> {
        let _ = now;
        None
    }
}

/// The engine's replies to `steps` equal the naive model's, with idle
/// state kept and dropped: the assertion every kind's property test makes.
pub fn agree<L: Level, N: Naive>(
    params: &L,
    model: N,
    policy: Policy,
    events: &[Step],
) -> Result<(), TestCaseError> {
    let naive = naive_replies(model, policy, events);
    for forget in [false, true] {
        let engine = engine_replies(params, events, forget);
        for (i, (a, b)) in engine.iter().zip(&naive).enumerate() {
            prop_assert_eq!(
                a,
                b,
                "event {} (forget: {}) of {:?}",
                i,
                forget,
                &events[..=i]
            );
        }
    }
    Ok(())
}

/// SPEC §10 read literally, around a naive kind.
pub fn naive_replies<N: Naive>(mut kind: N, policy: Policy, steps: &[Step]) -> Vec<Option<Reply>> {
    let mut now = 0;
    let mut banned_until: Option<u64> = None;
    steps
        .iter()
        .map(|&(gap, op)| {
            now += gap;
            let banned = banned_until.is_some_and(|u| now < u);
            let before = kind.clone();
            let (granted, after, min, ban, delay) = match op {
                Op::Request { amount, dry_run } => {
                    let (copies, min, dry) = (amount.copies(), amount.min_copies(), dry_run);
                    let room = if banned { 0 } else { kind.room(now) };
                    let n = copies.min(room);
                    if n >= min {
                        let mut after = kind.clone();
                        after.grant(now, n);
                        if !dry {
                            kind = after.clone();
                        }
                        (
                            n,
                            after,
                            min,
                            banned_until.filter(|_| banned),
                            before.delay(now),
                        )
                    } else {
                        let ban = if banned {
                            banned_until
                        } else {
                            policy.ban.map(|b| now + b.duration())
                        };
                        if !dry && !banned && ban.is_some() {
                            banned_until = ban;
                        }
                        (0, kind.clone(), min, ban, before.delay(now).map(|_| 0))
                    }
                }
                Op::Charge(n) => {
                    kind.charge(now, n);
                    (
                        n,
                        kind.clone(),
                        1,
                        banned_until.filter(|_| banned),
                        before.delay(now),
                    )
                }
                Op::Refund(n) => {
                    if !kind.refund(now, n) {
                        return None;
                    }
                    (n, kind.clone(), 1, banned_until.filter(|_| banned), None)
                }
            };
            let limit = after.limit();
            let remaining = after.remaining(now);
            let from = ban.map_or(0, |u| u - now);
            Some(Reply {
                granted,
                limit,
                remaining,
                reset_after_ms: after.reset_after(now),
                retry_after_ms: after.retry_after(now, from, min),
                warning: policy.soft_limit.is_some_and(|s| {
                    u128::from(limit - remaining.min(limit)) * 100
                        >= u128::from(s.as_percent()) * u128::from(limit)
                }),
                banned: ban.is_some(),
                delay_ms: delay,
            })
        })
        .collect()
}

/// The engine on the same timeline; with `forget`, the state is dropped
/// whenever it is idle, as the stores do. A client error is `None` and must
/// leave the state as it was.
pub fn engine_replies<L: Level>(kind: &L, steps: &[Step], forget: bool) -> Vec<Option<Reply>> {
    let mut state = meter::State::default();
    let mut now = 0;
    steps
        .iter()
        .map(|&(gap, op)| {
            now += gap;
            if forget && state.is_idle(kind, now) {
                state = meter::State::default();
            }
            let before = state;
            match meter::decide(kind, &mut state, now, op) {
                Ok(reply) => Some(reply),
                Err(_) => {
                    assert_eq!(state, before, "a client error changed the state");
                    None
                }
            }
        })
        .collect()
}
