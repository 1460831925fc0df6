//! `charon.v1.Limiter` over gRPC: a thin shell that parses messages,
//! calls the limiter, and maps replies and errors back.

pub mod capacity;
pub(crate) mod classify;
pub mod envoy;
mod ops;
mod session;
pub mod status;

use std::sync::Arc;

use charon_limiter::LimitError;
use charon_proto::v1;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::ServerState;
use crate::api_auth;
use crate::events::{Count, Event, EventOutcome};
use crate::metrics::Outcome;
use crate::observe::{self, Decision};

/// The `Limiter` service.
#[derive(Debug, Clone)]
pub struct LimiterService {
    state: Arc<ServerState>,
}

impl LimiterService {
    /// A service deciding with `state.limiter`.
    pub fn new(state: Arc<ServerState>) -> Self {
        Self { state }
    }
}

/// Checks a unary call's token and its right to `resource`: the API
/// tokens' `UNAUTHENTICATED` or `PERMISSION_DENIED`, or nothing.
fn allowed<T>(state: &ServerState, request: &Request<T>, resource: &str) -> Result<(), Status> {
    let caller = state.api_auth.authenticate(request)?;
    match api_auth::refusal(&caller, resource) {
        Some(why) => Err(api_auth::denied_status(why)),
        None => Ok(()),
    }
}

/// Runs a rate request and records it.
async fn observed_request(
    state: &ServerState,
    req: &v1::RateRequest,
) -> Result<v1::RateReply, LimitError> {
    let operation = if req.dry_run { "dry_run" } else { "request" };
    let decision = Decision::start(state, operation, &req.resource, &req.domain);
    let result = decision
        .decide(ops::request::run(&state.limiter, req))
        .await;
    let asked = req.copies.unwrap_or(1);
    let outcome = observe::outcome_of(&result, |r| Outcome::of_grant(r.granted, asked));
    if let Ok(r) = &result {
        decision.count_flags(&req.resource, outcome, r);
    }
    let granted = result.as_ref().ok().map(|r| r.granted);
    decision.end(&req.resource, outcome, granted, |now| {
        let outcome = match &result {
            Ok(r) => EventOutcome::of_grant(r.granted, asked, r.delay_ms),
            Err(_) => outcome.into(),
        };
        let mut e = Event::new(now, operation, &req.resource, &req.domain, outcome);
        e.requested = Some(Count::Whole(asked));
        if let Ok(r) = &result {
            rate_reply_facts(&mut e, r);
        }
        e
    });
    result
}

/// The counts of a rate-like reply in an event.
fn rate_reply_facts(e: &mut Event, r: &v1::RateReply) {
    e.granted = Some(Count::Whole(r.granted));
    e.tier = (r.tier > 0).then_some(r.tier);
    e.remaining = r.remaining;
    e.delay_ms = r.delay_ms.filter(|&d| d > 0);
    e.warning = r.warning;
    e.banned = r.banned;
}

/// Runs a charge (`refund = false`) or a refund and records it.
async fn observed_charge(
    state: &ServerState,
    req: &v1::ChargeRequest,
    refund: bool,
) -> Result<v1::RateReply, LimitError> {
    let operation = if refund { "refund" } else { "charge" };
    let decision = Decision::start(state, operation, &req.resource, &req.domain);
    let result = decision
        .decide(ops::charge::run(&state.limiter, req, refund))
        .await;
    let outcome = observe::outcome_of(&result, |_| Outcome::Granted);
    if let Ok(r) = &result {
        decision.count_flags(&req.resource, outcome, r);
    }
    let granted = result.as_ref().ok().map(|r| r.granted);
    decision.end(&req.resource, outcome, granted, |now| {
        let mut e = Event::new(now, operation, &req.resource, &req.domain, outcome.into());
        e.requested = Some(Count::Whole(req.copies));
        if let Ok(r) = &result {
            rate_reply_facts(&mut e, r);
        }
        e
    });
    result
}

#[tonic::async_trait]
impl v1::limiter_server::Limiter for LimiterService {
    async fn request(
        &self,
        request: Request<v1::RateRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        allowed(&self.state, &request, &request.get_ref().resource)?;
        let req = request.into_inner();
        observed_request(&self.state, &req)
            .await
            .map(Response::new)
            .map_err(|e| status::to_status(&e))
    }

    async fn charge(
        &self,
        request: Request<v1::ChargeRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        allowed(&self.state, &request, &request.get_ref().resource)?;
        let req = request.into_inner();
        observed_charge(&self.state, &req, false)
            .await
            .map(Response::new)
            .map_err(|e| status::to_status(&e))
    }

    async fn refund(
        &self,
        request: Request<v1::ChargeRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        allowed(&self.state, &request, &request.get_ref().resource)?;
        let req = request.into_inner();
        observed_charge(&self.state, &req, true)
            .await
            .map(Response::new)
            .map_err(|e| status::to_status(&e))
    }

    type SessionStream = ReceiverStream<Result<v1::SessionReply, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        if self.state.shutdown.is_triggered() {
            return Err(Status::unavailable("shutting down"));
        }
        // The stream's token is checked once; each operation's resource
        // against it as the operation comes (a forbidden one fails alone).
        let caller = self.state.api_auth.authenticate(&request)?;
        Ok(Response::new(session::start(
            self.state.clone(),
            caller,
            request.into_inner(),
        )))
    }
}
