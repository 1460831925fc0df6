use charon_core::config::namespace_of;
use charon_limiter::{LimitError, Session};
use charon_proto::v1;

pub async fn run(
    session: &mut Session,
    req: &v1::SeizeRequest,
) -> Result<v1::SeizeReply, LimitError> {
    let staged = session.seize(&req.transfer_id).await?;
    Ok(v1::SeizeReply {
        namespace: namespace_of(&staged.hold.resource).to_owned(),
        resource: staged.hold.resource,
        domain: staged.hold.domain,
        groups: staged.hold.groups,
        copies: staged.copies,
    })
}
