use charon_core::rate::RateReply;
use charon_limiter::{LimitError, Limiter};
use charon_proto::v1;

use super::{amount, limit};

pub async fn run(limiter: &Limiter, req: &v1::RateRequest) -> Result<v1::RateReply, LimitError> {
    let amount = amount(req.copies, req.min_copies)?;
    let reply = limiter.request(&req.resource, &req.domain, amount).await?;
    Ok(to_proto(&reply))
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
    }
}
