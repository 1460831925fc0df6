//! One rate-like kind as a value: what a store is handed for a (resource,
//! domain) pair, so that one store operation serves buckets, windows and
//! queues alike and the decision stays [`meter::decide`](super::decide).

use crate::meter::{Level, Op, Reply, State};
use crate::{ClientError, Millis, bucket, queue, window};

/// The validated parameters of one rate-like kind (SPEC §7–9) as they apply
/// to one domain (overrides already resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meter {
    /// `kind: bucket`.
    Bucket(bucket::Params),
    /// `kind: window`.
    Window(window::Params),
    /// `kind: queue`.
    Queue(queue::Params),
}

/// The state of one (resource, domain) pair of any rate-like kind, as a
/// store keeps it. A state of one kind read with a [`Meter`] of another (the
/// configuration changed the kind) counts as no state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MeterState {
    /// A bucket's TAT and ban.
    Bucket(bucket::State),
    /// A window's counts and ban.
    Window(window::State),
    /// A queue's F and ban.
    Queue(queue::State),
}

impl Meter {
    /// The empty state of this kind (`State::default()`).
    pub fn empty(&self) -> MeterState {
        match self {
            Meter::Bucket(_) => MeterState::Bucket(State::default()),
            Meter::Window(_) => MeterState::Window(State::default()),
            Meter::Queue(_) => MeterState::Queue(State::default()),
        }
    }

    /// Decides `op` at `now` on `state` and applies it (see
    /// [`meter::decide`](super::decide)). A state of another kind (the
    /// configuration changed the kind) decides as no state, and is replaced
    /// only when the decision writes: a grant, a charge, a refund or a new
    /// ban.
    pub fn decide(
        &self,
        state: &mut MeterState,
        now: Millis,
        op: Op,
    ) -> Result<Reply, ClientError> {
        if !self.is_kind_of(state) {
            // As if nothing were stored; the other kind's state is replaced
            // only if the decision writes (as a store that writes only
            // then would), and never on an error.
            let mut fresh = self.empty();
            let reply = self.decide(&mut fresh, now, op)?;
            let wrote = match op {
                Op::Request { dry_run: true, .. } => false,
                Op::Request { .. } => reply.granted > 0 || reply.banned,
                Op::Charge(_) | Op::Refund(_) => true,
            };
            if wrote {
                *state = fresh;
            }
            return Ok(reply);
        }
        match (self, state) {
            (Meter::Bucket(p), MeterState::Bucket(s)) => super::decide(p, s, now, op),
            (Meter::Window(p), MeterState::Window(s)) => super::decide(p, s, now, op),
            (Meter::Queue(p), MeterState::Queue(s)) => super::decide(p, s, now, op),
            // The kinds match: a state of another kind returned above.
            _ => Err(ClientError::invalid("state of another kind")),
        }
    }

    /// The time from which `state` decides everything as no state would
    /// (see [`State::forget_at`]); 0 for a state of another kind.
    pub fn forget_at(&self, state: &MeterState) -> Millis {
        match (self, state) {
            (Meter::Bucket(p), MeterState::Bucket(s)) => s.forget_at(p),
            (Meter::Window(p), MeterState::Window(s)) => s.forget_at(p),
            (Meter::Queue(p), MeterState::Queue(s)) => s.forget_at(p),
            _ => 0,
        }
    }

    /// Whether `state` is of this meter's kind.
    pub fn is_kind_of(&self, state: &MeterState) -> bool {
        matches!(
            (self, state),
            (Meter::Bucket(_), MeterState::Bucket(_))
                | (Meter::Window(_), MeterState::Window(_))
                | (Meter::Queue(_), MeterState::Queue(_))
        )
    }

    /// The limit replies show (burst, limit, size).
    pub fn limit(&self) -> u64 {
        match self {
            Meter::Bucket(p) => p.limit(),
            Meter::Window(p) => p.limit(),
            Meter::Queue(p) => p.limit(),
        }
    }

    /// The soft limit and ban.
    pub fn policy(&self) -> super::Policy {
        match self {
            Meter::Bucket(p) => p.policy(),
            Meter::Window(p) => p.policy(),
            Meter::Queue(p) => p.policy(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::Policy;
    use crate::request::Amount;
    use crate::window::Algorithm;

    #[test]
    fn a_state_of_another_kind_is_replaced_only_by_a_write() {
        let b = Meter::Bucket(bucket::Params::new(2, 1, 1_000, Policy::default()).expect("valid"));
        let w = Meter::Window(
            window::Params::new(Algorithm::Fixed, 1, 1_000, Policy::default()).expect("valid"),
        );
        let one = Op::request(Amount::exactly(1).expect("valid"));
        let two = Op::request(Amount::exactly(2).expect("valid"));
        let mut s = b.empty();
        b.decide(&mut s, 0, one).expect("granted");
        let kept = s;
        assert_eq!(b.forget_at(&kept), 1_000);
        assert_eq!(w.forget_at(&kept), 0, "another kind's state is idle to it");
        // A plain rejection, a dry run and an error write nothing.
        assert_eq!(w.decide(&mut s, 10, two).expect("decided").granted, 0);
        assert!(
            w.decide(&mut s, 10, Op::dry_run(Amount::exactly(1).expect("valid")))
                .is_ok()
        );
        assert!(w.decide(&mut s, 10, Op::Refund(1)).is_err());
        assert_eq!(s, kept);
        // A grant writes the window's state in its place.
        assert_eq!(w.decide(&mut s, 10, one).expect("granted").granted, 1);
        assert!(w.is_kind_of(&s));
        assert_eq!(w.forget_at(&s), 1_000);
    }
}
