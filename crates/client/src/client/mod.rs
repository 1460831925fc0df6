//! The client: rate requests and copy operations on a shared session
//! stream (rate requests optionally as unary calls), with back-pressure,
//! back-off, degraded mode and the kill switch.

mod bearer;
mod calls;
mod hold;
mod multi;
mod session;
mod status;

pub use bearer::Bearer;
pub(crate) use bearer::Transport;
use calls::Ask;
pub use calls::{RateCall, ReserveCall};
pub use hold::Hold;
pub use multi::{MultiCall, MultiGrant};
use session::SessionConn;
pub(crate) use status::{classify, from_reply_error};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::{debug, warn};

use crate::backoff::next_sleep;
use crate::error::ErrorKind;
use crate::options::RateTransport;
use crate::{ClientOptions, Error};

/// A connection to Charon. Cheap to clone; clones share the connection,
/// the session, the kill switch and the counters.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) grpc: LimiterClient<Transport>,
    /// `charon.v1.Capacity` on the same connection (leases).
    pub(crate) capacity: v1::capacity_client::CapacityClient<Transport>,
    pub(crate) options: ClientOptions,
    /// The live session, if one is open: looked up by every operation, so
    /// a plain lock held for a pointer copy (never across an await).
    session: Mutex<Option<Arc<SessionConn>>>,
    /// Taken to open a session, so that callers finding none open one
    /// between them rather than one each.
    opening: tokio::sync::Mutex<Opening>,
    /// Attempts to open a session so far.
    open_attempts: AtomicU64,
    generation: AtomicU64,
    /// Places in flight ([`ClientOptions::max_in_flight`]).
    in_flight: Semaphore,
    kill_switch: AtomicBool,
    counters: Counters,
    /// Degraded grants are logged, at most one line per
    /// [`DEGRADED_LOG_EVERY`].
    degraded_log: Mutex<DegradedLog>,
}

/// The least time between two log lines about degraded grants: a server
/// that is down must not flood the application's log with one line per
/// request, nor go unnoticed.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

/// When degraded grants were last logged, and how many since.
#[derive(Debug, Default)]
struct DegradedLog {
    last: Option<Instant>,
    unlogged: u64,
}

/// What the last attempt to open a session came to.
#[derive(Debug, Default)]
struct Opening {
    /// Its error, if it failed: callers that waited for it get this rather
    /// than each trying again in turn (a server that does not answer would
    /// otherwise hold every waiting caller for one timeout per caller
    /// before it).
    failed: Option<Error>,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    reserves: AtomicU64,
    rejections: AtomicU64,
    degraded: AtomicU64,
    kill_switched: AtomicU64,
    server_errors: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
}

/// What a client has seen, for the application's own metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rate requests made (each call, not each retry).
    pub requests: u64,
    /// Reserves made (each call, not each retry).
    pub reserves: u64,
    /// Calls that ended rejected.
    pub rejections: u64,
    /// Grants made by the client alone because the server could not answer.
    pub degraded_grants: u64,
    /// Rejections the kill switch turned into grants.
    pub kill_switch_grants: u64,
    /// Server errors and unreachable servers seen.
    pub server_errors: u64,
    /// Operations waiting for an answer right now (at most
    /// [`ClientOptions::max_in_flight`]).
    pub in_flight: u64,
    /// The most operations ever waiting for an answer at once.
    pub peak_in_flight: u64,
}

impl Client {
    /// A client for `options.endpoint`. Connects lazily: a client made
    /// while the server is down works (degraded) and recovers by itself.
    pub fn connect(options: ClientOptions) -> Result<Self, Error> {
        let half = options.keepalive / 2;
        let channel = crate::options::endpoint(&options.endpoint, options.tls.as_ref())?
            .connect_timeout(options.connect_timeout)
            .http2_keep_alive_interval(half)
            .keep_alive_timeout(half)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect_lazy();
        let in_flight = Semaphore::new(options.max_in_flight.clamp(1, Semaphore::MAX_PERMITS));
        let bearer = Bearer::new(options.token.as_ref())?;
        Ok(Self {
            inner: Arc::new(Inner {
                capacity: v1::capacity_client::CapacityClient::with_interceptor(
                    channel.clone(),
                    bearer.clone(),
                ),
                grpc: LimiterClient::with_interceptor(channel, bearer),
                options,
                session: Mutex::new(None),
                opening: tokio::sync::Mutex::new(Opening::default()),
                open_attempts: AtomicU64::new(0),
                generation: AtomicU64::new(0),
                in_flight,
                kill_switch: AtomicBool::new(false),
                counters: Counters::default(),
                degraded_log: Mutex::default(),
            }),
        })
    }

    /// Turns the kill switch on or off. While on, every rejection becomes a
    /// grant of `min_copies`, marked [`Source::KillSwitch`](crate::Source::KillSwitch) (paper §4.3:
    /// try a limiter on live traffic without letting it reject anything).
    pub fn set_kill_switch(&self, on: bool) {
        self.inner.kill_switch.store(on, Ordering::SeqCst);
    }

    /// Whether the kill switch is on.
    pub fn kill_switch(&self) -> bool {
        self.inner.kill_switch.load(Ordering::SeqCst)
    }

    /// What this client has seen so far.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            requests: c.requests.load(Ordering::Relaxed),
            reserves: c.reserves.load(Ordering::Relaxed),
            rejections: c.rejections.load(Ordering::Relaxed),
            degraded_grants: c.degraded.load(Ordering::Relaxed),
            kill_switch_grants: c.kill_switched.load(Ordering::Relaxed),
            server_errors: c.server_errors.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            peak_in_flight: c.peak_in_flight.load(Ordering::Relaxed),
        }
    }

    /// A rate-limited request for `resource` on behalf of `domain`.
    pub fn request(&self, resource: impl Into<String>, domain: impl Into<String>) -> RateCall {
        RateCall {
            client: self.clone(),
            ask: Ask::new(resource.into(), domain.into()),
            dry_run: false,
        }
    }

    /// `charge(resource, domain, copies)` (SPEC §10): records a cost known
    /// only after the work (LLM tokens once the answer is in), never
    /// rejected; a bucket goes into debt that later requests pay back,
    /// burst tiers count the hits in the current tier. Every rate-like
    /// kind. Not degradable: a server error is
    /// returned (the cost could not be recorded), whatever `fail_open` says.
    pub async fn charge(
        &self,
        resource: impl Into<String>,
        domain: impl Into<String>,
        copies: u64,
    ) -> Result<v1::RateReply, Error> {
        self.charge_or_refund(resource.into(), domain.into(), copies, false)
            .await
    }

    /// `refund(resource, domain, copies)` (SPEC §10): gives tokens back to
    /// a bucket (work paid for in advance that did not happen). A client
    /// error on any other kind. Not degradable, as [`Client::charge`].
    pub async fn refund(
        &self,
        resource: impl Into<String>,
        domain: impl Into<String>,
        copies: u64,
    ) -> Result<v1::RateReply, Error> {
        self.charge_or_refund(resource.into(), domain.into(), copies, true)
            .await
    }

    async fn charge_or_refund(
        &self,
        resource: String,
        domain: String,
        copies: u64,
        refund: bool,
    ) -> Result<v1::RateReply, Error> {
        let req = v1::ChargeRequest {
            resource,
            domain,
            copies,
        };
        let reply = match self.inner.options.rate_transport {
            RateTransport::Session => {
                let op = if refund {
                    Op::Refund(req)
                } else {
                    Op::Charge(req)
                };
                match self.session_call(op).await {
                    Ok((Reply::Charge(r) | Reply::Refund(r), _)) => Ok(r),
                    Ok((other, _)) => Err(unexpected(&other)),
                    Err(e) => Err(e),
                }
            }
            RateTransport::Unary => {
                let mut grpc = self.inner.grpc.clone();
                self.unary(async move {
                    if refund {
                        grpc.refund(req).await
                    } else {
                        grpc.charge(req).await
                    }
                })
                .await
            }
        };
        match reply {
            Ok(r) => Ok(r),
            Err(e) => {
                if e.is_server() {
                    self.count(|c| &c.server_errors);
                }
                Err(e)
            }
        }
    }

    /// A reserve of copies of `resource` on behalf of `domain`.
    pub fn reserve(&self, resource: impl Into<String>, domain: impl Into<String>) -> ReserveCall {
        ReserveCall {
            client: self.clone(),
            ask: Ask::new(resource.into(), domain.into()),
            wait: Duration::ZERO,
        }
    }

    /// Takes over copies another client staged with [`Hold::transfer`].
    /// Not possible in degraded mode: an unreachable server is an error.
    pub async fn seize(&self, transfer_id: &str) -> Result<Hold, Error> {
        let op = Op::Seize(v1::SeizeRequest {
            transfer_id: transfer_id.to_owned(),
        });
        let (reply, generation) = self.session_call(op).await?;
        match reply {
            Reply::Seize(s) => Ok(Hold::on_server(
                self.clone(),
                s.resource,
                s.domain,
                s.groups,
                s.copies,
                generation,
                None,
                Duration::ZERO,
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// The pseudo-atomic request of several resources of paper §3.3.
    pub fn multi(&self, domain: impl Into<String>) -> MultiCall {
        MultiCall::new(self.clone(), domain.into())
    }

    /// Sends `op` on the session, opening one if there is none or it broke,
    /// once a place in flight is free. `request_timeout` bounds the whole:
    /// the wait for a place, for the session, and for the reply.
    pub(crate) async fn session_call(&self, op: Op) -> Result<(Reply, u64), Error> {
        self.session_call_waiting(op, Duration::ZERO).await
    }

    /// [`Client::session_call`] for an operation the server may hold for
    /// up to `wait` (a reserve waiting in its queue): the timeout runs
    /// that much longer.
    pub(crate) async fn session_call_waiting(
        &self,
        op: Op,
        wait: Duration,
    ) -> Result<(Reply, u64), Error> {
        let deadline = tokio::time::Instant::now() + self.inner.options.request_timeout + wait;
        let _place = self.place(deadline).await?;
        let session = self.session(deadline).await?;
        let reply = session.call(op, deadline).await?;
        if let Reply::Error(e) = &reply {
            return Err(from_reply_error(e, self.address()));
        }
        Ok((reply, session.generation))
    }

    /// Runs one unary call within a place in flight and `request_timeout`.
    async fn unary<T>(
        &self,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Error> {
        let timeout = self.inner.options.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let _place = self.place(deadline).await?;
        let address = self.address();
        match tokio::time::timeout_at(deadline, call).await {
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("no answer from {address} within {timeout:?}"),
            )),
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.classify(&status, deadline).await),
        }
    }

    /// The server's address, as given (`ClientOptions::endpoint`).
    pub(crate) fn address(&self) -> &str {
        &self.inner.options.endpoint
    }

    /// A failed call's status in the error model; a connection that ended
    /// without a word is looked at once more (`diagnose`), before
    /// `deadline`, so that a certificate or protocol mistake is never taken
    /// for a server that is down.
    pub(crate) async fn classify(
        &self,
        status: &tonic::Status,
        deadline: tokio::time::Instant,
    ) -> Error {
        classify(&self.inner.options, status, deadline).await
    }

    /// Waits, until `deadline`, for one of the
    /// [`ClientOptions::max_in_flight`] places: the back-pressure that keeps
    /// a burst of callers from piling up without bound.
    async fn place(&self, deadline: tokio::time::Instant) -> Result<Place<'_>, Error> {
        let permit = tokio::time::timeout_at(deadline, self.inner.in_flight.acquire())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "no place in flight within {:?} ({} operations already wait for {})",
                        self.inner.options.request_timeout,
                        self.inner.options.max_in_flight,
                        self.address()
                    ),
                )
            })?
            .map_err(|_| Error::new(ErrorKind::Unavailable, "the client is shutting down"))?;
        let c = &self.inner.counters;
        let now = c.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        c.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        Ok(Place {
            _permit: permit,
            in_flight: &c.in_flight,
        })
    }

    /// The live session, if one is open.
    fn live_session(&self) -> Option<Arc<SessionConn>> {
        self.inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    /// The live session, or a new one if there is none or it broke.
    async fn session(&self, deadline: tokio::time::Instant) -> Result<Arc<SessionConn>, Error> {
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        let seen = self.inner.open_attempts.load(Ordering::SeqCst);
        let mut opening = tokio::time::timeout_at(deadline, self.inner.opening.lock())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("no session opened with {} in time", self.address()),
                )
            })?;
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        // Someone tried while this caller waited, and failed.
        if self.inner.open_attempts.load(Ordering::SeqCst) != seen
            && let Some(e) = &opening.failed
        {
            return Err(e.clone());
        }
        self.inner.open_attempts.fetch_add(1, Ordering::SeqCst);
        let generation = self.inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let opened = SessionConn::open(self, generation, deadline).await;
        match opened {
            Ok(session) => {
                let session = Arc::new(session);
                debug!(generation, "session opened");
                opening.failed = None;
                *self
                    .inner
                    .session
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(session.clone());
                Ok(session)
            }
            Err(e) => {
                opening.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Queues `op` on the live session of `generation` without waiting
    /// (see [`SessionConn::send_detached`]); gives it back if that session
    /// is not the live one any more.
    pub(crate) fn send_detached(&self, generation: u64, op: Op) -> Result<(), Op> {
        match self.live_session() {
            Some(s) if s.generation == generation => s.send_detached(op),
            _ => Err(op),
        }
    }

    /// The generation of the live session, if any (holds of older ones are
    /// gone on the server).
    pub(crate) fn live_generation(&self) -> Option<u64> {
        self.live_session().map(|s| s.generation)
    }

    fn count(&self, f: impl Fn(&Counters) -> &AtomicU64) {
        f(&self.inner.counters).fetch_add(1, Ordering::Relaxed);
    }

    /// Degraded mode: a server error becomes a local grant if allowed,
    /// counted and logged (at most one line per [`DEGRADED_LOG_EVERY`]); a
    /// client error never does.
    fn degrade(&self, e: Error) -> Result<(), Error> {
        if e.is_server() {
            self.count(|c| &c.server_errors);
        }
        if !(self.inner.options.fail_open && e.is_server()) {
            return Err(e);
        }
        self.count(|c| &c.degraded);
        let unlogged = {
            let mut log = self
                .inner
                .degraded_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if log.last.is_some_and(|t| t.elapsed() < DEGRADED_LOG_EVERY) {
                log.unlogged += 1;
                None
            } else {
                log.last = Some(Instant::now());
                Some(std::mem::take(&mut log.unlogged))
            }
        };
        if let Some(unlogged) = unlogged {
            warn!(
                error = %e,
                unlogged,
                "degraded grant: the server could not answer, min_copies granted locally \
                 ({unlogged} more degraded grants since the last line; at most one line every {}s)",
                DEGRADED_LOG_EVERY.as_secs()
            );
        }
        Ok(())
    }

    /// Runs `attempt` until it is granted, or the kill switch turns a
    /// rejection into a grant, or `max_wait` runs out (back-off of paper
    /// §3.2 between attempts). A server error ends it at once: it is not
    /// retried on the same server (SPEC §5) and degraded mode may grant.
    async fn until_granted<G, R, Fut>(
        &self,
        max_wait: Duration,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<Ending<G, R>, Error>
    where
        Fut: Future<Output = Result<Answer<G, R>, Error>>,
    {
        let started = Instant::now();
        let mut rejections = 0;
        loop {
            let rejection = match attempt().await {
                Ok(Answer::Granted(g)) => return Ok(Ending::Granted(g)),
                Ok(Answer::Rejected(r)) => r,
                Err(e) => {
                    self.degrade(e)?;
                    return Ok(Ending::Degraded);
                }
            };
            if self.kill_switch() {
                self.count(|c| &c.kill_switched);
                return Ok(Ending::KillSwitch(rejection));
            }
            rejections += 1;
            let unit = rand::random::<f64>();
            match next_sleep(
                self.inner.options.backoff_base,
                rejections,
                max_wait,
                started.elapsed(),
                unit,
            ) {
                Some(d) => tokio::time::sleep(d).await,
                None => {
                    self.count(|c| &c.rejections);
                    return Ok(Ending::Rejected(rejection));
                }
            }
        }
    }
}

/// One of the places in flight, given back (and uncounted) when dropped.
struct Place<'a> {
    _permit: SemaphorePermit<'a>,
    in_flight: &'a AtomicU64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn unexpected(reply: &Reply) -> Error {
    Error::new(ErrorKind::Internal, format!("unexpected reply {reply:?}"))
}

/// What one attempt came to.
enum Answer<G, R> {
    Granted(G),
    Rejected(R),
}

/// How a call with retries ended.
enum Ending<G, R> {
    Granted(G),
    /// Rejected, and the kill switch granted instead.
    KillSwitch(R),
    /// Rejected until `max_wait` ran out: the last rejection.
    Rejected(R),
    /// The server could not answer; degraded mode grants.
    Degraded,
}
