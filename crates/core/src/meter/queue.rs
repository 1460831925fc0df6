//! Queues, the leaky bucket that delays instead of rejecting (SPEC §9,
//! seed 001): units leave at `rate` per `period`, at most `size` wait, and
//! an admitted request is told how long to wait (`delay_ms`). Only a full
//! queue rejects. The state is one time, F, when the queue is empty, kept
//! exactly like a bucket's TAT (see [`crate::drain`]).

use crate::Millis;
use crate::drain::{Drained, Flow, Mark};
use crate::meter::{self, FieldError, Policy};

/// The state of one queue: F, when it is empty. No state is an empty queue.
pub type Empty = Mark;

/// A queue's state with its ban.
pub type State = meter::State<Empty>;

/// What makes a drain a queue: a grant is told to wait for the units
/// ahead of it, and a refund is a client error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaky;

impl Flow for Leaky {
    const REFUNDS: bool = false;
    const DELAYS: bool = true;
}

/// A validated queue configuration.
pub type Params = Drained<Leaky>;

impl Params {
    /// `rate` and `size` from 1 to 2^53 − 1, `period` from 1 ms to
    /// [`meter::MAX_SPAN`], and `size × period / gcd(period, rate) ≤
    /// 2^53 − 1` (the error names `size`).
    pub fn new(rate: u64, period: Millis, size: u64, policy: Policy) -> Result<Self, FieldError> {
        Self::checked("size", size, "rate", rate, period, policy)
    }

    /// The most units that may wait.
    pub fn size(&self) -> u64 {
        self.capacity()
    }
}

#[cfg(test)]
mod tests;
