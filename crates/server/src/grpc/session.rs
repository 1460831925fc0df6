//! The `Session` stream: the session of SPEC §3.
//!
//! Each stream gets a driver task that reads operations and a copy lane
//! that owns the limiter's [`Session`] (its hold set). Rate requests,
//! charges and refunds need no hold set and run concurrently; copy
//! operations run one after another in the order they arrived, so a client
//! may pipeline a reserve and the release of its copies. Every reply echoes
//! its operation's id; replies may come out of order.
//!
//! A rate request (charge, refund) is decided by the driver itself when
//! that needs no waiting (the in-memory store never waits): its reply is
//! queued at once, without a task of its own, which is most of what a
//! pipelined decision costs besides the decision. One that would wait (a
//! store round trip) goes on in a task of its own, so no reply ever waits
//! for an unrelated slow operation, and the driver reads on.
//!
//! Back-pressure: at most `session_concurrency` operations of a stream are
//! in flight (read and not yet answered, whichever their kind); the driver
//! reads no further until one is answered, and a client that does not read
//! its replies stops the lane, hence the driver. What the client sends
//! meanwhile waits in the stream's HTTP/2 window (see `STREAM_WINDOW` in
//! the crate root), never in an unbounded queue. A reserve waiting for a
//! copy (SPEC §14) stops counting once it is parked in its resource's
//! queue, which `queue_limit` bounds: the release that would serve it
//! must still get through.
//!
//! The stream ends when the client closes it, when the connection breaks
//! or stops answering keep-alive pings, or at shutdown; then the lane
//! finishes what it was given and ends the session, releasing every hold.
//! A message that cannot be read (SPEC §5: a client error) ends it too,
//! once every operation before it is answered, with that error's status
//! (`INVALID_ARGUMENT`, or `RESOURCE_EXHAUSTED` over the size limit, class
//! client) rather than OK, so the client knows why.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use charon_core::copy::Hold;
use charon_limiter::{LimitError, Session};
use charon_proto::v1;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::{Instrument, debug, warn};

use super::{observed_charge, observed_request, ops, status};
use crate::ServerState;
use crate::api_auth::{self, Caller};
use crate::events::{Count, Event, EventOutcome};
use crate::metrics::{self, Outcome};
use crate::observe::{Decision, error_outcome};

type Out = mpsc::Sender<Result<v1::SessionReply, Status>>;

/// Starts driving a session stream; returns the stream of replies.
pub(super) fn start(
    state: Arc<ServerState>,
    caller: Caller,
    inbound: Streaming<v1::SessionRequest>,
) -> ReceiverStream<Result<v1::SessionReply, Status>> {
    let (tx, rx) = mpsc::channel(state.options.session_concurrency * 2);
    tokio::spawn(drive(state, caller, inbound, tx));
    ReceiverStream::new(rx)
}

async fn drive(
    state: Arc<ServerState>,
    caller: Caller,
    mut inbound: Streaming<v1::SessionRequest>,
    tx: Out,
) {
    let _live = state.shutdown.session_guard();
    metrics::sessions_open(1.0);
    let bound = state.options.session_concurrency.max(1);
    let (lane_tx, lane_rx) = mpsc::channel(bound);
    let lane = tokio::spawn(copy_lane(state.clone(), lane_rx, tx.clone()));
    // One permit per operation in flight, given back once its reply is
    // queued.
    let in_flight = Arc::new(Semaphore::new(bound));
    let shutdown = state.shutdown.clone();
    let mut refused = None;
    loop {
        let permit = tokio::select! {
            p = in_flight.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.wait() => break,
            () = tx.closed() => break,
        };
        let next = tokio::select! {
            m = inbound.message() => m,
            () = shutdown.wait() => break,
            () = tx.closed() => break,
        };
        let message = match next {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                refused = refusal(e);
                break;
            }
        };
        let id = message.id;
        if let Some(why) = message.op.as_ref().and_then(|op| forbidden(&caller, op)) {
            let _ = tx
                .send(Ok(reply(id, Reply::Error(api_auth::denied_error(why)))))
                .await;
            continue;
        }
        match message.op {
            None => {
                let e = LimitError::Client(charon_core::ClientError::invalid(
                    "a session message needs an operation",
                ));
                let _ = tx
                    .send(Ok(reply(id, Reply::Error(status::to_error(&e)))))
                    .await;
            }
            Some(Op::Request(req)) => {
                let state = state.clone();
                answer(&tx, id, permit, async move {
                    match observed_request(&state, &req).await {
                        Ok(r) => Reply::Request(r),
                        Err(e) => Reply::Error(status::to_error(&e)),
                    }
                });
            }
            Some(Op::Charge(req)) => spawn_charge(&state, &tx, id, req, false, permit),
            Some(Op::Refund(req)) => spawn_charge(&state, &tx, id, req, true, permit),
            Some(op) => {
                if lane_tx.send((id, op, permit)).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(lane_tx);
    let _ = lane.await;
    if let Some(status) = refused {
        // Every operation read before the bad message is answered first.
        let all = u32::try_from(bound).unwrap_or(u32::MAX);
        tokio::select! {
            _ = in_flight.acquire_many(all) => {
                let _ = tx.send(Err(status)).await;
            }
            () = shutdown.wait() => {}
            () = tx.closed() => {}
        }
    }
    metrics::sessions_open(-1.0);
}

/// Why `caller` may not run `op`, if it may not: the namespace of the
/// resource it names. A seize names a transfer, not a resource: its id is
/// the capability the transferring client (who needed the right to the
/// resource) handed over, so it is not checked here.
fn forbidden(caller: &Caller, op: &Op) -> Option<String> {
    let resource = match op {
        Op::Request(r) => &r.resource,
        Op::Charge(r) | Op::Refund(r) => &r.resource,
        Op::Reserve(r) => &r.resource,
        Op::Release(r) => &r.resource,
        Op::Transfer(r) => &r.resource,
        Op::Seize(_) => return None,
    };
    api_auth::refusal(caller, resource)
}

/// The status ending a stream whose next message could not be read, or
/// `None` if the stream itself broke (the client is gone; nobody would
/// read a status). Transport failures carry their HTTP/2 error as source;
/// what tonic or the codec refused in the bytes does not.
fn refusal(e: Status) -> Option<Status> {
    if std::error::Error::source(&e).is_some() {
        debug!(status = %e, "session stream broke");
        return None;
    }
    let status = status::inbound(e);
    debug!(status = %status, "session refused a message");
    Some(status)
}

fn reply(id: u64, result: Reply) -> v1::SessionReply {
    v1::SessionReply {
        id,
        result: Some(result),
    }
}

/// Answers a charge or refund (`refund`) concurrently, as rate requests
/// are: neither needs the session's hold set.
fn spawn_charge(
    state: &Arc<ServerState>,
    tx: &Out,
    id: u64,
    req: v1::ChargeRequest,
    refund: bool,
    permit: OwnedSemaphorePermit,
) {
    let state = state.clone();
    answer(tx, id, permit, async move {
        match observed_charge(&state, &req, refund).await {
            Ok(r) if refund => Reply::Refund(r),
            Ok(r) => Reply::Charge(r),
            Err(e) => Reply::Error(status::to_error(&e)),
        }
    });
}

/// Answers operation `id` with what `decide` comes to, giving its place in
/// flight (`permit`) back once the reply is queued. `decide` is polled once
/// here: if it is done (nothing to wait for) and the reply queue has room,
/// the reply is queued at once; otherwise a task finishes it, so the driver
/// never waits for it. Polling it with a no-op waker is sound: a task polls
/// it again at once, and a future registers the waker of its latest poll.
fn answer<F>(tx: &Out, id: u64, permit: OwnedSemaphorePermit, decide: F)
where
    F: Future<Output = Reply> + Send + 'static,
{
    let mut decide = Box::pin(decide);
    let polled = decide
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
    let tx = tx.clone();
    match polled {
        Poll::Ready(result) => match tx.try_send(Ok(reply(id, result))) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => drop(permit),
            Err(mpsc::error::TrySendError::Full(r)) => {
                tokio::spawn(async move {
                    let _ = tx.send(r).await;
                    drop(permit);
                });
            }
        },
        Poll::Pending => {
            tokio::spawn(async move {
                let result = decide.await;
                let _ = tx.send(Ok(reply(id, result))).await;
                drop(permit);
            });
        }
    }
}

/// Runs copy operations in order on the session, then ends it.
async fn copy_lane(
    state: Arc<ServerState>,
    mut ops: mpsc::Receiver<(u64, Op, OwnedSemaphorePermit)>,
    tx: Out,
) {
    let mut session = state.limiter.session();
    while let Some((id, op, permit)) = ops.recv().await {
        // A reserve that may wait joins its queue here, in order; its wait
        // goes on in a task of its own, so that the session's other copy
        // operations (the release that frees a copy, say) go on meanwhile.
        let op = match op {
            Op::Reserve(req) if req.wait_ms.is_some_and(|w| w > 0) => {
                let started = Instant::now();
                match ops::reserve::join(&mut session, &req).await {
                    Ok(ops::reserve::Joined::Waiting(waiter)) => {
                        // Parked in the store's queue (bounded by its
                        // queue_limit), it no longer counts as in flight:
                        // else a session with as many waiters as its
                        // session_concurrency could not send the release
                        // that would serve them.
                        drop(permit);
                        let (state, tx) = (state.clone(), tx.clone());
                        tokio::spawn(async move {
                            let gone = async {
                                tokio::select! {
                                    () = tx.closed() => {}
                                    () = state.shutdown.wait() => {}
                                }
                            };
                            let r = ops::reserve::finish(&waiter, &req, gone).await;
                            let result = waited_reply(&state, &req, r, started);
                            let _ = tx.send(Ok(reply(id, result))).await;
                        });
                        continue;
                    }
                    Ok(ops::reserve::Joined::Now(r)) => {
                        let result = waited_reply(&state, &req, Ok(r), started);
                        let _ = tx.send(Ok(reply(id, result))).await;
                        drop(permit);
                        continue;
                    }
                    Err(e) => {
                        let result = waited_reply(&state, &req, Err(e), started);
                        let _ = tx.send(Ok(reply(id, result))).await;
                        drop(permit);
                        continue;
                    }
                }
            }
            op => op,
        };
        let before = session.held_copies();
        let decision = copy_decision(&state, &op);
        let span = decision.span().clone();
        // A reserve waiting for copies leaves the queue when the client
        // goes away or the server shuts down.
        let gone = async {
            tokio::select! {
                () = tx.closed() => {}
                () = state.shutdown.wait() => {}
            }
        };
        let result = copy_op(&state, &mut session, op, decision, gone)
            .instrument(span)
            .await;
        metrics::copies_held(session.held_copies() as i64 - before as i64);
        // A client that went away still has its operations applied; their
        // holds are released below with the rest.
        let _ = tx.send(Ok(reply(id, result))).await;
        drop(permit);
    }
    let held = session.held_copies();
    metrics::copies_held(-(held as i64));
    match session.end().await {
        Ok(released) => debug!(released, "session ended"),
        Err((e, left)) => {
            warn!(error = %e, holds = left.len(), "could not release a session's holds; retrying in the background");
            tokio::spawn(retry_releases(state, left));
        }
    }
}

/// Runs one copy operation (inside the span of its `decision`, which it
/// ends) and counts it.
async fn copy_op(
    state: &ServerState,
    session: &mut Session,
    op: Op,
    decision: Decision<'_>,
    gone: impl Future<Output = ()>,
) -> Reply {
    if let Err(e) = state.check_configured() {
        // Counted as an operation of the session, its kind unread; its
        // decision's span ends without an outcome.
        let outcome = error_outcome(&e);
        Decision::unspanned(state, "session").end("", outcome, None, |now| {
            Event::new(now, "session", "", "", outcome.into())
        });
        return Reply::Error(status::to_error(&e));
    }
    let (resource, domain, asked, result) = match op {
        Op::Reserve(req) => {
            let r = ops::reserve::run(session, &req, gone)
                .await
                .map(Reply::Reserve);
            let asked = req.copies.unwrap_or(1);
            (req.resource, req.domain, asked, r)
        }
        Op::Release(req) => {
            let (resource, domain, asked) = (req.resource.clone(), req.domain.clone(), req.copies);
            let r = ops::release::run(session, req).await.map(Reply::Release);
            (resource, domain, asked, r)
        }
        Op::Transfer(req) => {
            let (resource, domain, asked) = (req.resource.clone(), req.domain.clone(), req.copies);
            let r = ops::transfer::run(session, req).await.map(Reply::Transfer);
            (resource, domain, asked, r)
        }
        Op::Seize(req) => {
            let r = ops::seize::run(session, &req).await;
            let (resource, domain, copies) = r.as_ref().map_or_else(
                |_| (String::new(), String::new(), 1),
                |s| (s.resource.clone(), s.domain.clone(), s.copies),
            );
            (resource, domain, copies, r.map(Reply::Seize))
        }
        // The driver runs rate requests itself; should one get here, it is
        // still answered correctly.
        Op::Request(req) => {
            let r = ops::request::run(&state.limiter, &req)
                .await
                .map(Reply::Request);
            let asked = req.copies.unwrap_or(1);
            (req.resource, req.domain, asked, r)
        }
        // The driver runs charges and refunds itself too.
        Op::Charge(req) => {
            let r = ops::charge::run(&state.limiter, &req, false)
                .await
                .map(Reply::Charge);
            (req.resource, req.domain, req.copies, r)
        }
        Op::Refund(req) => {
            let r = ops::charge::run(&state.limiter, &req, true)
                .await
                .map(Reply::Refund);
            (req.resource, req.domain, req.copies, r)
        }
    };
    let (outcome, reply) = match result {
        Ok(Reply::Reserve(r)) => (Outcome::of_grant(r.granted, asked), Reply::Reserve(r)),
        Ok(Reply::Request(r)) => (Outcome::of_grant(r.granted, asked), Reply::Request(r)),
        Ok(reply) => (Outcome::Granted, reply),
        Err(e) => (error_outcome(&e), Reply::Error(status::to_error(&e))),
    };
    let operation = decision.operation();
    if operation == "seize" {
        decision.learned_resource(&resource);
    }
    let granted = match &reply {
        Reply::Reserve(r) => Some(r.granted),
        Reply::Request(r) => Some(r.granted),
        _ => None,
    };
    decision.end(&resource, outcome, granted, |now| {
        copy_event(now, operation, &resource, &domain, asked, outcome, &reply)
    });
    reply
}

/// The reply to a reserve that was allowed to wait, recorded as
/// [`copy_op`] records one.
fn waited_reply(
    state: &ServerState,
    req: &v1::ReserveRequest,
    result: Result<v1::ReserveReply, LimitError>,
    started: Instant,
) -> Reply {
    // A reserve that waited is observed without a decision span.
    let decision = Decision::unspanned(state, "reserve").since(started);
    let asked = req.copies.unwrap_or(1);
    let (outcome, reply) = match result {
        Ok(r) => {
            let label =
                metrics::resource_label(&state.limiter.config(), &req.resource, Outcome::Granted);
            metrics::copy_wait(label, &r);
            metrics::copies_held(i64::try_from(r.granted).unwrap_or(i64::MAX));
            (Outcome::of_grant(r.granted, asked), Reply::Reserve(r))
        }
        Err(e) => (error_outcome(&e), Reply::Error(status::to_error(&e))),
    };
    decision.end(&req.resource, outcome, None, |now| {
        copy_event(
            now,
            "reserve",
            &req.resource,
            &req.domain,
            asked,
            outcome,
            &reply,
        )
    });
    reply
}

/// The decision of a copy operation, with its span (a seize learns its
/// resource from the store: recorded once known).
fn copy_decision<'s>(state: &'s ServerState, op: &Op) -> Decision<'s> {
    let (operation, resource, domain) = match op {
        Op::Reserve(r) => ("reserve", r.resource.as_str(), r.domain.as_str()),
        Op::Release(r) => ("release", r.resource.as_str(), r.domain.as_str()),
        Op::Transfer(r) => ("transfer", r.resource.as_str(), r.domain.as_str()),
        Op::Seize(_) => ("seize", "", ""),
        Op::Request(r) => ("request", r.resource.as_str(), r.domain.as_str()),
        Op::Charge(r) => ("charge", r.resource.as_str(), r.domain.as_str()),
        Op::Refund(r) => ("refund", r.resource.as_str(), r.domain.as_str()),
    };
    Decision::start(state, operation, resource, domain)
}

/// The event of a copy operation (or of a rate operation the lane ran).
fn copy_event(
    now: u64,
    operation: &'static str,
    resource: &str,
    domain: &str,
    asked: u64,
    outcome: Outcome,
    reply: &Reply,
) -> Event {
    let mut e = Event::new(now, operation, resource, domain, outcome.into());
    e.requested = Some(Count::Whole(asked));
    let (granted, held) = match reply {
        Reply::Reserve(r) => (Some(r.granted), Some(r.domain_holds)),
        Reply::Release(r) => (Some(r.released), Some(r.domain_holds)),
        Reply::Transfer(r) => (Some(r.copies), None),
        Reply::Seize(r) => (Some(r.copies), None),
        Reply::Request(r) | Reply::Charge(r) | Reply::Refund(r) => {
            e.tier = (r.tier > 0).then_some(r.tier);
            e.remaining = r.remaining;
            e.delay_ms = r.delay_ms.filter(|&d| d > 0);
            if operation == "request" {
                e.outcome = EventOutcome::of_grant(r.granted, asked, r.delay_ms);
            }
            (Some(r.granted), None)
        }
        Reply::Error(_) => (None, None),
    };
    e.granted = granted.map(Count::Whole);
    e.held = held;
    e
}

/// Keeps trying to release holds a session could not give back when it
/// ended (its store was unreachable), for up to ten minutes.
async fn retry_releases(state: Arc<ServerState>, mut left: Vec<(Hold, u64)>) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut still = Vec::new();
        for (hold, n) in left {
            if state.limiter.release_ended(&hold, n).await.is_err() {
                still.push((hold, n));
            }
        }
        left = still;
    }
    if !left.is_empty() {
        warn!(
            holds = left.len(),
            "gave up releasing holds of an ended session"
        );
        state.limiter.abandon_ended(&left);
    }
}
