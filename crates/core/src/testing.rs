//! Random rate configurations for tests (feature `test-support`): the
//! generator the naive-model property test (`tests/core/naive_model.rs`) and the
//! differential test of the stores (`crates/limiter/tests/limiter/differential.rs`)
//! share, so that the Lua port sees the same shapes of tier lists, H and G
//! the engine is checked on.
//!
//! It draws from any source of numbers through [`Draw`]: proptest values
//! in the property test (which then shrink towards the smallest shapes), a
//! seeded `StdRng` in the differential test. Core itself depends on
//! neither.

use std::ops::RangeInclusive;

use crate::Millis;
use crate::config::Tier;

/// A source of random numbers.
pub trait Draw {
    /// A number in `range` (not empty).
    fn draw(&mut self, range: RangeInclusive<u64>) -> u64;

    /// True one time in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.draw(0..=n.saturating_sub(1)) == 0
    }

    /// `Some` of a number in `range` half of the time.
    fn maybe(&mut self, range: RangeInclusive<u64>) -> Option<u64> {
        if self.one_in(2) {
            None
        } else {
            Some(self.draw(range))
        }
    }
}

/// A [`Draw`] over a list of raw numbers, each reduced into the range asked
/// for (zero once they run out): what a property-test strategy of
/// `Vec<u64>` turns into, shrinking to the smallest shapes.
#[derive(Debug, Clone)]
pub struct Raw<'a> {
    values: std::slice::Iter<'a, u64>,
}

impl<'a> Raw<'a> {
    pub fn new(values: &'a [u64]) -> Self {
        Self {
            values: values.iter(),
        }
    }
}

impl Draw for Raw<'_> {
    fn draw(&mut self, range: RangeInclusive<u64>) -> u64 {
        let (lo, hi) = range.into_inner();
        let v = self.values.next().copied().unwrap_or(0);
        match (hi - lo).checked_add(1) {
            Some(n) => lo + v % n,
            None => v,
        }
    }
}

/// Enough raw numbers for one [`rate_limits`] (a count, six per tier, two each for H and G).
pub const RATE_LIMITS_DRAWS: usize = 1 + MAX_TIERS as usize * 6 + 4;

/// The most tiers [`tiers`] makes.
pub const MAX_TIERS: u64 = 4;

/// One random tier: limit 0–4, a window of 1–40 `unit`s, an active
/// period of 1–120 `unit`s or infinite, a cooldown of 0–80 `unit`s, and
/// skippable or not. Small limits and spans make every phase and every
/// burst reachable within a few requests.
pub fn tier(d: &mut impl Draw, unit: Millis) -> Tier {
    Tier {
        limit: d.draw(0..=4),
        window: d.draw(1..=40) * unit,
        active: d.maybe(1..=120).map(|a| a * unit),
        cooldown: d.draw(0..=80) * unit,
        skippable: d.one_in(2),
    }
}

/// 0 to [`MAX_TIERS`] random tiers (see [`tier`]).
pub fn tiers(d: &mut impl Draw, unit: Millis) -> Vec<Tier> {
    let n = d.draw(0..=MAX_TIERS);
    (0..n).map(|_| tier(d, unit)).collect()
}

/// A random tier list with H (0–12 or none) and G (0–20 or none).
pub fn rate_limits(d: &mut impl Draw, unit: Millis) -> (Vec<Tier>, Option<u64>, Option<u64>) {
    let tiers = tiers(d, unit);
    let hard = d.maybe(0..=12);
    let global = d.maybe(0..=20);
    (tiers, hard, global)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_draws_stay_in_range_and_zeros_give_the_smallest_shape() {
        let mut d = Raw::new(&[u64::MAX, 7, 3]);
        assert_eq!(d.draw(0..=4), u64::MAX % 5);
        assert_eq!(d.draw(10..=11), 11);
        assert_eq!(d.draw(0..=u64::MAX), 3);
        assert_eq!(d.draw(5..=9), 5, "zero once they run out");
        let zeros = [0; RATE_LIMITS_DRAWS];
        let (tiers, hard, global) = rate_limits(&mut Raw::new(&zeros), 1);
        assert!(tiers.is_empty());
        // one_in(2) of 0 is true: maybe() gives None.
        assert_eq!((hard, global), (None, None));
    }

    #[test]
    fn tiers_are_valid() {
        let values: Vec<u64> = (0..1_000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let mut d = Raw::new(&values);
        for _ in 0..20 {
            for t in tiers(&mut d, 50) {
                assert!(t.window >= 50 && t.window % 50 == 0);
                assert!(t.limit <= 4);
            }
        }
    }
}
