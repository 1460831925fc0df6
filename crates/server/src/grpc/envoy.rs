//! Envoy's `envoy.service.ratelimit.v3.RateLimitService` (SPEC §11): every
//! descriptor of a call matched by `charon_core::envoy`, and the limited
//! ones decided together by one all-or-nothing [`charon_store::Store::meters`] batch, so
//! a call that is over on one descriptor records nothing on the others
//! (one Redis round trip). A thin shell like the `charon.v1` service: core
//! matches and decides, the store swaps state.
//!
//! Choices where Envoy's protocol leaves room (see `docs/envoy.md`):
//! - a descriptor that names a `kind: rate` resource (burst tiers) is
//!   decided in the same batch; its status describes the tier the pair is
//!   in after the decision (see [`Outcome::of`]);
//! - `is_negative_hits` (a refund) is a client error; a descriptor's
//!   `limit` override is ignored (the configuration decides);
//! - a cost of 0 (a descriptor's `hits_addend: 0`) is a dry run of one hit;
//! - at most [`MAX_DESCRIPTORS`] descriptors in a call.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use charon_core::ClientError;
use charon_core::config::{Config, Enforcement, RateLike, RateResource};
use charon_core::envoy::{Matched, Unit};
use charon_core::meter::{Meter, Op};
use charon_core::request::Amount;
use charon_limiter::LimitError;
use charon_proto::envoy::config::core::v3::HeaderValue;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use charon_proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_server::RateLimitService,
};
use charon_store::{Limit, MeterOp, OpReply};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::status;
use crate::ServerState;
use crate::api_auth;
use crate::events::{Count, Event, EventOutcome};
use crate::metrics;

/// The most descriptors one call may carry: Envoy sends one per rate-limit
/// action list of the route (a handful); thousands are a broken or hostile
/// client, refused before anything is matched or recorded.
pub const MAX_DESCRIPTORS: usize = 1024;

/// The Envoy service.
#[derive(Debug, Clone)]
pub struct EnvoyService {
    state: Arc<ServerState>,
    /// Whether the missing `envoy:` section was already logged.
    told_missing: Arc<AtomicBool>,
}

impl EnvoyService {
    /// A service deciding with `state.limiter`.
    pub fn new(state: Arc<ServerState>) -> Self {
        Self {
            state,
            told_missing: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// What one descriptor came to before the store is asked.
enum Plan<'a> {
    /// Not limited or unlimited: OK, nothing recorded.
    Free { node: Option<&'a str> },
    /// Decided in the batch (operation `op` of it).
    Limited {
        node: &'a str,
        op: usize,
        unit: Option<Unit>,
        resource: &'a str,
        shadow: bool,
        ignored: bool,
    },
}

/// A client error about descriptor `i`.
fn at(i: usize, e: &ClientError) -> LimitError {
    LimitError::Client(ClientError::invalid(format!("descriptors[{i}]: {e}")))
}

/// The unit a meter's limit is counted per, where it has one: an inline
/// limit's, or a window as long as a unit.
fn unit_of(meter: &Meter) -> Option<Unit> {
    let Meter::Window(p) = meter else {
        return None;
    };
    unit_of_window(p.window())
}

/// The unit as long as `window`, if there is one.
fn unit_of_window(window: u64) -> Option<Unit> {
    [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day]
        .into_iter()
        .find(|u| u.millis() == window)
}

/// What decides a limited descriptor, owned until the batch is built.
enum Decider<'c> {
    Meter(Meter),
    Tiers(&'c RateResource, Enforcement),
}

/// One decided descriptor as its status and the headers see it, whatever
/// its kind.
struct Outcome {
    limit: u64,
    remaining: u64,
    /// `None`: the state is never forgotten (burst tiers only).
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    warning: bool,
    unit: Option<Unit>,
}

impl Outcome {
    /// A meter's reply as it is; burst tiers' through the tier the pair is
    /// in after the decision (where a grant put its hits, or the current
    /// one on a rejection): its limit and, where its window is as long as
    /// one, its unit; `remaining` and the waits are the pair's (bursts, H
    /// and G included: what a request could get now, when the state is
    /// forgotten, when `min_copies` would be granted).
    fn of(reply: &OpReply, limit: &Limit<'_>, unit: Option<Unit>) -> Self {
        match (reply, limit) {
            (OpReply::Meter(r), _) => Outcome {
                limit: r.limit,
                remaining: r.remaining,
                reset_after_ms: Some(r.reset_after_ms),
                retry_after_ms: r.retry_after_ms,
                warning: r.warning,
                unit,
            },
            (OpReply::Tiers(r), l) => {
                let window = match l {
                    Limit::Tiers { limits, .. } => r
                        .tier
                        .checked_sub(1)
                        .and_then(|i| limits.tiers.get(i))
                        .map(|t| t.window),
                    Limit::Meter(_) => None,
                };
                Outcome {
                    limit: r.context.limit,
                    remaining: r.context.remaining,
                    reset_after_ms: r.context.reset_after_ms,
                    retry_after_ms: r.context.retry_after_ms,
                    warning: r.context.warning,
                    unit: window.and_then(unit_of_window),
                }
            }
        }
    }
}

fn proto_unit(unit: Option<Unit>) -> ProtoUnit {
    match unit {
        Some(Unit::Second) => ProtoUnit::Second,
        Some(Unit::Minute) => ProtoUnit::Minute,
        Some(Unit::Hour) => ProtoUnit::Hour,
        Some(Unit::Day) => ProtoUnit::Day,
        None => ProtoUnit::Unknown,
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        // Below 10^9: fits.
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

/// Whole seconds, rounded up (never tell a client to come back early).
fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

fn header(key: &str, value: u64) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value: value.to_string(),
        ..HeaderValue::default()
    }
}

/// Decides one call. `Ok(None)` when the configuration has no `envoy:`
/// section.
async fn decide(
    state: &ServerState,
    config: &Config,
    req: &RateLimitRequest,
) -> Result<Option<RateLimitResponse>, LimitError> {
    let Some(envoy) = config.envoy() else {
        return Ok(None);
    };
    if req.descriptors.is_empty() {
        return Err(ClientError::invalid("a call needs at least one descriptor").into());
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(ClientError::invalid(format!(
            "{} descriptors in one call, at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        ))
        .into());
    }
    let domain = req.domain.as_str();
    // Everything is checked and resolved before the store is asked, so a
    // bad descriptor anywhere records nothing anywhere.
    let mut plans = Vec::with_capacity(req.descriptors.len());
    let mut resolved: Vec<(&str, String, Decider<'_>, Op, bool)> = Vec::new();
    let mut invalid: Vec<(&str, usize)> = Vec::new();
    for (i, d) in req.descriptors.iter().enumerate() {
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let matched = envoy
            .match_descriptor(domain, &entries)
            .map_err(|e| at(i, &e))?;
        if d.is_negative_hits {
            return Err(at(
                i,
                &ClientError::invalid(
                    "is_negative_hits is not supported: hits already counted are not given back",
                ),
            ));
        }
        let limit = match matched {
            Matched::NotLimited => {
                plans.push(Plan::Free { node: None });
                continue;
            }
            Matched::Unlimited { node } => {
                plans.push(Plan::Free {
                    node: Some(node.id()),
                });
                continue;
            }
            Matched::Limited(l) => l,
        };
        let cost = match d.hits_addend {
            Some(n) => n,
            None if req.hits_addend > 0 => u64::from(req.hits_addend),
            None => 1,
        };
        let (decider, enforcement, unit) = match limit.rate_limit {
            Some(rl) => {
                let e = config.enforcement(limit.resource);
                (Decider::Meter(rl.meter()), e, Some(rl.unit()))
            }
            None => {
                let operation = if cost == 0 { "dry_run" } else { "request" };
                match config
                    .rate_like(limit.resource, &limit.domain, operation)
                    .map_err(|e| at(i, &e))?
                {
                    (RateLike::Meter(m), e) => {
                        let unit = unit_of(&m);
                        (Decider::Meter(m), e, unit)
                    }
                    // (the unit comes from the tier that decides)
                    (RateLike::Tiers(r), e) => (Decider::Tiers(r, e), e, None),
                }
            }
        };
        let ignored = enforcement == Enforcement::Ignore;
        let op = if cost == 0 {
            Op::dry_run(Amount::exactly(1).map_err(|e| at(i, &e))?)
        } else {
            let amount = Amount::exactly(cost).map_err(|e| at(i, &e))?;
            match decider {
                // Burst tiers take `ignore_configured` themselves (granted
                // and recorded past every limit), as `charon.v1` has them.
                Decider::Meter(_) if ignored => Op::Charge(cost),
                _ => Op::request(amount),
            }
        };
        if limit.invalid_addresses > 0 {
            invalid.push((limit.node.id(), limit.invalid_addresses));
        }
        plans.push(Plan::Limited {
            node: limit.node.id(),
            op: resolved.len(),
            unit,
            resource: limit.resource,
            shadow: limit.shadow,
            ignored,
        });
        // An ignored limit never stops the batch (it answers OK whatever
        // it decides), like a shadowed one.
        resolved.push((
            limit.resource,
            limit.domain,
            decider,
            op,
            limit.shadow || ignored,
        ));
    }
    for (node, n) in invalid {
        metrics::envoy_invalid_addresses(domain, node, n);
    }
    // `same_slot`: every count of the call under the Envoy domain's tag.
    let slot = envoy
        .domain(domain)
        .filter(|d| d.same_slot())
        .map(|_| domain);
    let ops: Vec<MeterOp<'_>> = resolved
        .iter()
        .map(|(resource, d, decider, op, shadow)| MeterOp {
            resource,
            domain: d,
            limit: match decider {
                Decider::Meter(m) => Limit::Meter(m),
                Decider::Tiers(r, enforcement) => Limit::Tiers {
                    limits: r.limits_for(d),
                    policy: r.policy_for(d),
                    enforcement: *enforcement,
                },
            },
            op: *op,
            shadow: *shadow,
            slot,
        })
        .collect();
    let batch = if ops.is_empty() {
        None
    } else {
        Some(state.limiter.store().meters(&ops).await?)
    };
    Ok(Some(respond(
        state,
        envoy.headers,
        domain,
        &plans,
        &ops,
        batch,
    )))
}

/// The response for the decided batch, and its metrics.
fn respond(
    state: &ServerState,
    headers: bool,
    domain: &str,
    plans: &[Plan<'_>],
    ops: &[MeterOp<'_>],
    batch: Option<charon_store::Batch>,
) -> RateLimitResponse {
    let replies: &[OpReply] = batch.as_ref().map_or(&[], |b| &b.replies);
    let mut statuses = Vec::with_capacity(plans.len());
    let mut over = false;
    // The most constraining limited descriptor (least remaining), for the
    // headers; the longest wait among those over, for Retry-After.
    let mut tightest: Option<Outcome> = None;
    let mut retry_ms: Option<u64> = None;
    for plan in plans {
        let (node, op, unit, resource, shadow, ignored) = match plan {
            Plan::Free { node } => {
                metrics::envoy_descriptor(domain, node.unwrap_or("(none)"), false, false, false);
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            }
            Plan::Limited {
                node,
                op,
                unit,
                resource,
                shadow,
                ignored,
            } => (node, op, unit, resource, shadow, ignored),
        };
        let (Some(reply), Some(o)) = (replies.get(*op), ops.get(*op)) else {
            continue;
        };
        let r = Outcome::of(reply, &o.limit, *unit);
        let rejected = !ignored && reply.rejects(o.op);
        let enforced_over = rejected && !shadow;
        over |= enforced_over;
        metrics::envoy_descriptor(domain, node, rejected, r.warning, rejected && *shadow);
        state.emit(|now| descriptor_event(now, resource, o, reply, &r, rejected, *shadow));
        if enforced_over && let Some(wait) = r.retry_after_ms.or(r.reset_after_ms) {
            retry_ms = Some(retry_ms.map_or(wait, |w| w.max(wait)));
        }
        statuses.push(DescriptorStatus {
            code: if enforced_over {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: Some(RateLimit {
                name: (*resource).to_owned(),
                requests_per_unit: clamp(r.limit),
                unit: proto_unit(r.unit) as i32,
            }),
            limit_remaining: clamp(r.remaining),
            duration_until_reset: r.reset_after_ms.map(duration),
            ..DescriptorStatus::default()
        });
        if tightest.as_ref().is_none_or(|t| r.remaining < t.remaining) {
            tightest = Some(r);
        }
    }
    let mut response_headers_to_add = Vec::new();
    if headers && let Some(t) = tightest {
        response_headers_to_add.push(header("RateLimit-Limit", t.limit));
        response_headers_to_add.push(header("RateLimit-Remaining", t.remaining));
        // (burst tiers that are never forgotten have no reset to tell)
        if let Some(ms) = t.reset_after_ms {
            response_headers_to_add.push(header("RateLimit-Reset", seconds_up(ms)));
        }
        if let Some(ms) = retry_ms {
            response_headers_to_add.push(header("Retry-After", seconds_up(ms)));
        }
    }
    let overall_code = if over { Code::OverLimit } else { Code::Ok };
    metrics::envoy_call(domain, over);
    RateLimitResponse {
        overall_code: overall_code as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// The event of one decided descriptor: the Charon resource and domain it
/// was decided on, `rejected` over its limit (`shadowed` when shadow mode
/// let it through).
fn descriptor_event(
    now: u64,
    resource: &str,
    op: &MeterOp<'_>,
    reply: &OpReply,
    r: &Outcome,
    rejected: bool,
    shadow: bool,
) -> Event {
    let outcome = match (rejected, shadow) {
        (true, true) => EventOutcome::Shadowed,
        (true, false) => EventOutcome::Rejected,
        (false, _) => EventOutcome::Granted,
    };
    let mut e = Event::new(now, "envoy", resource, op.domain, outcome);
    e.requested = Some(Count::Whole(match op.op {
        Op::Request { amount, .. } => amount.copies(),
        Op::Charge(n) | Op::Refund(n) => n,
    }));
    e.granted = Some(Count::Whole(reply.granted()));
    e.remaining = Some(r.remaining);
    e.warning = r.warning;
    if let OpReply::Tiers(t) = reply {
        e.tier = u32::try_from(t.tier).ok().filter(|&t| t > 0);
    }
    e
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        // The Envoy domain stands for the namespace: a token may call for
        // the domains named like its namespaces.
        let caller = self.state.api_auth.authenticate(&request)?;
        if let Some(why) = api_auth::refusal_in(&caller, &request.get_ref().domain) {
            return Err(api_auth::denied_status(why));
        }
        let req = request.into_inner();
        // One decision span per call (its descriptors' Redis calls
        // beneath it); the resource is left empty: a call names several.
        let span = crate::trace::decision("envoy", "", &req.domain);
        let result = match self.state.check_configured() {
            Ok(()) => {
                let config = self.state.limiter.config();
                decide(&self.state, &config, &req)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => Err(e),
        };
        crate::trace::outcome(
            &span,
            match &result {
                Ok(Some(r)) if r.overall_code == Code::OverLimit as i32 => {
                    metrics::Outcome::Rejected
                }
                Ok(_) => metrics::Outcome::Granted,
                Err(e) => super::error_outcome(e),
            },
            None,
        );
        metrics::envoy_duration(started.elapsed());
        match result {
            Ok(Some(response)) => {
                self.told_missing.store(false, Ordering::Relaxed);
                Ok(Response::new(response))
            }
            Ok(None) => {
                if !self.told_missing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "Envoy's ShouldRateLimit was called, but the configuration has no \
                         envoy: section: every call is answered OK"
                    );
                }
                Ok(Response::new(RateLimitResponse {
                    overall_code: Code::Ok as i32,
                    statuses: req
                        .descriptors
                        .iter()
                        .map(|_| DescriptorStatus {
                            code: Code::Ok as i32,
                            ..DescriptorStatus::default()
                        })
                        .collect(),
                    ..RateLimitResponse::default()
                }))
            }
            Err(e) => {
                metrics::envoy_error(e.class());
                let outcome = super::error_outcome(&e);
                self.state
                    .emit(|now| Event::new(now, "envoy", "", &req.domain, outcome.into()));
                Err(status::to_status(&e))
            }
        }
    }
}
