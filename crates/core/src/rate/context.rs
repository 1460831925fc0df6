//! What the burst tiers share with every other rate-like kind (SPEC §10):
//! the reply context (`limit`, `remaining`, `reset_after_ms`,
//! `retry_after_ms`), soft limits, bans, dry runs and charges, applied
//! around the tier rule of [`super::decide()`] the way [`crate::meter::decide`]
//! applies them around a bucket, a window or a queue, so that a ban or a dry
//! run means the same on every kind.
//!
//! `retry_after_ms` is computed with the decision rule itself: the state
//! only changes at a few instants (a hit leaving a tier's window or the last
//! second, a tier's active or cooldown period ending, a ban ending), so a
//! dry decision at each of them, in increasing order, finds the first
//! instant at which a request would be granted. Their number is bounded by
//! the entries in the logs, which are bounded already (one per millisecond
//! with hits).

use super::decide::{RateReply, TierContext, grant, plan, room};
use super::log::HitLog;
use super::state::RateState;
use crate::bound::{self, Kept};
use crate::limits::{Enforcement, RateLimits};
use crate::meter::{Op, Policy, ban_left};
use crate::request::{Amount, positive_count};
use crate::time::{Millis, SECOND};
use crate::{ClientError, MAX_COUNT, UNBOUNDED};

/// Decides `op` (request, dry run or charge) on one (resource, domain)
/// pair of burst tiers at `now` and applies it: SPEC §2 and §10.
///
/// - During a ban every request (dry run or not) is rejected with
///   `banned: true`; charges still apply. Under `ignore_configured` the ban
///   rejects nothing, as no limit does.
/// - A request is decided by SPEC §2 rule 5; a rejection with `policy.ban`
///   starts a ban (which the reply already shows).
/// - A dry run is answered exactly as the request would be, ban included,
///   and records nothing (time still forgets what it made irrelevant).
/// - A charge records `copies` hits in the current tier's window (no
///   burst; none in tier 0) and in the last second of the domain and of
///   the resource, past any limit, and is never rejected.
/// - A refund is a client error: hits cannot be un-requested.
pub fn decide_op(
    limits: RateLimits<'_>,
    policy: Policy,
    state: &mut RateState,
    global: &mut HitLog,
    now: Millis,
    op: Op,
    enforcement: Enforcement,
) -> Result<RateReply, ClientError> {
    let now = now.max(state.latest()).max(global.latest().unwrap_or(0));
    state.advance(limits.tiers, now);
    global.prune(now, SECOND);
    match op {
        Op::Request {
            amount,
            dry_run: true,
        } => {
            let (mut s, mut g) = (state.clone(), global.clone());
            request(limits, policy, &mut s, &mut g, now, amount, enforcement)
        }
        Op::Request { amount, .. } => {
            request(limits, policy, state, global, now, amount, enforcement)
        }
        Op::Charge(n) => charge(limits, policy, state, global, now, n, enforcement),
        Op::Refund(_) => Err(crate::meter::no_refund()),
    }
}

/// [`decide_op`] for a plain request without soft limit or ban: SPEC §2
/// rules 3–6 with the reply context.
pub fn decide(
    limits: RateLimits<'_>,
    state: &mut RateState,
    global: &mut HitLog,
    now: Millis,
    amount: Amount,
    enforcement: Enforcement,
) -> Result<RateReply, ClientError> {
    decide_op(
        limits,
        Policy::default(),
        state,
        global,
        now,
        Op::request(amount),
        enforcement,
    )
}

fn request(
    limits: RateLimits<'_>,
    policy: Policy,
    state: &mut RateState,
    global: &mut HitLog,
    now: Millis,
    amount: Amount,
    enforcement: Enforcement,
) -> Result<RateReply, ClientError> {
    let enforce = enforcement == Enforcement::Enforce;
    let mut reply = if enforce && ban_left(state.banned_until, now).is_some() {
        observe(limits, state, global, now, false)
    } else {
        let reply = grant(limits, state, global, now, amount, enforcement)?;
        if reply.granted == 0
            && enforce
            && let Some(ban) = policy.ban
        {
            state.banned_until = Some(ban.until(now));
        }
        reply
    };
    reply.context = context(limits, policy, state, global, now, amount.min_copies());
    Ok(reply)
}

fn charge(
    limits: RateLimits<'_>,
    policy: Policy,
    state: &mut RateState,
    global: &mut HitLog,
    now: Millis,
    n: u64,
    enforcement: Enforcement,
) -> Result<RateReply, ClientError> {
    let n = positive_count("copies", n)?;
    let current = state.current_tier(limits.tiers, now);
    bound::check(Kept::DomainHits, state.last_second.count(), n)?;
    bound::check(Kept::ResourceHits, global.count(), n)?;
    bound::check(Kept::TierHits, state.tier_hits(current), n)?;
    if current >= 1 {
        state.tier_mut(current).hits.record(now, n);
    }
    state.last_second.record(now, n);
    global.record(now, n);
    let mut reply = observe(
        limits,
        state,
        global,
        now,
        enforcement == Enforcement::Ignore,
    );
    reply.granted = n;
    reply.context = context(limits, policy, state, global, now, 1);
    Ok(reply)
}

/// A reply that grants nothing and enters no tier (a request during a ban,
/// before `granted` is set for a charge), with the state's counts.
fn observe(
    limits: RateLimits<'_>,
    state: &RateState,
    global: &HitLog,
    now: Millis,
    ignored: bool,
) -> RateReply {
    let tiers = limits.tiers;
    let tier = state.current_tier(tiers, now);
    RateReply {
        granted: 0,
        hard_limit: limits.hard_limit,
        global_limit: limits.global_limit,
        tier_limit: if tier == 0 { 0 } else { tiers[tier - 1].limit },
        domain_hits_last_second: state.last_second.count(),
        global_hits_last_second: global.count(),
        tier_hits: state.tier_hits(tier),
        tier,
        burst: false,
        hard_limited: false,
        global_limited: false,
        ignored,
        context: TierContext::default(),
    }
}

/// The reply context of a state as of `now`, after the operation; `min` is
/// the least grant a retry must get.
fn context(
    limits: RateLimits<'_>,
    policy: Policy,
    state: &RateState,
    global: &HitLog,
    now: Millis,
    min: u64,
) -> TierContext {
    let tiers = limits.tiers;
    let current = state.current_tier(tiers, now);
    let limit = if current == 0 {
        0
    } else {
        tiers[current - 1].limit
    };
    let ban_until = state
        .banned_until
        .filter(|_| ban_left(state.banned_until, now).is_some());
    let warning = current >= 1
        && limit <= MAX_COUNT
        && policy
            .soft_limit
            .is_some_and(|s| s.warns(limit, limit.saturating_sub(state.tier_hits(current))));
    TierContext {
        limit,
        // Past MAX_COUNT only through an unbounded tier: unbounded.
        remaining: Some(room_at(limits, state, global, now, UNBOUNDED))
            .filter(|&r| r <= MAX_COUNT)
            .unwrap_or(UNBOUNDED),
        reset_after_ms: state.whole_at(tiers).map(|at| at.saturating_sub(now)),
        retry_after_ms: retry_after(limits, state, global, now, min, ban_until),
        warning,
        banned: ban_until.is_some(),
    }
}

/// How many of `want` hits a request at `now` would be granted (as many
/// as fit, no minimum), on a state advanced to `now`.
pub(super) fn room_at(
    limits: RateLimits<'_>,
    state: &RateState,
    global: &HitLog,
    now: Millis,
    want: u64,
) -> u64 {
    let current = state.current_tier(limits.tiers, now);
    let through_tiers = plan(limits.tiers, state, current, now, want, |_| {});
    through_tiers
        .min(room(limits.hard_limit, state.last_second.count()))
        .min(room(limits.global_limit, global.count()))
}

/// The least wait from `now` until a request for `min` hits would be
/// granted, if nothing else arrived: the first instant, not before the end
/// of a ban, at which a dry decision grants it. `None` if none does.
///
/// The decision only changes at the instants `changes` lists; after the
/// last of them nothing changes any more, so if none grants, none ever
/// will.
pub fn retry_after(
    limits: RateLimits<'_>,
    state: &RateState,
    global: &HitLog,
    now: Millis,
    min: u64,
    ban_until: Option<Millis>,
) -> Option<Millis> {
    if limits.hard_limit.is_some_and(|h| min > h) || limits.global_limit.is_some_and(|g| min > g) {
        return None;
    }
    let start = ban_until.map_or(now, |u| u.max(now));
    if start == now && room_at(limits, state, global, now, min) >= min {
        return Some(0);
    }
    let mut at = changes(limits, state, global);
    at.push(start);
    at.retain(|&t| t >= start);
    at.sort_unstable();
    at.dedup();
    let (mut s, mut g) = (state.clone(), global.clone());
    for t in at {
        s.advance(limits.tiers, t);
        g.prune(t, SECOND);
        if room_at(limits, &s, &g, t, min) >= min {
            return Some(t - now);
        }
    }
    None
}

/// Every instant at which time alone changes what `state` and `global`
/// decide: a hit leaving a tier's window (`t + W + 1`) or the last second
/// (`t + 1001`), a tier's active period or cooldown ending.
fn changes(limits: RateLimits<'_>, state: &RateState, global: &HitLog) -> Vec<Millis> {
    let mut at = Vec::new();
    for (ts, tier) in state.tiers.iter().zip(limits.tiers) {
        let Some(e) = ts.entered else { continue };
        if let Some(active) = tier.active {
            at.push(e.saturating_add(active));
            at.push(e.saturating_add(active).saturating_add(tier.cooldown));
        }
        let leave = tier.window.saturating_add(1);
        at.extend(ts.hits.entries().map(|(t, _)| t.saturating_add(leave)));
    }
    for log in [&state.last_second, global] {
        at.extend(log.entries().map(|(t, _)| t.saturating_add(SECOND + 1)));
    }
    at
}
