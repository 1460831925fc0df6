//! Token buckets (SPEC §7, §10) against a deliberately naive model: a
//! token balance as an exact fraction, refilled at `count / period` per ms
//! up to `burst`, instead of the engine's TAT in ticks. Random buckets,
//! policies and timelines (multi-unit requests, dry runs, charges into
//! debt, refunds, bans) must give identical replies, also when idle state
//! is dropped as the stores drop it.

use crate::naive;

use charon_core::bucket::Params;
use charon_core::meter::testing;
use charon_core::testing::Raw;
use naive::{Naive, Q, agree, ms, params, steps};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Tokens {
    burst: u64,
    count: u64,
    period: u64,
    /// The balance at `at` (negative in debt).
    balance: Q,
    at: u64,
}

impl Tokens {
    fn new(burst: u64, count: u64, period: u64) -> Self {
        Self {
            burst,
            count,
            period,
            balance: Q::int(burst.into()),
            at: 0,
        }
    }

    /// Tokens per millisecond.
    fn rate(&self) -> Q {
        Q::new(self.count.into(), self.period.into())
    }

    fn tokens(&self, now: u64) -> Q {
        let refill = Q::int(i128::from(now - self.at)).mul(self.rate());
        self.balance.add(refill).min(Q::int(self.burst.into()))
    }

    fn set(&mut self, now: u64, balance: Q) {
        self.balance = balance;
        self.at = now;
    }
}

impl Naive for Tokens {
    fn limit(&self) -> u64 {
        self.burst
    }
    fn room(&self, now: u64) -> u64 {
        ms(self.tokens(now).floor())
    }
    fn grant(&mut self, now: u64, n: u64) {
        let b = self.tokens(now).sub(Q::int(n.into()));
        self.set(now, b);
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.grant(now, n);
    }
    fn refund(&mut self, now: u64, n: u64) -> bool {
        let b = self
            .tokens(now)
            .add(Q::int(n.into()))
            .min(Q::int(self.burst.into()));
        self.set(now, b);
        true
    }
    fn reset_after(&self, now: u64) -> u64 {
        let missing = Q::int(self.burst.into()).sub(self.tokens(now));
        ms(missing.div(self.rate()).ceil())
    }
    fn retry_after(&self, now: u64, from: u64, min: u64) -> Option<u64> {
        if min > self.burst {
            return None;
        }
        let missing = Q::int(min.into()).sub(self.tokens(now));
        Some(ms(missing.div(self.rate()).ceil()).max(from))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn buckets_match_the_naive_model(raw in params(), events in steps(10)) {
        let (burst, count, period, policy) = testing::bucket(&mut Raw::new(&raw), 1);
        let params = Params::new(burst, count, period, policy).expect("valid");
        agree(&params, Tokens::new(burst, count, period), policy, &events)?;
    }
}
