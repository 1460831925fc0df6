//! Waiting for a copy (SPEC §14; paper §5.5, MediaWiki's PoolCounter).
//!
//! A caller that finds no copy free may wait for one instead of retrying
//! with back-off: retries arrive late and in random order, so the caller
//! that waited longest may lose to one that just came. Here every reserve
//! of a resource joins one queue in arrival order and the queue is
//! *served* after everything that can free a copy: each waiter in order
//! takes what all its limits allow if that is at least its `min_copies`.
//! A waiter blocked by its own domain or group limit could not use a freed
//! copy anyway, so it is passed over and keeps its place; a waiter whose
//! own limits would let it take copies but the resource's global limit
//! does not stops the serving, so nobody behind it takes copies ahead of
//! it.
//!
//! Pure functions over a [`CopyState`] and a [`WaitQueue`], time passed
//! in: the in-memory store runs them under the resource's lock, the Redis
//! store's queue scripts repeat them (the differential test keeps the two
//! equal).

use std::collections::VecDeque;
use std::hash::BuildHasher;

use serde::Serialize;

use super::{CopyState, ReserveReply, available, check_bound, reserve};
use crate::limits::{CopyLimits, Enforcement};
use crate::request::Amount;
use crate::{ClientError, Millis, UNBOUNDED};

/// How many callers may wait for one resource unless configured.
pub const DEFAULT_QUEUE_LIMIT: u64 = 100;

/// The most a `queue_limit` may be: a queue is kept whole in memory (and
/// in one Redis key), so its size must stay bounded.
pub const MAX_QUEUE_LIMIT: u64 = 1_000_000;

/// What a waiter hears when a holder releases with `result_ready`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitMode {
    /// PoolCounter's ACQ4ME: a released copy goes to the first waiter
    /// that can take it, keeping the number of workers at its maximum.
    #[default]
    Exclusive,
    /// PoolCounter's ACQ4ANY: a release with `result_ready` answers every
    /// waiter of the same (resource, domain) at once, without a copy: the
    /// work they waited to do is done, they read its result instead.
    SharedResult,
}

/// One caller waiting for copies. The limits are those in force when it
/// arrived: a waiter is decided by what it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The store's name for this wait, unique while it waits.
    pub ticket: u64,
    pub domain: String,
    pub limits: CopyLimits,
    pub amount: Amount,
    pub arrived: Millis,
    /// Rejected at `now >= deadline` if still waiting.
    pub deadline: Millis,
}

/// The waiters of one resource, in arrival order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitQueue {
    pub waiters: VecDeque<Waiter>,
}

impl WaitQueue {
    /// How many wait.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The earliest deadline of a waiter, if any waits.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.waiters.iter().map(|w| w.deadline).min()
    }
}

/// A waiter decided, with its reply (`waited_ms` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub ticket: u64,
    pub reply: ReserveReply,
}

/// A reserve that may wait: its ticket, how long it may wait and the
/// resource's queue limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitAsk {
    pub ticket: u64,
    pub wait_ms: Millis,
    pub queue_limit: u64,
}

/// What a reserve came to when it arrived, and any waiter served with it
/// (none unless the counts changed without the queue being served).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub joined: Joined,
    pub served: Vec<Decided>,
}

/// What a reserve came to when it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// Answered at once (granted, rejected, or rejected with `queue_full`).
    Now(ReserveReply),
    /// Waiting under its ticket.
    Queued,
}

/// A reserve arriving at `now` (SPEC §14): it joins the queue, the queue is
/// served, and if it got nothing it waits, or is rejected at once when its
/// `wait_ms` is 0 or the queue already holds `queue_limit` others. Only the
/// arrival can be decided here: the queue was served after the last change
/// of the counts, so nobody ahead of it can take more now. With nobody
/// waiting this is the plain [`reserve`] (and its bound error).
#[allow(clippy::too_many_arguments)]
pub fn arrive<S: BuildHasher>(
    state: &mut CopyState<S>,
    queue: &mut WaitQueue,
    domain: &str,
    limits: &CopyLimits,
    amount: Amount,
    enforcement: Enforcement,
    ask: WaitAsk,
    now: Millis,
) -> Result<Arrival, ClientError> {
    let now_answer = |reply, served| Arrival {
        joined: Joined::Now(reply),
        served,
    };
    let waited = (ask.wait_ms > 0).then_some(0);
    if queue.is_empty() || enforcement == Enforcement::Ignore {
        let mut reply = reserve(state, domain, limits, amount, enforcement)?;
        reply.waited_ms = waited;
        if reply.granted > 0 || ask.wait_ms == 0 {
            return Ok(now_answer(reply, Vec::new()));
        }
        if ask.queue_limit == 0 {
            reply.queue_full = true;
            return Ok(now_answer(reply, Vec::new()));
        }
    }
    queue.waiters.push_back(Waiter {
        ticket: ask.ticket,
        domain: domain.to_owned(),
        limits: limits.clone(),
        amount,
        arrived: now,
        deadline: now.saturating_add(ask.wait_ms),
    });
    let mut served = serve(state, queue, now);
    if let Some(i) = served.iter().position(|d| d.ticket == ask.ticket) {
        let mut d = served.remove(i);
        d.reply.waited_ms = waited;
        return Ok(now_answer(d.reply, served));
    }
    if ask.wait_ms > 0 && queue.len() as u64 <= ask.queue_limit {
        return Ok(Arrival {
            joined: Joined::Queued,
            served,
        });
    }
    let w = queue.waiters.pop_back().expect("the arrival is last");
    let mut reply = rejection(state, &w, now);
    reply.waited_ms = waited;
    reply.queue_full = ask.wait_ms > 0;
    Ok(now_answer(reply, served))
}

/// Serves the queue at `now`: every waiter, in arrival order, that its
/// limits let take at least `min_copies` takes the most they allow and
/// leaves the queue; one blocked by its own domain or group limit is passed
/// over; one blocked only by the global limit stops the serving. Returns
/// the waiters served, in queue order.
pub fn serve<S: BuildHasher>(
    state: &mut CopyState<S>,
    queue: &mut WaitQueue,
    now: Millis,
) -> Vec<Decided> {
    walk(state, queue, now).0
}

/// [`serve`], and where the walk stopped (the position of the waiter the
/// global limit stopped at, or the queue's length): until the counts
/// change, only that waiter's leaving can let anyone else through.
fn walk<S: BuildHasher>(
    state: &mut CopyState<S>,
    queue: &mut WaitQueue,
    now: Millis,
) -> (Vec<Decided>, usize) {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(w) = queue.waiters.get(i) {
        let counts = state.counts(&w.domain, &w.limits);
        let min = w.amount.min_copies();
        let grant = w
            .amount
            .grant_within(available(&w.limits, &counts))
            .filter(|&n| check_bound(&w.domain, &w.limits, &counts, n).is_ok());
        if let Some(n) = grant {
            let w = queue.waiters.remove(i).expect("looked at");
            let mut reply = reserve(
                state,
                &w.domain,
                &w.limits,
                Amount::exactly(n).expect("n ≥ min_copies ≥ 1"),
                Enforcement::Enforce,
            )
            .expect("bound checked");
            reply.waited_ms = Some(now.saturating_sub(w.arrived));
            out.push(Decided {
                ticket: w.ticket,
                reply,
            });
            continue;
        }
        let mut own = w.limits.domain_limit.saturating_sub(counts.domain);
        for (g, held) in w.limits.groups.iter().zip(&counts.groups) {
            own = own.min(g.limit.saturating_sub(*held));
        }
        let global = w
            .limits
            .global_limit
            .map_or(UNBOUNDED, |g| g.saturating_sub(counts.global));
        if own >= min && global < min {
            return (out, i);
        }
        i += 1;
    }
    let end = queue.len();
    (out, end)
}

/// Rejects, one at a time in order of deadline, every waiter whose
/// deadline is at or before `now`, serving the queue after each (a waiter
/// that stopped the serving may be the one leaving). Returns what was
/// decided, in that order.
pub fn expire_waiters<S: BuildHasher>(
    state: &mut CopyState<S>,
    queue: &mut WaitQueue,
    now: Millis,
) -> Vec<Decided> {
    // Due first by deadline, then by place in the queue (places keep their
    // order as waiters leave). Bounded cost: one sort, and a walk only
    // when the waiter leaving is the one the walk stopped at.
    let mut due: Vec<(Millis, usize, u64)> = queue
        .waiters
        .iter()
        .enumerate()
        .filter(|(_, w)| w.deadline <= now)
        .map(|(i, w)| (w.deadline, i, w.ticket))
        .collect();
    if due.is_empty() {
        return Vec::new();
    }
    due.sort_unstable();
    let (mut out, mut stop) = walk(state, queue, now);
    for (_, _, ticket) in due {
        let Some(i) = queue.waiters.iter().position(|w| w.ticket == ticket) else {
            continue; // served meanwhile
        };
        let w = queue.waiters.remove(i).expect("found");
        out.push(Decided {
            ticket: w.ticket,
            reply: rejection(state, &w, now),
        });
        if i == stop {
            let (served, at) = walk(state, queue, now);
            out.extend(served);
            stop = at;
        } else if i < stop {
            stop -= 1;
        }
    }
    out
}

/// Answers every waiter of `domain` with `result_ready` and no copy
/// (`wait_mode: shared_result`, a release with its result ready), in queue
/// order; the caller serves the queue after.
pub fn result_ready<S: BuildHasher>(
    state: &CopyState<S>,
    queue: &mut WaitQueue,
    domain: &str,
    now: Millis,
) -> Vec<Decided> {
    let (ready, rest): (VecDeque<Waiter>, VecDeque<Waiter>) = std::mem::take(&mut queue.waiters)
        .into_iter()
        .partition(|w| w.domain == domain);
    queue.waiters = rest;
    ready
        .into_iter()
        .map(|w| {
            let mut reply = rejection(state, &w, now);
            reply.result_ready = true;
            Decided {
                ticket: w.ticket,
                reply,
            }
        })
        .collect()
}

/// Takes waiter `ticket` out of the queue (its session ended); the caller
/// serves the queue after. `None` if it no longer waits.
pub fn leave(queue: &mut WaitQueue, ticket: u64) -> Option<Waiter> {
    let i = queue.waiters.iter().position(|w| w.ticket == ticket)?;
    queue.waiters.remove(i)
}

/// The usual rejection of waiter `w` at `now`: nothing granted, the counts
/// as they are.
fn rejection<S: BuildHasher>(state: &CopyState<S>, w: &Waiter, now: Millis) -> ReserveReply {
    let counts = state.counts(&w.domain, &w.limits);
    let mut reply = ReserveReply::new(0, &w.limits, &counts, Enforcement::Enforce);
    reply.waited_ms = Some(now.saturating_sub(w.arrived));
    reply
}
