use charon_limiter::{LimitError, Limiter};
use charon_proto::v1;

use super::request::decision_to_proto;

/// `Charge` (`refund = false`) or `Refund`.
pub async fn run(
    limiter: &Limiter,
    req: &v1::ChargeRequest,
    refund: bool,
) -> Result<v1::RateReply, LimitError> {
    let decision = if refund {
        limiter
            .refund(&req.resource, &req.domain, req.copies)
            .await?
    } else {
        limiter
            .charge(&req.resource, &req.domain, req.copies)
            .await?
    };
    Ok(decision_to_proto(&decision))
}
