//! Queues (SPEC §9, §10) against a deliberately naive model: a list of
//! every admitted unit with the time its service ends, each unit served in
//! turn for `period / rate` ms, and the backlog as the sum of what each
//! unit still has to wait, in exact fractions. Random queues, policies and
//! timelines (multi-unit requests, dry runs, charges, refunds refused,
//! bans) must give identical replies, also when idle state is dropped as
//! the stores drop it.

use crate::naive;

use charon_core::meter::testing;
use charon_core::queue::Params;
use charon_core::testing::Raw;
use naive::{Naive, Q, agree, ms, params, steps};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Units {
    rate: u64,
    period: u64,
    size: u64,
    /// When each admitted unit has left the queue, in order.
    done: Vec<Q>,
}

impl Units {
    /// The time one unit takes.
    fn interval(&self) -> Q {
        Q::new(self.period.into(), self.rate.into())
    }

    fn now(now: u64) -> Q {
        Q::int(now.into())
    }

    /// Units waiting: each counts for the share of its service still ahead.
    fn backlog(&self, now: u64) -> Q {
        let i = self.interval();
        self.done.iter().fold(Q::int(0), |sum, &d| {
            let share = d.sub(Self::now(now)).div(i).max(Q::int(0)).min(Q::int(1));
            sum.add(share)
        })
    }

    /// When the last unit has left (or `now`).
    fn empty_at(&self, now: u64) -> Q {
        self.done.iter().fold(Self::now(now), |f, &d| f.max(d))
    }

    fn admit(&mut self, now: u64, n: u64) {
        for _ in 0..n {
            let start = self.empty_at(now);
            self.done.push(start.add(self.interval()));
        }
    }
}

impl Naive for Units {
    fn limit(&self) -> u64 {
        self.size
    }
    fn room(&self, now: u64) -> u64 {
        ms(Q::int(self.size.into()).sub(self.backlog(now)).floor())
    }
    fn grant(&mut self, now: u64, n: u64) {
        self.admit(now, n);
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.admit(now, n);
    }
    fn reset_after(&self, now: u64) -> u64 {
        ms(self.empty_at(now).sub(Self::now(now)).ceil())
    }
    fn retry_after(&self, now: u64, from: u64, min: u64) -> Option<u64> {
        if min > self.size {
            return None;
        }
        // The backlog may be at most size − min: the queue must drain
        // (backlog − size + min) more units first.
        let excess = self
            .backlog(now)
            .sub(Q::int((self.size - min).into()))
            .max(Q::int(0));
        Some(ms(excess.mul(self.interval()).ceil()).max(from))
    }
    fn delay(&self, now: u64) -> Option<u64> {
        Some(self.reset_after(now))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn queues_match_the_naive_model(raw in params(), events in steps(10)) {
        let (rate, period, size, policy) = testing::queue(&mut Raw::new(&raw), 1);
        let params = Params::new(rate, period, size, policy).expect("valid");
        let model = Units { rate, period, size, done: Vec::new() };
        agree(&params, model, policy, &events)?;
    }
}
