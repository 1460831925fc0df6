use charon_core::ClientError;
use charon_limiter::{LimitError, Session};
use charon_proto::v1;

use super::{amount, limit};

/// A reserve; with `wait_ms` it may wait for copies (SPEC §14) until
/// `gone` (the client left): then it has left the queue and the reply is
/// an error nobody reads.
pub async fn run(
    session: &mut Session,
    req: &v1::ReserveRequest,
    gone: impl Future<Output = ()>,
) -> Result<v1::ReserveReply, LimitError> {
    let amount = amount(req.copies, req.min_copies)?;
    let wait_ms = req.wait_ms.unwrap_or(0);
    let r = session
        .reserve_waiting(&req.resource, &req.domain, amount, wait_ms, gone)
        .await?
        .ok_or_else(|| ClientError::invalid("the session ended while the reserve waited"))?;
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
        queue_full: r.queue_full,
        result_ready: r.result_ready,
        waited_ms: r.waited_ms,
    })
}
