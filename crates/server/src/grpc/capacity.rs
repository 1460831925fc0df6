//! `charon.v1.Capacity` (SPEC §12): capacity leases over gRPC, a thin
//! shell around [`charon_limiter::Limiter::get_capacity`] and
//! [`charon_limiter::Limiter::release_capacity`].

use std::sync::Arc;
use std::time::Instant;

use charon_limiter::CapacityAsk;
use charon_proto::v1;
use tonic::{Request, Response, Status};

use super::status;
use crate::ServerState;
use crate::api_auth;
use crate::events::{Count, Event, EventOutcome};
use crate::metrics::Outcome;
use crate::observe::{self, Decision};

/// The `Capacity` service.
#[derive(Debug, Clone)]
pub struct CapacityService {
    state: Arc<ServerState>,
}

impl CapacityService {
    /// A service deciding with `state.limiter`.
    pub fn new(state: Arc<ServerState>) -> Self {
        Self { state }
    }

    /// Checks the call's token and its right to every resource it names:
    /// one it may not use refuses the whole call (`PERMISSION_DENIED`).
    fn allowed<'a, T>(
        &self,
        request: &Request<T>,
        mut resources: impl Iterator<Item = &'a str>,
    ) -> Result<(), Status> {
        let caller = self.state.api_auth.authenticate(request)?;
        match resources.find_map(|r| api_auth::refusal(&caller, r)) {
            Some(why) => Err(api_auth::denied_status(why)),
            None => Ok(()),
        }
    }
}

/// A lease of `capacity` for a client that wants `wants`: all of it,
/// some, or nothing.
fn lease_outcome(capacity: f64, wants: f64) -> EventOutcome {
    if capacity >= wants {
        EventOutcome::Granted
    } else if capacity > 0.0 {
        EventOutcome::Partial
    } else {
        EventOutcome::Rejected
    }
}

/// The resource a capacity call's decision span names: the one it asks
/// about, or none (empty) when it names several.
fn span_resource<'a>(mut resources: impl Iterator<Item = &'a str>) -> &'a str {
    match (resources.next(), resources.next()) {
        (Some(one), None) => one,
        _ => "",
    }
}

#[tonic::async_trait]
impl v1::capacity_server::Capacity for CapacityService {
    async fn get_capacity(
        &self,
        request: Request<v1::GetCapacityRequest>,
    ) -> Result<Response<v1::GetCapacityReply>, Status> {
        let started = Instant::now();
        self.allowed(
            &request,
            request
                .get_ref()
                .resources
                .iter()
                .map(|w| w.resource.as_str()),
        )?;
        let req = request.into_inner();
        let asks: Vec<CapacityAsk> = req
            .resources
            .iter()
            .map(|w| CapacityAsk {
                resource: w.resource.clone(),
                wants: w.wants,
                has: w.has,
                subclients: w.subclients,
            })
            .collect();
        let decision = Decision::start(
            &self.state,
            "get_capacity",
            span_resource(asks.iter().map(|a| a.resource.as_str())),
            &req.client_id,
        )
        .since(started);
        let result = decision
            .decide(self.state.limiter.get_capacity(&req.client_id, &asks))
            .await;
        let outcome = observe::outcome_of(&result, |_| Outcome::Granted);
        let (replies, client_id) = (&result, req.client_id.as_str());
        decision.end_each(
            outcome,
            asks.iter().enumerate().map(|(i, ask)| {
                let event = move |now| {
                    let granted = replies.as_ref().ok().and_then(|r| r.get(i));
                    let outcome = match granted {
                        Some(g) => lease_outcome(g.capacity.to_f64(), ask.wants),
                        None => outcome.into(),
                    };
                    let mut e = Event::new(now, "get_capacity", &ask.resource, client_id, outcome);
                    e.requested = Some(Count::Real(ask.wants));
                    e.granted = granted.map(|g| Count::Real(g.capacity.to_f64()));
                    e
                };
                (ask.resource.as_str(), event)
            }),
        );
        let replies = result.map_err(|e| status::to_status(&e))?;
        let leases = asks
            .into_iter()
            .zip(replies)
            .map(|(a, r)| v1::Lease {
                resource: a.resource,
                capacity: r.capacity.to_f64(),
                expires_at_ms: r.expires_at_ms,
                refresh_interval_ms: r.refresh_interval_ms,
                safe_capacity: r.safe_capacity.to_f64(),
            })
            .collect();
        Ok(Response::new(v1::GetCapacityReply { leases }))
    }

    async fn release_capacity(
        &self,
        request: Request<v1::ReleaseCapacityRequest>,
    ) -> Result<Response<v1::ReleaseCapacityReply>, Status> {
        let started = Instant::now();
        self.allowed(
            &request,
            request.get_ref().resources.iter().map(String::as_str),
        )?;
        let req = request.into_inner();
        let decision = Decision::start(
            &self.state,
            "release_capacity",
            span_resource(req.resources.iter().map(String::as_str)),
            &req.client_id,
        )
        .since(started);
        let result = decision
            .decide(
                self.state
                    .limiter
                    .release_capacity(&req.client_id, &req.resources),
            )
            .await;
        let outcome = observe::outcome_of(&result, |_| Outcome::Granted);
        let client_id = req.client_id.as_str();
        decision.end_each(
            outcome,
            req.resources.iter().map(|resource| {
                let event = move |now| {
                    Event::new(now, "release_capacity", resource, client_id, outcome.into())
                };
                (resource.as_str(), event)
            }),
        );
        let released = result.map_err(|e| status::to_status(&e))?;
        Ok(Response::new(v1::ReleaseCapacityReply { released }))
    }
}
