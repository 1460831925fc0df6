use charon_limiter::{LimitError, Session};
use charon_proto::v1;

use super::hold;

pub async fn run(
    session: &mut Session,
    req: v1::ReleaseRequest,
) -> Result<v1::ReleaseReply, LimitError> {
    let copies = req.copies;
    let ready = req.result_ready;
    let hold = hold(req.resource, req.domain, req.groups)?;
    let status = session.release_ready(&hold, copies, ready).await?;
    Ok(v1::ReleaseReply {
        released: copies,
        domain_holds: status.domain_holds,
        global_holds: status.global_holds,
        groups: status
            .groups
            .into_iter()
            .map(|(name, holds)| v1::GroupHolds {
                name,
                limit: None,
                holds,
            })
            .collect(),
    })
}
