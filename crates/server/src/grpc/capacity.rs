//! `charon.v1.Capacity` (SPEC §12): capacity leases over gRPC, a thin
//! shell around [`charon_limiter::Limiter::get_capacity`] and
//! [`charon_limiter::Limiter::release_capacity`].

use std::sync::Arc;
use std::time::Instant;

use charon_limiter::{CapacityAsk, LimitError};
use charon_proto::v1;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{error_outcome, status};
use crate::ServerState;
use crate::api_auth;
use crate::events::{Count, Event, EventOutcome};
use crate::metrics::Outcome;

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

    /// Counts one call per resource it named, as decisions are counted.
    fn record<'a>(
        &self,
        operation: &'static str,
        resources: impl Iterator<Item = &'a str>,
        outcome: Outcome,
        started: Instant,
    ) {
        let decisions = self.state.decisions();
        for r in resources {
            decisions.observe(operation, r, outcome, started.elapsed());
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

/// The one decision span of a capacity call: its resource is left empty
/// when the call names several.
fn call_span<'a>(
    operation: &'static str,
    mut resources: impl Iterator<Item = &'a str>,
    client_id: &str,
) -> tracing::Span {
    let resource = match (resources.next(), resources.next()) {
        (Some(one), None) => one,
        _ => "",
    };
    crate::trace::decision(operation, resource, client_id)
}

fn outcome<T>(result: &Result<T, LimitError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Granted,
        Err(e) => error_outcome(e),
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
        let span = call_span(
            "get_capacity",
            asks.iter().map(|a| a.resource.as_str()),
            &req.client_id,
        );
        let result = match self.state.check_configured() {
            Ok(()) => {
                self.state
                    .limiter
                    .get_capacity(&req.client_id, &asks)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => Err(e),
        };
        crate::trace::outcome(&span, outcome(&result), None);
        self.record(
            "get_capacity",
            asks.iter().map(|a| a.resource.as_str()),
            outcome(&result),
            started,
        );
        for (i, ask) in asks.iter().enumerate() {
            self.state.emit(|now| {
                let granted = result.as_ref().ok().and_then(|r| r.get(i));
                let outcome = match granted {
                    Some(g) => lease_outcome(g.capacity.to_f64(), ask.wants),
                    None => outcome(&result).into(),
                };
                let mut e = Event::new(now, "get_capacity", &ask.resource, &req.client_id, outcome);
                e.requested = Some(Count::Real(ask.wants));
                e.granted = granted.map(|g| Count::Real(g.capacity.to_f64()));
                e
            });
        }
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
        let span = call_span(
            "release_capacity",
            req.resources.iter().map(String::as_str),
            &req.client_id,
        );
        let result = match self.state.check_configured() {
            Ok(()) => {
                self.state
                    .limiter
                    .release_capacity(&req.client_id, &req.resources)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => Err(e),
        };
        crate::trace::outcome(&span, outcome(&result), None);
        self.record(
            "release_capacity",
            req.resources.iter().map(String::as_str),
            outcome(&result),
            started,
        );
        for resource in &req.resources {
            self.state.emit(|now| {
                Event::new(
                    now,
                    "release_capacity",
                    resource,
                    &req.client_id,
                    outcome(&result).into(),
                )
            });
        }
        let released = result.map_err(|e| status::to_status(&e))?;
        Ok(Response::new(v1::ReleaseCapacityReply { released }))
    }
}
