//! An exact level that drains at a rational rate: the arithmetic a token
//! bucket's TAT ([`crate::bucket`]) and a queue's F ([`crate::queue`])
//! share. GCRA and the leaky bucket are the same meter; they differ in what
//! they tell the client.
//!
//! `count` units per `period` ms is the interval `period / count` ms per
//! unit, a rational that is never rounded. Reduced by their gcd to
//! `p / c`, time is counted in *ticks* of `1/c` ms: one unit is `p` ticks,
//! one millisecond `c` ticks. A level is stored as a [`Mark`], a time in
//! whole milliseconds plus a remainder in ticks, and every decision works
//! on `d`, the ticks from `now` to the mark, which the configuration bound
//! `capacity × p ≤ 2^53 − 1` (and the bound on debt) keeps exact in a
//! double. Absolute times are never multiplied by `c`: `now × c` would
//! pass 2^53 for any `c` above about 4 000.

use std::fmt;
use std::marker::PhantomData;

use crate::meter::{
    FieldError, Level, MAX_SPAN, Policy, ceil_div, count_param, no_refund, span_param,
};
use crate::{ClientError, MAX_COUNT, Millis};

/// A time `ms + frac / c` milliseconds, `0 ≤ frac < c`: a bucket's
/// theoretical arrival time (TAT), a queue's empty time (F).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mark {
    /// The whole milliseconds.
    pub ms: Millis,
    /// The remainder, in ticks of `1/c` ms (`c` from the kind's params).
    pub frac: u64,
}

/// A drain's exact arithmetic as plain numbers, for a store that ports
/// the decision (the Redis store's Lua) and must compute with the very
/// same integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticks {
    /// Ticks per unit (`p`).
    pub per_unit: u64,
    /// Ticks per millisecond (`c`).
    pub per_ms: u64,
    /// The most units the level holds without debt (burst, size).
    pub capacity: u64,
    /// The most ticks a mark may lie ahead of `now`.
    pub max_ahead: u64,
}

/// `units` per `period` ms, reduced, with the most units the level holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drain {
    /// Ticks per unit.
    p: u64,
    /// Ticks per millisecond.
    c: u64,
    /// The most units the level holds without debt (burst, size).
    capacity: u64,
    /// The most ticks a mark may lie ahead of `now`: 2^53 − 1, and at most
    /// [`MAX_SPAN`] ms, so that the mark's milliseconds (`now + d / c`)
    /// stay below 2^53 too.
    max_ahead: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Drain {
    /// Checks the counts and the bound `capacity × p ≤ 2^53 − 1`, the
    /// `capacity` field named as `capacity_field`.
    pub(crate) fn new(
        capacity_field: &'static str,
        capacity: u64,
        count_field: &'static str,
        count: u64,
        period: Millis,
    ) -> Result<Self, FieldError> {
        let capacity = count_param(capacity_field, capacity)?;
        let count = count_param(count_field, count)?;
        let period = span_param("period", period)?;
        let g = gcd(period, count);
        let (p, c) = (period / g, count / g);
        let span_ticks = (u128::from(MAX_SPAN) + 1) * u128::from(c) - 1;
        let max_ahead = u64::try_from(span_ticks.min(u128::from(MAX_COUNT))).unwrap_or(MAX_COUNT);
        if capacity > max_ahead / p {
            return Err(FieldError::new(
                capacity_field,
                format!(
                    "{capacity} is too large for {count} per {period}ms; the most Charon keeps \
                     exactly is {} ({capacity_field} × period / gcd(period, {count_field}) must \
                     be at most 2^53-1, and a full {capacity_field} at most 2^50 ms of time)",
                    max_ahead / p
                ),
            ));
        }
        Ok(Self {
            p,
            c,
            capacity,
            max_ahead,
        })
    }

    /// The numbers a port of this arithmetic needs.
    pub(crate) fn ticks(&self) -> Ticks {
        Ticks {
            per_unit: self.p,
            per_ms: self.c,
            capacity: self.capacity,
            max_ahead: self.max_ahead,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Ticks a full (or empty) level spans: `capacity × p`.
    fn full(&self) -> u64 {
        self.capacity * self.p
    }

    /// `d`: the ticks from `now` to the mark, 0 when it has passed. A mark
    /// written under another `c` (a configuration change) is read to within
    /// a millisecond, rounded up; a clock that stepped back far reads as
    /// the largest debt kept.
    pub(crate) fn ahead(&self, mark: Option<&Mark>, now: Millis) -> u64 {
        let Some(m) = mark else { return 0 };
        let (ms, frac) = if m.frac >= self.c {
            (m.ms.saturating_add(1), 0)
        } else {
            (m.ms, m.frac)
        };
        if ms < now {
            return 0;
        }
        let d = u128::from(ms - now) * u128::from(self.c) + u128::from(frac);
        u64::try_from(d.min(u128::from(self.max_ahead))).unwrap_or(self.max_ahead)
    }

    /// The mark `d` ticks after `now`.
    pub(crate) fn mark(&self, now: Millis, d: u64) -> Mark {
        Mark {
            ms: now.saturating_add(d / self.c),
            frac: d % self.c,
        }
    }

    /// Whole units that fit: `floor((full − d) / p)`, 0 in debt.
    pub(crate) fn room(&self, d: u64) -> u64 {
        self.full().saturating_sub(d) / self.p
    }

    /// `d` after taking `n ≤ room(d)` units.
    pub(crate) fn take(&self, d: u64, n: u64) -> u64 {
        d + n * self.p
    }

    /// `d` after charging `n` units, or an error naming `copies` if the
    /// mark would lie further ahead than `max_ahead`.
    pub(crate) fn charge(&self, d: u64, n: u64) -> Result<u64, ClientError> {
        if n > (self.max_ahead - d) / self.p {
            return Err(ClientError::invalid(format!(
                "copies {n} is too large to charge: the debt would pass {} units, the most \
                 Charon keeps exactly for this limit",
                (self.max_ahead / self.p).saturating_sub(self.capacity)
            )));
        }
        Ok(d + n * self.p)
    }

    /// `d` after giving back `n` units, never below 0 (a full level).
    pub(crate) fn refund(&self, d: u64, n: u64) -> u64 {
        if n > d / self.p { 0 } else { d - n * self.p }
    }

    /// Milliseconds until `d` has drained, rounded up.
    pub(crate) fn until_empty(&self, d: u64) -> Millis {
        ceil_div(d, self.c)
    }

    /// Milliseconds until `min` units fit, rounded up; `None` if they never
    /// do (`min > capacity`).
    pub(crate) fn until_room(&self, d: u64, min: u64) -> Option<Millis> {
        if min > self.capacity {
            return None;
        }
        let need = d.saturating_sub(self.full() - min * self.p);
        Some(ceil_div(need, self.c))
    }

    /// The time from which a mark decides as no mark: it has passed.
    pub(crate) fn forget_at(&self, mark: &Mark) -> Millis {
        if mark.frac == 0 {
            mark.ms
        } else {
            mark.ms.saturating_add(1)
        }
    }
}

/// What a drained kind does beyond the shared arithmetic. Buckets and
/// queues are the same meter (see the module doc), so one [`Level`] serves
/// both and only these two answers tell them apart.
pub trait Flow: Copy + fmt::Debug + PartialEq + Eq {
    /// Whether a refund gives units back (buckets) or is a client error.
    const REFUNDS: bool;
    /// Whether a grant tells the client to wait until the units ahead of
    /// it have left (queues).
    const DELAYS: bool;
}

/// A validated drained configuration: the exact drain and the policy.
/// [`crate::bucket::Params`] and [`crate::queue::Params`] are this type,
/// each with its own constructor that names its own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained<F> {
    drain: Drain,
    policy: Policy,
    flow: PhantomData<F>,
}

impl<F: Flow> Drained<F> {
    /// Checks the counts and the bound as [`Drain::new`] does, so each
    /// kind's constructor only says which of its fields is which.
    pub(crate) fn checked(
        capacity_field: &'static str,
        capacity: u64,
        count_field: &'static str,
        count: u64,
        period: Millis,
        policy: Policy,
    ) -> Result<Self, FieldError> {
        Ok(Self {
            drain: Drain::new(capacity_field, capacity, count_field, count, period)?,
            policy,
            flow: PhantomData,
        })
    }

    /// The most units the level holds without debt (burst, size).
    pub(crate) fn capacity(&self) -> u64 {
        self.drain.capacity()
    }

    /// The exact arithmetic's numbers, for the Redis store's port.
    pub fn ticks(&self) -> Ticks {
        self.drain.ticks()
    }
}

impl<F: Flow> Level for Drained<F> {
    type State = Mark;

    fn limit(&self) -> u64 {
        self.drain.capacity()
    }

    fn policy(&self) -> Policy {
        self.policy
    }

    fn room(&self, s: Option<&Mark>, now: Millis) -> u64 {
        self.drain.room(self.drain.ahead(s, now))
    }

    fn take(&self, s: Option<&Mark>, now: Millis, n: u64) -> Mark {
        let d = self.drain.ahead(s, now);
        self.drain.mark(now, self.drain.take(d, n))
    }

    fn charge(&self, s: Option<&Mark>, now: Millis, n: u64) -> Result<Mark, ClientError> {
        let d = self.drain.charge(self.drain.ahead(s, now), n)?;
        Ok(self.drain.mark(now, d))
    }

    fn refund(&self, s: Option<&Mark>, now: Millis, n: u64) -> Result<Option<Mark>, ClientError> {
        if !F::REFUNDS {
            return Err(no_refund());
        }
        let d = self.drain.refund(self.drain.ahead(s, now), n);
        Ok((d > 0).then(|| self.drain.mark(now, d)))
    }

    fn remaining(&self, s: Option<&Mark>, now: Millis) -> u64 {
        self.room(s, now)
    }

    fn reset_after(&self, s: Option<&Mark>, now: Millis) -> Millis {
        self.drain.until_empty(self.drain.ahead(s, now))
    }

    fn retry_after(&self, s: Option<&Mark>, now: Millis, min: u64) -> Option<Millis> {
        self.drain.until_room(self.drain.ahead(s, now), min)
    }

    fn forget_at(&self, s: &Mark) -> Millis {
        self.drain.forget_at(s)
    }

    /// Queues: `delay_ms = ceil(max(0, F − now))`, F before the grant: the
    /// units already waiting leave first.
    fn delay(&self, s: Option<&Mark>, now: Millis) -> Option<Millis> {
        F::DELAYS.then(|| self.drain.until_empty(self.drain.ahead(s, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_reduced_and_never_rounded() {
        let d = Drain::new("burst", 3, "count", 3, 1_000).expect("valid");
        assert_eq!((d.p, d.c), (1_000, 3));
        // Three units take exactly one second: 3 × 1000 ticks of 1/3 ms.
        let d3 = d.take(0, 3);
        assert_eq!(d.until_empty(d3), 1_000);
        assert_eq!(d.until_empty(d.take(0, 1)), 334, "333⅓ ms rounded up");
        let d = Drain::new("burst", 20, "count", 20, 1_000).expect("valid");
        assert_eq!((d.p, d.c), (50, 1));
    }

    #[test]
    fn marks_round_trip_through_ticks() {
        let d = Drain::new("burst", 3, "count", 3, 1_000).expect("valid");
        for ticks in [0, 1, 2, 3, 1_000, 2_999, 3_000] {
            let m = d.mark(1_000_000, ticks);
            assert!(m.frac < 3);
            assert_eq!(d.ahead(Some(&m), 1_000_000), ticks);
        }
        // A remainder from a larger count reads as the next millisecond.
        let m = Mark { ms: 10, frac: 5 };
        assert_eq!(d.ahead(Some(&m), 10), 3);
        // A clock far behind the mark reads as the largest debt, no panic.
        let m = Mark {
            ms: u64::MAX,
            frac: 0,
        };
        assert_eq!(d.ahead(Some(&m), 0), (MAX_SPAN + 1) * 3 - 1);
        let d1 = Drain::new("burst", 1, "count", 1, 1).expect("valid");
        assert_eq!(d1.ahead(Some(&m), 0), MAX_SPAN, "at most 2^50 ms ahead");
    }

    #[test]
    fn the_capacity_bound_is_inclusive() {
        // p = 7, c = 11 (period 7 ms, count 11): 2^53 − 1 ticks bind.
        let most = MAX_COUNT / 7;
        assert!(Drain::new("burst", most, "count", 11, 7).is_ok());
        let e = Drain::new("burst", most + 1, "count", 11, 7).expect_err("too large");
        assert_eq!(e.field, "burst");
        // p = 7, c = 1: 2^50 ms bind.
        let most = MAX_SPAN / 7;
        assert!(Drain::new("size", most, "rate", 1, 7).is_ok());
        let e = Drain::new("size", most + 1, "rate", 1, 7).expect_err("too large");
        assert_eq!(e.field, "size");
        // The gcd makes round numbers cheap: 10 million per 30 days.
        assert!(Drain::new("burst", 10_000_000, "count", 10_000_000, 2_592_000_000).is_ok());
    }

    #[test]
    fn a_charge_is_refused_only_past_the_exact_bound() {
        let d = Drain::new("burst", 1, "count", 1_000, 1).expect("valid");
        assert_eq!(d.max_ahead, MAX_COUNT);
        assert_eq!(d.charge(0, MAX_COUNT), Ok(MAX_COUNT));
        assert!(d.charge(1, MAX_COUNT).is_err());
        assert!(d.charge(MAX_COUNT, u64::MAX).is_err());
        let d = Drain::new("burst", 1, "count", 1, 1).expect("valid");
        assert_eq!(d.charge(0, MAX_SPAN), Ok(MAX_SPAN));
        assert!(d.charge(0, MAX_SPAN + 1).is_err());
    }
}
