//! The decision for `request(r, d, copies, min_copies)`: SPEC §2 rules 3–6,
//! and the reply it makes with its context ([`TierContext`], filled in by
//! `context`).

use serde::Serialize;

use super::log::HitLog;
use super::state::{Phase, RateState};
use crate::bound::{self, Kept};
use crate::limits::{Enforcement, RateLimits, Tier};
use crate::request::Amount;
use crate::time::{Millis, SECOND};
use crate::{ClientError, UNBOUNDED};

/// The reply context of SPEC §10 for the burst tiers, every value as of
/// after the operation (for a dry run, as if it had been applied).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierContext {
    /// The current tier's limit (0 for tier 0; unbounded, `null` in JSON,
    /// for the permissive tier of an unconfigured resource). The same value
    /// as `tier_limit`, under the name every kind uses.
    #[serde(serialize_with = "crate::wire::bound")]
    pub limit: u64,
    /// The largest n a request at the same instant would be granted,
    /// bursts, H and G included (a dry run for "as many as possible, at
    /// least 1"); 0 if none. Like every kind's, it ignores a ban (the reply
    /// says `banned`).
    #[serde(serialize_with = "crate::wire::bound")]
    pub remaining: u64,
    /// The wait until the pair is whole again if no other hit arrived
    /// ([`RateState::whole_at`]: every counted hit at the end of its window,
    /// no tier active or cooling down); 0 if it is; `null` if never (a tier
    /// above the first with an infinite active period, once entered).
    pub reset_after_ms: Option<Millis>,
    /// The least wait after which a request for `min_copies` (1 after a
    /// charge) would be granted if nothing else arrived from anyone; during
    /// a ban, from the ban's end on. `null` if no instant ever grants it
    /// (`min_copies` above H, or above what the tiers can ever hold).
    pub retry_after_ms: Option<Millis>,
    /// Hits in the current tier's window are at least the soft limit's share
    /// of its limit (never in tier 0).
    pub warning: bool,
    /// The domain is banned from the resource (from this rejection on, or
    /// earlier).
    pub banned: bool,
}

/// The reply to a request (SPEC §2 rule 6), every value as of after the
/// decision. A rejection is an ordinary reply with `granted = 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateReply {
    /// n: hits granted (0 on rejection).
    pub granted: u64,
    /// H, if configured.
    #[serde(serialize_with = "crate::wire::limit")]
    pub hard_limit: Option<u64>,
    /// G, if configured.
    #[serde(serialize_with = "crate::wire::limit")]
    pub global_limit: Option<u64>,
    /// L of the current tier (0 for tier 0, [`UNBOUNDED`] for the
    /// permissive tier of an unconfigured resource).
    #[serde(serialize_with = "crate::wire::bound")]
    pub tier_limit: u64,
    /// Hits by this domain in the last second.
    pub domain_hits_last_second: u64,
    /// Hits by all domains in the last second.
    pub global_hits_last_second: u64,
    /// Hits in the current tier's window.
    pub tier_hits: u64,
    /// The current tier's index (0 = no tier active).
    pub tier: usize,
    /// Whether the request entered a tier it was not in.
    pub burst: bool,
    /// Whether H was the binding limit: it allowed fewer hits than the
    /// tiers would have granted, and no more than G allowed.
    pub hard_limited: bool,
    /// Whether G was the binding limit: it allowed fewer hits than the
    /// tiers would have granted, and no more than H allowed.
    pub global_limited: bool,
    /// Whether the grant ignored the limits (SPEC §4 `ignore_configured`);
    /// in JSON only when set.
    #[serde(skip_serializing_if = "crate::wire::is_false")]
    pub ignored: bool,
    /// The reply context every rate-like kind shares (SPEC §10), flattened
    /// into the same JSON object.
    #[serde(flatten)]
    pub context: TierContext,
}

/// One leg of a request's way through the tiers: `take` hits in tier `tier`,
/// entering it first if `enter`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Step {
    tier: usize,
    take: u64,
    enter: bool,
}

/// Decides a request for one (resource, domain) pair at `now` and applies
/// it, without the reply context ([`super::decide_op`] adds it): `state` is the pair's state, `global` the resource's hits in the last
/// second across all domains. A rejected request changes nothing but what
/// time alone makes irrelevant (rule 5).
///
/// A grant that would take the domain's or all domains' hits in the last
/// second beyond [`crate::MAX_COUNT`] is a client error (see
/// [`crate::bound`]), and changes no more than a rejection. Every other
/// count stays within these: a tier's hits are some of the domain's hits in
/// its window, at most its limit (configured limits are at most
/// `MAX_COUNT`), or, for the unbounded tier of an unconfigured resource
/// (window one second), at most the domain's hits in the last second.
pub(super) fn grant(
    limits: RateLimits<'_>,
    state: &mut RateState,
    global: &mut HitLog,
    now: Millis,
    amount: Amount,
    enforcement: Enforcement,
) -> Result<RateReply, ClientError> {
    let tiers = limits.tiers;
    // A clock that stepped back must not put recorded hits in the future.
    let now = now.max(state.latest()).max(global.latest().unwrap_or(0));
    state.advance(tiers, now);
    global.prune(now, SECOND);
    let current = state.current_tier(tiers, now);

    let mut steps = Steps::default();
    let through_tiers = plan(tiers, state, current, now, amount.copies(), |s| {
        steps.push(s);
    });
    let wish = amount.copies().min(through_tiers);
    let hard_room = room(limits.hard_limit, state.last_second.count());
    let global_room = room(limits.global_limit, global.count());
    // "Limited by" names the binding limit: the tighter of H and G, when it
    // allowed fewer hits than the tiers would have granted (both on a tie).
    let hard_limited = hard_room < wish && hard_room <= global_room;
    let global_limited = global_room < wish && global_room <= hard_room;

    let (granted, recorded_in_tiers) = match enforcement {
        Enforcement::Enforce => match amount.grant_within(wish.min(hard_room).min(global_room)) {
            Some(n) => (n, n),
            None => (0, 0),
        },
        // Ignored limits grant everything; the tiers take what they can so
        // that limiting resumes from a true state when the switch is off.
        Enforcement::Ignore => (amount.copies(), wish),
    };

    if granted > 0 {
        bound::check(Kept::DomainHits, state.last_second.count(), granted)?;
        bound::check(Kept::ResourceHits, global.count(), granted)?;
    }

    let mut tier = current;
    let mut burst = false;
    if granted > 0 {
        let mut left = recorded_in_tiers;
        for step in steps.iter() {
            if left == 0 {
                break;
            }
            let take = step.take.min(left);
            let ts = state.tier_mut(step.tier);
            if step.enter {
                ts.entered = Some(now);
                ts.hits.clear();
                burst = true;
            }
            ts.hits.record(now, take);
            left -= take;
            tier = step.tier;
        }
        state.last_second.record(now, granted);
        global.record(now, granted);
    }

    Ok(RateReply {
        granted,
        hard_limit: limits.hard_limit,
        global_limit: limits.global_limit,
        tier_limit: if tier == 0 { 0 } else { tiers[tier - 1].limit },
        domain_hits_last_second: state.last_second.count(),
        global_hits_last_second: global.count(),
        tier_hits: state.tier_hits(tier),
        tier,
        burst,
        hard_limited,
        global_limited,
        ignored: enforcement == Enforcement::Ignore,
        context: TierContext::default(),
    })
}

pub(super) fn room(limit: Option<u64>, used: u64) -> u64 {
    limit.map_or(UNBOUNDED, |l| l.saturating_sub(used))
}

/// The way `want` hits, granted one after another at `now`, would go
/// through the tiers (rule 4), each leg given to `step` in order, and how
/// many of them would be granted.
pub(super) fn plan(
    tiers: &[Tier],
    state: &RateState,
    current: usize,
    now: Millis,
    want: u64,
    mut step: impl FnMut(Step),
) -> u64 {
    let mut total = 0u64;
    let mut at = current;
    if at >= 1 {
        let room = tiers[at - 1].limit.saturating_sub(state.tier_hits(at));
        let take = room.min(want);
        if take > 0 {
            step(Step {
                tier: at,
                take,
                enter: false,
            });
            total += take;
        }
    }
    while total < want {
        let Some(j) = burst_target(tiers, state, at, now) else {
            break;
        };
        let take = tiers[j - 1].limit.min(want - total);
        step(Step {
            tier: j,
            take,
            enter: true,
        });
        total += take;
        at = j;
    }
    total
}

/// The legs of a plan: one without an allocation (the usual request, in
/// the current tier or bursting into the next), more in a vector.
#[derive(Default)]
struct Steps {
    first: Option<Step>,
    more: Vec<Step>,
}

impl Steps {
    fn push(&mut self, step: Step) {
        if self.first.is_none() {
            self.first = Some(step);
        } else {
            self.more.push(step);
        }
    }

    fn iter(&self) -> impl Iterator<Item = Step> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}

/// The tier a hit that does not fit in tier `from` bursts into, if any:
/// the first tier above `from` that can be entered, going past tiers in
/// cooldown or with a limit of zero only when they are skippable.
fn burst_target(tiers: &[Tier], state: &RateState, from: usize, now: Millis) -> Option<usize> {
    for j in from + 1..=tiers.len() {
        let tier = &tiers[j - 1];
        let blocked = tier.limit == 0 || state.phase(tiers, j, now) == Phase::Cooldown;
        if !blocked {
            return Some(j);
        }
        if !tier.skippable {
            return None;
        }
    }
    None
}
