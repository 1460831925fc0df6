//! The arguments of the decision scripts: limits, enforcement and tiers as
//! the Lua scripts read them, and the reading of their replies.

use charon_core::bound::{self, Kept};
use charon_core::config::{Enforcement, RateLimits};
use charon_core::meter::{Ban, Op, Policy, SoftLimit, no_refund};
use charon_core::rate::{DORMANT_GRACE, RateReply, TierContext};
use charon_core::request::positive_count;
use charon_core::{MAX_COUNT, UNBOUNDED};

use super::keys::RateKeys;
use super::reply::{Reply, bad};
use crate::StoreError;

/// A limit as the scripts take it: -1 for unbounded (anything Lua numbers
/// could not hold exactly is beyond every count anyway).
pub(super) fn limit_arg(limit: u64) -> String {
    if limit > MAX_COUNT {
        "-1".to_owned()
    } else {
        limit.to_string()
    }
}

pub(super) fn optional_limit_arg(limit: Option<u64>) -> String {
    limit.map_or_else(String::new, limit_arg)
}

pub(super) fn enforce_arg(e: Enforcement) -> String {
    match e {
        Enforcement::Enforce => "1",
        Enforcement::Ignore => "0",
    }
    .to_owned()
}

/// The arguments of one tiers operation after the clock and the expiry
/// slack (see `lua/rate.lua`, from `ARGV[3]`); a refund, or a charge of 0,
/// is core's client error, found before the call.
pub(super) fn tiers_args(
    k: &RateKeys,
    limits: RateLimits<'_>,
    policy: Policy,
    op: Op,
    enforcement: Enforcement,
) -> Result<Vec<String>, StoreError> {
    match op {
        Op::Charge(n) => {
            positive_count("copies", n).map_err(StoreError::Refused)?;
        }
        Op::Refund(_) => return Err(StoreError::Refused(no_refund())),
        Op::Request { .. } => {}
    }
    let (op_arg, copies, min_copies) = op_args(op);
    let tiers = limits.tiers;
    let mut args = Vec::with_capacity(12 + 5 * tiers.len());
    args.push(DORMANT_GRACE.to_string());
    args.push(copies.to_string());
    args.push(min_copies.to_string());
    args.push(enforce_arg(enforcement));
    args.push(optional_limit_arg(limits.hard_limit));
    args.push(optional_limit_arg(limits.global_limit));
    args.push(tiers.len().to_string());
    args.push(k.tier_head.clone());
    args.push(k.tier_tail.clone());
    args.push(op_arg.to_owned());
    args.push(
        policy
            .soft_limit
            .map_or(0, SoftLimit::as_percent)
            .to_string(),
    );
    args.push(policy.ban.map_or(0, Ban::duration).to_string());
    for t in tiers {
        args.push(limit_arg(t.limit));
        args.push(t.window.to_string());
        args.push(t.active.map_or_else(|| "-1".to_owned(), |a| a.to_string()));
        args.push(t.cooldown.to_string());
        args.push(if t.skippable { "1" } else { "0" }.to_owned());
    }
    Ok(args)
}

/// The keys of one tiers operation, in the order `lua/rate.lua` takes
/// them: the state, the last seconds, then one list per configured tier.
pub(super) fn tiers_keys(k: &RateKeys, limits: RateLimits<'_>) -> Vec<String> {
    let mut keys = Vec::with_capacity(4 + limits.tiers.len());
    keys.extend([
        k.state.clone(),
        k.last_second.clone(),
        k.global.clone(),
        k.global_total.clone(),
    ]);
    keys.extend((1..=limits.tiers.len()).map(|i| k.tier(i)));
    keys
}

/// The client error of an `over` reply (after its status): the count a
/// grant would have taken past `MAX_COUNT`.
pub(super) fn over(r: &mut Reply) -> Result<StoreError, StoreError> {
    let which = r.text()?;
    let held = r.count()?;
    let n = r.count()?;
    let count = match which.as_str() {
        "d" => Kept::DomainHits,
        "g" => Kept::ResourceHits,
        "t" => Kept::TierHits,
        other => return Err(bad("rate", &format!("unknown count {other:?}"))),
    };
    Ok(StoreError::Refused(bound::refusal(count, held, n)))
}

/// The 13 values of one tiers operation's reply, as core's reply.
pub(super) fn tiers_fields(
    r: &mut Reply,
    limits: RateLimits<'_>,
    enforcement: Enforcement,
) -> Result<RateReply, StoreError> {
    let tiers = limits.tiers;
    let granted = r.count()?;
    let domain_hits_last_second = r.count()?;
    let global_hits_last_second = r.count()?;
    let tier_hits = r.count()?;
    let tier = usize::try_from(r.count()?).unwrap_or(usize::MAX);
    if tier > tiers.len() {
        return Err(bad("rate", &format!("tier {tier} of {}", tiers.len())));
    }
    let burst = r.flag()?;
    let hard_limited = r.flag()?;
    let global_limited = r.flag()?;
    // -1 stands for unbounded (remaining) or never (the waits).
    let remaining = u64::try_from(r.int()?).unwrap_or(UNBOUNDED);
    let reset_after_ms = u64::try_from(r.int()?).ok();
    let retry_after_ms = u64::try_from(r.int()?).ok();
    let warning = r.flag()?;
    let banned = r.flag()?;
    // The context's limit is the current tier's after the operation;
    // for a dry run that is where the hits would have gone.
    let tier_limit = tier
        .checked_sub(1)
        .and_then(|i| tiers.get(i))
        .map_or(0, |t| t.limit);
    Ok(RateReply {
        granted,
        hard_limit: limits.hard_limit,
        global_limit: limits.global_limit,
        tier_limit,
        domain_hits_last_second,
        global_hits_last_second,
        tier_hits,
        tier,
        burst,
        hard_limited,
        global_limited,
        ignored: enforcement == Enforcement::Ignore,
        context: TierContext {
            limit: tier_limit,
            remaining,
            reset_after_ms,
            retry_after_ms,
            warning,
            banned,
        },
    })
}

/// An operation as the scripts read it: its code (`r` request, `d` dry
/// run, `c` charge, `f` refund), how many and the least to grant. One
/// encoding for the meter scripts and the tiers' `rate_step`.
pub(crate) fn op_args(op: Op) -> (&'static str, u64, u64) {
    match op {
        Op::Request {
            amount,
            dry_run: false,
        } => ("r", amount.copies(), amount.min_copies()),
        Op::Request {
            amount,
            dry_run: true,
        } => ("d", amount.copies(), amount.min_copies()),
        Op::Charge(n) => ("c", n, 1),
        Op::Refund(n) => ("f", n, 1),
    }
}
