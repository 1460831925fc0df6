//! What every rate-like kind has in common (SPEC §10): the operations
//! (request, dry run, charge, refund), the reply context (`limit`,
//! `remaining`, `reset_after_ms`, `retry_after_ms`), soft limits, bans, and
//! the one decision driver that applies them the same way to token buckets
//! ([`crate::bucket`]), windows ([`crate::window`]) and queues
//! ([`crate::queue`]).
//!
//! The kinds are this module's children, so that [`Meter`] (one kind as
//! a value) and the driver they plug into form no circle; they keep their
//! paths at the crate's root.
//!
//! Each kind only says how its level behaves ([`Level`]): how much room
//! there is at a time, what a grant or a charge leaves, when it would have
//! room again and when its state becomes idle. [`decide`] does the rest, so
//! a ban or a dry run cannot mean something different from one kind to the
//! next. [`SoftLimit`] and the ban arithmetic are plain values that the
//! burst tiers can use too.
//!
//! Exactness: every number a decision computes is an integer of at most
//! [`MAX_COUNT`] (2^53 − 1), so that the Redis store's Lua port, whose
//! numbers are doubles, computes the same replies. See `docs/algorithms.md`.

use std::fmt;

use serde::Serialize;

use crate::request::{Amount, positive_count};
use crate::{ClientError, MAX_COUNT, Millis};

pub mod bucket;
pub mod drain;
#[cfg(test)]
pub(crate) mod harness;
mod kinds;
pub mod queue;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod window;

pub use kinds::{Meter, MeterState};

/// The longest span (period, window, ban, a bucket's refill) a rate-like
/// kind accepts: 2^50 ms (about 35 000 years). Every time a decision
/// computes is `now` plus at most three such spans (a ban, then two
/// windows), so with `now` below 2^51 (the year 73 000) it stays below
/// 2^53, where Lua's doubles are still exact integers.
pub const MAX_SPAN: Millis = 1 << 50;

/// A parameter that cannot be used, with the field it is about, so that the
/// configuration parser can put its own path in front
/// (`resources[2].period: must be at least 1ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as configuration files spell it (`burst`, `period`).
    pub field: &'static str,
    /// What is wrong with it, starting in lower case.
    pub message: String,
}

impl FieldError {
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

impl From<FieldError> for ClientError {
    fn from(e: FieldError) -> Self {
        ClientError::invalid(e.to_string())
    }
}

/// A count parameter (`burst`, `count`, `limit`, `rate`, `size`): from 1 to
/// [`MAX_COUNT`].
pub(crate) fn count_param(field: &'static str, n: u64) -> Result<u64, FieldError> {
    if n == 0 {
        return Err(FieldError::new(field, "must be at least 1"));
    }
    if n > MAX_COUNT {
        return Err(FieldError::new(
            field,
            format!("must be at most {MAX_COUNT} (2^53-1)"),
        ));
    }
    Ok(n)
}

/// A span parameter (`period`, `window`, `ban`): from 1 ms to [`MAX_SPAN`].
pub(crate) fn span_param(field: &'static str, ms: Millis) -> Result<Millis, FieldError> {
    if ms == 0 {
        return Err(FieldError::new(field, "must be positive (at least 1ms)"));
    }
    if ms > MAX_SPAN {
        return Err(FieldError::new(
            field,
            format!("must be at most {MAX_SPAN}ms (2^50 ms)"),
        ));
    }
    Ok(ms)
}

/// `ceil(a / b)` for `b > 0`. The Lua port computes it as a floor division
/// plus one if the remainder is not 0, both exact below 2^53.
pub(crate) fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// `soft_limit: N%`: warn once usage reaches N % of the limit in force.
///
/// Usage is `limit − remaining` as the reply shows it (tokens used rounded
/// up, a window's count or estimate, a queue's backlog rounded up, a tier's
/// hits), so a client can check the warning against the numbers it gets.
/// Percentages are whole numbers: what operators write, and it keeps the
/// threshold an exact integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftLimit {
    percent: u64,
}

impl SoftLimit {
    /// `N%` with 0 < N ≤ 100; anything else is an error naming `soft_limit`.
    pub fn percent(percent: u64) -> Result<Self, FieldError> {
        if percent == 0 || percent > 100 {
            return Err(FieldError::new(
                "soft_limit",
                format!("{percent}% must be above 0% and at most 100%"),
            ));
        }
        Ok(Self { percent })
    }

    /// N.
    pub fn as_percent(self) -> u64 {
        self.percent
    }

    /// The least usage that warns: `ceil(N × limit / 100)`, computed without
    /// a product above `limit` (`limit = 100q + r`), so exactly in Lua too.
    /// At least 1 for any limit of at least 1: an unused limit never warns.
    pub fn threshold(self, limit: u64) -> u64 {
        let (q, r) = (limit / 100, limit % 100);
        self.percent * q + ceil_div(self.percent * r, 100)
    }

    /// Whether a reply with this `limit` and `remaining` warns.
    pub fn warns(self, limit: u64, remaining: u64) -> bool {
        limit - remaining.min(limit) >= self.threshold(limit)
    }
}

/// `ban: DURATION` (rate-based ban, seed 001): a request rejected for lack
/// of room bans the domain from the resource for this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    duration: Millis,
}

impl Ban {
    /// A ban of `duration` ms, from 1 ms to [`MAX_SPAN`].
    pub fn new(duration: Millis) -> Result<Self, FieldError> {
        Ok(Self {
            duration: span_param("ban", duration)?,
        })
    }

    /// The ban's length in ms.
    pub fn duration(self) -> Millis {
        self.duration
    }

    /// The end of a ban that starts at `now` (exclusive: the request at the
    /// end is decided normally).
    pub fn until(self, now: Millis) -> Millis {
        now.saturating_add(self.duration)
    }
}

/// Whether a ban ending at `until` still holds at `now`: the time left, or
/// `None`. A ban holds for `now < until`, so its last millisecond is
/// `until − 1`.
pub fn ban_left(until: Option<Millis>, now: Millis) -> Option<Millis> {
    until.filter(|&u| now < u).map(|u| u - now)
}

/// The options every rate-like kind shares (SPEC §10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Warn at this share of the limit.
    pub soft_limit: Option<SoftLimit>,
    /// Ban a domain this long after a rejection.
    pub ban: Option<Ban>,
}

/// One operation on a (resource, domain) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `request(copies, min_copies)`; with `dry_run` it is decided and
    /// answered exactly as it would be, and nothing is recorded.
    Request { amount: Amount, dry_run: bool },
    /// `charge(copies)`: a cost recorded after the fact, never rejected.
    Charge(u64),
    /// `refund(copies)`: tokens given back (buckets only).
    Refund(u64),
}

impl Op {
    /// A request that records what it is granted.
    pub fn request(amount: Amount) -> Self {
        Op::Request {
            amount,
            dry_run: false,
        }
    }

    /// Whether `reply` rejects this operation: a request or dry run that
    /// was granted nothing (charges and refunds are never rejected). A
    /// batch of operations decided all or nothing (Envoy's descriptors,
    /// SPEC §11) commits only if none is rejected.
    pub fn rejects(self, reply: &Reply) -> bool {
        matches!(self, Op::Request { .. }) && reply.granted == 0
    }

    /// A request that records nothing.
    pub fn dry_run(amount: Amount) -> Self {
        Op::Request {
            amount,
            dry_run: true,
        }
    }
}

/// The reply of every rate-like kind but the burst tiers (SPEC §7–10), all
/// values as of after the operation (for a dry run, as if it had been
/// applied). A rejection is an ordinary reply with `granted = 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reply {
    /// Units granted (request), charged (charge) or refunded (refund).
    pub granted: u64,
    /// The limit in force: a bucket's burst, a window's limit, a queue's
    /// size.
    pub limit: u64,
    /// How many more units would be granted now, rounded down; 0 in debt.
    pub remaining: u64,
    /// Until the state has nothing to remember for the limit: a full bucket,
    /// the end of the current window, an empty queue (rounded up).
    pub reset_after_ms: Millis,
    /// The wait until a request for `min_copies` (1 after a charge or a
    /// refund) would be granted if nothing else arrived, rounded up; 0 if it
    /// would be now, `null` if never (`min_copies` above the limit).
    pub retry_after_ms: Option<Millis>,
    /// Usage after the operation is at least the soft limit.
    pub warning: bool,
    /// The domain is banned from the resource (from this rejection on, or
    /// earlier).
    pub banned: bool,
    /// Queues only: how long the client waits before it proceeds (0 when
    /// nothing was admitted); absent for other kinds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<Millis>,
}

/// The state of one (resource, domain) pair of a rate-like kind: the
/// kind's level, if it remembers anything, and the end of a ban, if one
/// was set. `State::default()` is "nothing stored".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State<S> {
    /// The kind's own state (a bucket's TAT, a window's counts, a queue's
    /// F); `None` behaves as a full bucket, an empty window or queue.
    pub level: Option<S>,
    /// The end of the latest ban (exclusive), if any.
    pub banned_until: Option<Millis>,
}

impl<S> Default for State<S> {
    fn default() -> Self {
        Self {
            level: None,
            banned_until: None,
        }
    }
}

impl<S: Copy> State<S> {
    /// From when this state decides every operation as `State::default()`
    /// would, so a store may delete it: the later of the level's idle time
    /// and the ban's end. 0 for an empty state.
    pub fn forget_at<L: Level<State = S>>(&self, kind: &L) -> Millis {
        let level = self.level.map_or(0, |s| kind.forget_at(&s));
        level.max(self.banned_until.unwrap_or(0))
    }

    /// Whether a store may delete this state at `now`.
    pub fn is_idle<L: Level<State = S>>(&self, kind: &L, now: Millis) -> bool {
        self.forget_at(kind) <= now
    }

    /// The state as it should be written at `now`: parts that can no
    /// longer change a decision are dropped.
    fn pruned<L: Level<State = S>>(self, kind: &L, now: Millis) -> Self {
        Self {
            level: self.level.filter(|s| kind.forget_at(s) > now),
            banned_until: self.banned_until.filter(|&u| u > now),
        }
    }
}

/// How one kind's level behaves. Implemented by each kind's `Params`; every
/// method takes the level as of the last write (`None`: nothing stored) and
/// a time, and is pure. Methods may assume `now` is not before the level's
/// last write; if the clock stepped back, they must still neither panic nor
/// grant more than at the time of the write.
pub trait Level {
    /// The kind's compact state.
    type State: Copy + fmt::Debug + PartialEq + Eq;

    /// The limit shown in replies (burst, limit, size).
    fn limit(&self) -> u64;
    /// The soft limit and ban.
    fn policy(&self) -> Policy;
    /// How many units a request at `now` could be granted.
    fn room(&self, s: Option<&Self::State>, now: Millis) -> u64;
    /// The level after granting `n ≤ room` units at `now`.
    fn take(&self, s: Option<&Self::State>, now: Millis, n: u64) -> Self::State;
    /// The level after charging `n` units at `now`, beyond the limit if need
    /// be; an error naming `copies` if the level could not be kept exactly.
    fn charge(
        &self,
        s: Option<&Self::State>,
        now: Millis,
        n: u64,
    ) -> Result<Self::State, ClientError>;
    /// The level after refunding `n` units at `now`. Only buckets refund:
    /// hits in a window or a queue cannot be un-requested (paper §3.1).
    fn refund(
        &self,
        s: Option<&Self::State>,
        now: Millis,
        n: u64,
    ) -> Result<Option<Self::State>, ClientError> {
        let _ = (s, now, n);
        Err(no_refund())
    }
    /// `remaining` at `now` (rounded down, 0 in debt or past the limit).
    fn remaining(&self, s: Option<&Self::State>, now: Millis) -> u64;
    /// `reset_after_ms` at `now`.
    fn reset_after(&self, s: Option<&Self::State>, now: Millis) -> Millis;
    /// The wait from `now` until a request for `min` units would be granted
    /// if nothing else arrived; `None` if never.
    fn retry_after(&self, s: Option<&Self::State>, now: Millis, min: u64) -> Option<Millis>;
    /// The earliest time at which `s` decides everything as `None` would.
    fn forget_at(&self, s: &Self::State) -> Millis;
    /// Queues: the delay a grant at `now` tells the client. `None` for
    /// kinds without delays.
    fn delay(&self, s: Option<&Self::State>, now: Millis) -> Option<Millis> {
        let _ = (s, now);
        None
    }
}

/// The client error of a refund on a kind that cannot refund, in one place
/// so that every such kind words it alike.
pub fn no_refund() -> ClientError {
    ClientError::invalid(
        "op refund is only for kind bucket: hits already counted cannot be un-requested",
    )
}

/// Decides `op` on one (resource, domain) pair at `now` and applies it to
/// `state` (SPEC §7–10).
///
/// - During a ban every request (dry run or not) is rejected with
///   `banned: true`; charges and refunds still apply.
/// - A request grants the largest n in `[min_copies, copies]` that fits;
///   otherwise it is rejected, nothing changes but, with `ban`, the start
///   of a ban.
/// - A dry run is answered exactly as the request would be, ban included,
///   and changes nothing.
/// - A charge of 0 or a refund of 0 is a client error, as is a refund on a
///   kind that has none, or a charge whose debt could not be kept exactly;
///   nothing changes then either.
///
/// The state is written only on a grant, a charge, a refund or a new ban,
/// and then without the parts that can no longer change a decision (an
/// ended ban, a full bucket).
pub fn decide<L: Level>(
    kind: &L,
    state: &mut State<L::State>,
    now: Millis,
    op: Op,
) -> Result<Reply, ClientError> {
    let banned = ban_left(state.banned_until, now).is_some();
    let level = state.level.filter(|s| kind.forget_at(s) > now);
    let (granted, after, min, new_ban, delay) = match op {
        Op::Request { amount, dry_run } => {
            let fit = if banned {
                None
            } else {
                amount.grant_within(kind.room(level.as_ref(), now))
            };
            match fit {
                Some(n) => {
                    let after = kind.take(level.as_ref(), now, n);
                    let delay = kind.delay(level.as_ref(), now);
                    if !dry_run {
                        *state = State {
                            level: Some(after),
                            banned_until: state.banned_until,
                        }
                        .pruned(kind, now);
                    }
                    (n, Some(after), amount.min_copies(), None, delay)
                }
                None => {
                    let new_ban = if banned {
                        None
                    } else {
                        kind.policy().ban.map(|b| b.until(now))
                    };
                    if let (Some(until), false) = (new_ban, dry_run) {
                        *state = State {
                            level,
                            banned_until: Some(until),
                        }
                        .pruned(kind, now);
                    }
                    let delay = kind.delay(level.as_ref(), now).map(|_| 0);
                    (0, level, amount.min_copies(), new_ban, delay)
                }
            }
        }
        Op::Charge(n) => {
            let n = positive_count("copies", n)?;
            let after = kind.charge(level.as_ref(), now, n)?;
            let delay = kind.delay(level.as_ref(), now);
            *state = State {
                level: Some(after),
                banned_until: state.banned_until,
            }
            .pruned(kind, now);
            (n, Some(after), 1, None, delay)
        }
        Op::Refund(n) => {
            let n = positive_count("copies", n)?;
            let after = kind.refund(level.as_ref(), now, n)?;
            *state = State {
                level: after,
                banned_until: state.banned_until,
            }
            .pruned(kind, now);
            (n, after, 1, None, None)
        }
    };
    let ban_until = new_ban.or(state.banned_until.filter(|_| banned));
    Ok(context(
        kind,
        after.as_ref(),
        now,
        granted,
        min,
        ban_until,
        delay,
    ))
}

/// The reply for a level `after` the operation at `now`.
fn context<L: Level>(
    kind: &L,
    after: Option<&L::State>,
    now: Millis,
    granted: u64,
    min: u64,
    ban_until: Option<Millis>,
    delay_ms: Option<Millis>,
) -> Reply {
    let limit = kind.limit();
    let remaining = kind.remaining(after, now);
    // During a ban the wait is the time left, and more if the limit itself
    // has no room when the ban ends: a client told to come back at the end
    // of the ban must not be rejected (and banned again) then.
    let retry_after_ms = match ban_left(ban_until, now) {
        Some(left) => kind
            .retry_after(after, now + left, min)
            .map(|w| left.saturating_add(w)),
        None => kind.retry_after(after, now, min),
    };
    Reply {
        granted,
        limit,
        remaining,
        reset_after_ms: kind.reset_after(after, now),
        retry_after_ms,
        warning: kind
            .policy()
            .soft_limit
            .is_some_and(|s| s.warns(limit, remaining)),
        banned: ban_until.is_some(),
        delay_ms,
    }
}
