use charon_limiter::{LimitError, Session};
use charon_proto::v1;

use super::hold;

pub async fn run(
    session: &mut Session,
    req: v1::TransferRequest,
) -> Result<v1::TransferReply, LimitError> {
    let copies = req.copies;
    let ttl = req.ttl_ms;
    let hold = hold(req.resource, req.domain, req.groups)?;
    let transfer_id = session.transfer(&hold, copies, ttl).await?;
    Ok(v1::TransferReply {
        transfer_id,
        copies,
    })
}
