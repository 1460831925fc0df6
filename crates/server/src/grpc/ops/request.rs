use charon_core::meter::Reply;
use charon_core::rate::RateReply;
use charon_limiter::{Decision, LimitError, Limiter, RequestOptions};
use charon_proto::v1;

use super::{amount, limit};

pub async fn run(limiter: &Limiter, req: &v1::RateRequest) -> Result<v1::RateReply, LimitError> {
    let amount = amount(req.copies, req.min_copies)?;
    let options = RequestOptions {
        dry_run: req.dry_run,
    };
    let decision = limiter
        .decide(&req.resource, &req.domain, amount, options)
        .await?;
    Ok(decision_to_proto(&decision))
}

/// Either family of reply in the one `RateReply` message: the tiers' fields
/// (2–11) with the reply context (13–18), or the reply context (13–19)
/// alone, the tiers' fields left unset.
pub fn decision_to_proto(d: &Decision) -> v1::RateReply {
    match d {
        Decision::Tiers(r) => to_proto(r),
        Decision::Meter { reply, ignored } => meter_to_proto(reply, *ignored),
    }
}

pub fn to_proto(r: &RateReply) -> v1::RateReply {
    v1::RateReply {
        granted: r.granted,
        hard_limit: r.hard_limit,
        global_limit: r.global_limit,
        tier_limit: limit(r.tier_limit),
        domain_hits_last_second: r.domain_hits_last_second,
        global_hits_last_second: r.global_hits_last_second,
        tier_hits: r.tier_hits,
        tier: u32::try_from(r.tier).unwrap_or(u32::MAX),
        burst: r.burst,
        hard_limited: r.hard_limited,
        global_limited: r.global_limited,
        ignored: r.ignored,
        // Unset when unbounded (the permissive tier of allow_unconfigured).
        limit: limit(r.context.limit),
        remaining: limit(r.context.remaining),
        // Unset: never (a tier above the first with an infinite active
        // period, once entered).
        reset_after_ms: r.context.reset_after_ms,
        retry_after_ms: r.context.retry_after_ms,
        warning: r.context.warning,
        banned: r.context.banned,
        delay_ms: None,
    }
}

fn meter_to_proto(r: &Reply, ignored: bool) -> v1::RateReply {
    v1::RateReply {
        granted: r.granted,
        ignored,
        limit: Some(r.limit),
        remaining: Some(r.remaining),
        reset_after_ms: Some(r.reset_after_ms),
        retry_after_ms: r.retry_after_ms,
        warning: r.warning,
        banned: r.banned,
        delay_ms: r.delay_ms,
        ..Default::default()
    }
}
