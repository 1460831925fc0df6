//! One kind's params and state for the unit tests of each kind, driven
//! through [`decide`] the way a store drives them, so that the bucket,
//! window and queue tests share the driver and keep only their
//! constructors (an `impl Harness<Params>` beside their tests).

use super::{Level, Op, Reply, State, decide};
use crate::Millis;
use crate::request::Amount;

/// A kind's params with the state the tests' operations change.
pub(crate) struct Harness<P: Level> {
    pub(crate) params: P,
    pub(crate) state: State<P::State>,
}

impl<P: Level> Harness<P> {
    /// `params` with nothing stored.
    pub(crate) fn of(params: P) -> Self {
        Self {
            params,
            state: State::default(),
        }
    }

    /// Applies `op` at `now`; the tests only give valid operations.
    pub(crate) fn op(&mut self, now: Millis, op: Op) -> Reply {
        decide(&self.params, &mut self.state, now, op).expect("valid op")
    }

    /// A request for `copies`, at least `min`, at `now`.
    pub(crate) fn ask(&mut self, now: Millis, copies: u64, min: u64) -> Reply {
        self.op(now, Op::request(Amount::new(copies, min).expect("amount")))
    }

    /// A request for exactly one at `now`.
    pub(crate) fn one(&mut self, now: Millis) -> Reply {
        self.ask(now, 1, 1)
    }
}
