use charon_limiter::{LimitError, Session};
use charon_proto::v1;

use super::{amount, limit};

pub async fn run(
    session: &mut Session,
    req: &v1::ReserveRequest,
) -> Result<v1::ReserveReply, LimitError> {
    let amount = amount(req.copies, req.min_copies)?;
    let r = session.reserve(&req.resource, &req.domain, amount).await?;
    Ok(v1::ReserveReply {
        granted: r.granted,
        domain_limit: limit(r.domain_limit),
        global_limit: r.global_limit,
        domain_holds: r.domain_holds,
        global_holds: r.global_holds,
        groups: r
            .groups
            .iter()
            .map(|g| v1::GroupHolds {
                name: g.name.clone(),
                limit: Some(g.limit),
                holds: g.holds,
            })
            .collect(),
        ignored: r.ignored,
    })
}
