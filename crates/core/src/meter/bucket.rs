//! Token buckets, GCRA (SPEC §7, seeds 002 and 004): `burst` tokens at
//! most, `count` tokens back every `period`, a request's `copies` as its
//! cost. The state is one theoretical arrival time (TAT), kept exactly
//! (see [`crate::drain`]): `count: 3, period: 1s` returns a token every
//! 333⅓ ms forever, not every 333 or 334.

use crate::Millis;
use crate::drain::{Drained, Flow, Mark};
use crate::meter::{self, FieldError, Policy};

/// The state of one bucket: its TAT. No state is a full bucket.
pub type Tat = Mark;

/// A bucket's state with its ban.
pub type State = meter::State<Tat>;

/// What makes a drain a bucket: a refund gives tokens back, and a grant
/// never waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra;

impl Flow for Gcra {
    const REFUNDS: bool = true;
    const DELAYS: bool = false;
}

/// A validated bucket configuration (a resource's, or an override's).
pub type Params = Drained<Gcra>;

impl Params {
    /// `burst` and `count` from 1 to 2^53 − 1, `period` from 1 ms to
    /// [`meter::MAX_SPAN`], and `burst × period / gcd(period, count) ≤
    /// 2^53 − 1` so that the TAT stays exact in Redis' Lua (the error
    /// names `burst` and says the largest that fits).
    pub fn new(burst: u64, count: u64, period: Millis, policy: Policy) -> Result<Self, FieldError> {
        Self::checked("burst", burst, "count", count, period, policy)
    }

    /// The bucket's capacity.
    pub fn burst(&self) -> u64 {
        self.capacity()
    }
}

#[cfg(test)]
mod tests;
