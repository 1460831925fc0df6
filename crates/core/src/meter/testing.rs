//! Random buckets, windows, queues, policies and operations (feature
//! `test-support`): the shapes the naive-model property tests
//! (`tests/{bucket,window,queue}_model.rs`) check the engine on, for the
//! stores' differential test to run through both stores too. Drawn from
//! any [`Draw`], so proptest shrinks them towards the smallest shapes.
//!
//! Small limits and spans make every rule reachable within a few
//! operations: a full bucket, a turned window, a full queue, debt, a ban
//! and its end. Spans are multiples of `unit` ms.

use crate::Millis;
use crate::meter::{Ban, Op, Policy, SoftLimit};
use crate::request::Amount;
use crate::testing::Draw;
use crate::window::Algorithm;

/// Raw numbers enough for one [`policy`] and one kind.
pub const PARAMS_DRAWS: usize = 10;

/// Raw numbers enough for one [`step`].
pub const STEP_DRAWS: usize = 6;

/// No soft limit or 1–100 %, no ban (two times in three) or 1–2000 units.
pub fn policy(d: &mut impl Draw, unit: Millis) -> Policy {
    let soft_limit = d
        .maybe(1..=100)
        .map(|p| SoftLimit::percent(p).expect("1 to 100"));
    let ban = if d.one_in(3) {
        Some(Ban::new(d.draw(1..=2_000) * unit).expect("positive"))
    } else {
        None
    };
    Policy { soft_limit, ban }
}

/// A period of 1 unit, a second's worth, 333 units (a third of a second:
/// an interval that is not a whole number of ms) or 1–1000 units.
fn period(d: &mut impl Draw, unit: Millis) -> Millis {
    unit * match d.draw(0..=3) {
        0 => 1,
        1 => 1_000,
        2 => 333,
        _ => d.draw(1..=1_000),
    }
}

/// `(burst 1–8, count 1–7, period, policy)`.
pub fn bucket(d: &mut impl Draw, unit: Millis) -> (u64, u64, Millis, Policy) {
    let burst = d.draw(1..=8);
    let count = d.draw(1..=7);
    let period = period(d, unit);
    (burst, count, period, policy(d, unit))
}

/// `(algorithm, limit 1–8, window of 1, 100 or 1–250 units, policy)`.
pub fn window(d: &mut impl Draw, unit: Millis) -> (Algorithm, u64, Millis, Policy) {
    let algorithm = match d.draw(0..=2) {
        0 => Algorithm::SlidingCounter,
        1 => Algorithm::FirstHit,
        _ => Algorithm::Fixed,
    };
    let limit = d.draw(1..=8);
    let window = unit
        * match d.draw(0..=2) {
            0 => 1,
            1 => 100,
            _ => d.draw(1..=250),
        };
    (algorithm, limit, window, policy(d, unit))
}

/// `(rate 1–7, period, size 1–8, policy)`.
pub fn queue(d: &mut impl Draw, unit: Millis) -> (u64, Millis, u64, Policy) {
    let rate = d.draw(1..=7);
    let period = period(d, unit);
    let size = d.draw(1..=8);
    (rate, period, size, policy(d, unit))
}

/// One operation and the gap before it: mostly 0–40 units (limits bind),
/// one time in seven 0–3000 (state is forgotten, bans end); eight times
/// in ten a request of 1–`max_copies` (a dry run one time in five), else a
/// charge or a refund of 1–10.
pub fn step(d: &mut impl Draw, unit: Millis, max_copies: u64) -> (Millis, Op) {
    let gap = if d.one_in(7) {
        d.draw(0..=3_000)
    } else {
        d.draw(0..=40)
    } * unit;
    let op = match d.draw(0..=9) {
        0 => Op::Charge(d.draw(1..=10)),
        1 => Op::Refund(d.draw(1..=10)),
        _ => {
            let copies = d.draw(1..=max_copies.max(1));
            let min = d.draw(1..=copies);
            let amount = Amount::new(copies, min).expect("1 ≤ min ≤ copies");
            if d.one_in(5) {
                Op::dry_run(amount)
            } else {
                Op::request(amount)
            }
        }
    };
    (gap, op)
}
