use charon_core::ClientError;
use charon_core::copy::ReserveReply;
use charon_limiter::{LimitError, Reserved, Session, Waiter};
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
        .ok_or_else(gone_error)?;
    Ok(wire(&r))
}

/// What a reserve that may wait came to when it joined its queue.
pub enum Joined {
    Now(v1::ReserveReply),
    Waiting(Waiter),
}

/// Joins the queue: answered at once, or a waiter to [`finish`].
pub async fn join(session: &mut Session, req: &v1::ReserveRequest) -> Result<Joined, LimitError> {
    let amount = amount(req.copies, req.min_copies)?;
    let wait_ms = req.wait_ms.unwrap_or(0);
    Ok(
        match session
            .join(&req.resource, &req.domain, amount, wait_ms)
            .await?
        {
            Reserved::Now(r) => Joined::Now(wire(&r)),
            Reserved::Waiting(t) => Joined::Waiting(session.waiter(t)),
        },
    )
}

/// Waits for a joined reserve's answer until `gone`.
pub async fn finish(
    waiter: &Waiter,
    req: &v1::ReserveRequest,
    gone: impl Future<Output = ()>,
) -> Result<v1::ReserveReply, LimitError> {
    let wait_ms = req.wait_ms.unwrap_or(0);
    let r = waiter.wait(wait_ms, gone).await?.ok_or_else(gone_error)?;
    Ok(wire(&r))
}

fn gone_error() -> LimitError {
    ClientError::invalid("the session ended while the reserve waited").into()
}

/// A reserve's reply for the wire.
fn wire(r: &ReserveReply) -> v1::ReserveReply {
    v1::ReserveReply {
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
    }
}
