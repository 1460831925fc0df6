//! Windows (SPEC §8, §10) against a deliberately naive model: a list of
//! every hit (granted or charged) with its time, counted per aligned window
//! (or, for `first_hit`, per window replayed from the first hit) on demand,
//! the sliding estimate in exact fractions, and the retry and reset times
//! found by trying every millisecond. Random windows of the three algorithms,
//! policies and timelines (multi-unit requests, dry runs, charges past the
//! limit, refunds refused, bans) must give identical replies, also when
//! idle state is dropped as the stores drop it.

use crate::naive;

use std::collections::HashMap;

use charon_core::meter::testing;
use charon_core::testing::Raw;
use charon_core::window::{Algorithm, Params};
use naive::{Naive, Q, agree, ms, params, steps};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Hits {
    algorithm: Algorithm,
    limit: u64,
    window: u64,
    /// (time, hits), in time order.
    log: Vec<(u64, u64)>,
}

impl Hits {
    fn count(&self, k: u64) -> u64 {
        self.log
            .iter()
            .filter(|(t, _)| t / self.window == k)
            .map(|(_, n)| n)
            .sum()
    }

    /// `first_hit`: the window open at `now`, as `[start, start + W)`, by
    /// replaying the log: a hit after the open window ended opens the next.
    fn open_window(&self, now: u64) -> Option<u64> {
        let mut start: Option<u64> = None;
        for &(t, _) in self.log.iter().filter(|(t, _)| *t <= now) {
            if start.is_none_or(|s| t >= s + self.window) {
                start = Some(t);
            }
        }
        start.filter(|s| now < s + self.window)
    }

    fn estimate(&self, now: u64, counts: &mut HashMap<u64, u64>) -> u64 {
        if self.algorithm == Algorithm::FirstHit {
            let Some(s) = self.open_window(now) else {
                return 0;
            };
            return self
                .log
                .iter()
                .filter(|(t, _)| s <= *t && *t <= now)
                .map(|(_, n)| n)
                .sum();
        }
        let k = now / self.window;
        let mut count = |k: u64| *counts.entry(k).or_insert_with(|| self.count(k));
        let curr = count(k);
        if self.algorithm == Algorithm::Fixed || k == 0 {
            return curr;
        }
        let e = now - k * self.window;
        let weight = Q::new((self.window - e).into(), self.window.into());
        curr + ms(Q::int(count(k - 1).into()).mul(weight).floor())
    }
}

impl Naive for Hits {
    fn limit(&self) -> u64 {
        self.limit
    }
    fn room(&self, now: u64) -> u64 {
        self.limit
            .saturating_sub(self.estimate(now, &mut HashMap::new()))
    }
    fn grant(&mut self, now: u64, n: u64) {
        self.log.push((now, n));
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.log.push((now, n));
    }
    /// The first instant from which the estimate stays 0, if nothing else
    /// arrives: one past the last instant of the next three windows with
    /// an estimate above 0 (nothing of today counts after them).
    fn reset_after(&self, now: u64) -> u64 {
        let mut counts = HashMap::new();
        (0..=3 * self.window)
            .rev()
            .find(|&t| self.estimate(now + t, &mut counts) > 0)
            .map_or(0, |t| t + 1)
    }
    fn retry_after(&self, now: u64, from: u64, min: u64) -> Option<u64> {
        if min > self.limit {
            return None;
        }
        let mut counts = HashMap::new();
        // Two windows after `from` nothing of today is counted any more.
        (from..=from + 3 * self.window).find(|&t| {
            self.limit
                .saturating_sub(self.estimate(now + t, &mut counts))
                >= min
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn windows_match_the_naive_model(raw in params(), events in steps(10)) {
        let (algorithm, limit, window, policy) = testing::window(&mut Raw::new(&raw), 1);
        let params = Params::new(algorithm, limit, window, policy).expect("valid");
        let model = Hits { algorithm, limit, window, log: Vec::new() };
        agree(&params, model, policy, &events)?;
    }
}
