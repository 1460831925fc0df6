//! Envoy's `envoy.service.ratelimit.v3.RateLimitService` (SPEC §11): a
//! call planned by `charon_core::envoy` (every descriptor matched, the
//! domain's `limits:` evaluated), the limits it checks decided together
//! by one [`charon_store::Store::meters`] batch, and the reply built the
//! way the section's settings say (see [`reply`]). A thin shell like the
//! `charon.v1` service: core matches and decides, the store swaps state.
//!
//! Recording follows the section's `record:`. `all_or_nothing` (SPEC §11):
//! a call that is over on one limit records nothing on the others (one
//! Redis round trip). `every_hit` (envoyproxy/ratelimit's counters): every
//! limit is decided on its own in the batch, and the hits of the ones
//! over their limit are then charged in a second batch, so a client over
//! its limit stays over while it keeps calling.
//!
//! Choices where Envoy's protocol leaves room (see `docs/envoy.md`):
//! - a descriptor that names a `kind: rate` resource (burst tiers) is
//!   decided in the same batch; its status describes the tier the pair is
//!   in after the decision (see [`reply::Outcome::of`]);
//! - `is_negative_hits` (a refund) is a client error; a descriptor's
//!   `limit` override is ignored (the configuration decides);
//! - a cost of 0 (a descriptor's `hits_addend: 0`) is a dry run of one hit;
//! - at most [`MAX_DESCRIPTORS`] descriptors in a call.

mod reply;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use charon_core::ClientError;
use charon_core::config::{Config, Enforcement, RateLike, RateLimits, RateResource};
use charon_core::envoy::{CallPlan, DescriptorLimits, Envoy, Inline, Per, RateLimit, Record, Unit};
use charon_core::meter::{Meter, Op, Policy};
use charon_core::request::Amount;
use charon_limiter::LimitError;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use charon_proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_server::RateLimitService,
};
use charon_store::{Limit, MeterOp, OpReply};
use tonic::{Request, Response, Status};

use super::status;
use crate::ServerState;
use crate::api_auth;
use crate::events::Event;
use crate::metrics;
use crate::observe::{self, Decision};

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

/// What decides one check, owned until the batch is built.
enum Decider<'c> {
    /// `requests_per_unit: 0`: over, nothing asked of the store.
    DenyAll {
        window: u64,
    },
    Meter(Meter),
    Tiers {
        limits: RateLimits<'c>,
        policy: Policy,
        enforcement: Enforcement,
    },
}

/// One check, resolved: what decides it, with which operation.
struct Resolved<'c> {
    decider: Decider<'c>,
    op: Op,
    cost: u64,
    unit: Option<Unit>,
    ignored: bool,
    /// Whether its rejection leaves the rest of the batch to commit.
    lenient: bool,
}

/// A descriptor's `limit` override as an inline limit; `None` for a unit
/// Envoy leaves unknown.
fn override_of(
    l: &charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
) -> Option<RateLimit> {
    use charon_proto::envoy::r#type::v3::RateLimitUnit as U;
    let unit = match U::try_from(l.unit).ok()? {
        U::Second => Unit::Second,
        U::Minute => Unit::Minute,
        U::Hour => Unit::Hour,
        U::Day => Unit::Day,
        U::Month => Unit::Month,
        U::Year => Unit::Year,
        U::Unknown => return None,
    };
    RateLimit::new(Per::Unit(unit), u64::from(l.requests_per_unit)).ok()
}

/// The unit a meter's limit is counted per, where it has one: a window as
/// long as a unit.
/// OK for the call and each of its descriptors.
fn all_ok(req: &RateLimitRequest) -> RateLimitResponse {
    RateLimitResponse {
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
    }
}

fn unit_of(meter: &Meter) -> Option<Unit> {
    let Meter::Window(p) = meter else {
        return None;
    };
    Unit::of_window(p.window())
}

fn cost_of(req: &RateLimitRequest, descriptor: Option<usize>) -> u64 {
    let of_call = u64::from(req.hits_addend);
    match descriptor.and_then(|i| req.descriptors.get(i)) {
        Some(d) => match d.hits_addend {
            Some(n) => n,
            None if of_call > 0 => of_call,
            None => 1,
        },
        // A limit of `limits:` counts the call's hits_addend (0 is 1), as
        // Limitador does: its descriptors' own are not Limitador's.
        None => of_call.max(1),
    }
}

/// Resolves every check of `plan` (errors name the descriptor).
fn resolve<'p>(
    config: &'p Config,
    envoy: &Envoy,
    plan: &'p CallPlan<'_>,
    req: &RateLimitRequest,
) -> Result<Vec<Resolved<'p>>, LimitError> {
    let at = |c: &charon_core::envoy::Check<'_>, e: &ClientError| -> LimitError {
        let e = match c.descriptor {
            Some(i) => ClientError::invalid(format!("descriptors[{i}]: {e}")),
            None => ClientError::invalid(format!("limit {}: {e}", c.limit.label)),
        };
        LimitError::Client(e)
    };
    let settings = &envoy.settings;
    let mut out = Vec::with_capacity(plan.checks.len());
    for c in &plan.checks {
        let l = &c.limit;
        let cost = cost_of(req, c.descriptor);
        let (decider, enforcement, unit) = match &l.rate_limit {
            Some(rl) => {
                let e = config.enforcement(&l.resource);
                let d = match rl.decider(settings.windows) {
                    Inline::DenyAll => Decider::DenyAll {
                        window: rl.window(),
                    },
                    Inline::Meter(m) => Decider::Meter(m),
                    Inline::Tiers(tiers) => Decider::Tiers {
                        limits: RateLimits {
                            hard_limit: None,
                            global_limit: None,
                            tiers,
                        },
                        policy: Policy::default(),
                        enforcement: e,
                    },
                };
                (d, e, rl.unit())
            }
            None => {
                let operation = if cost == 0 { "dry_run" } else { "request" };
                match config
                    .rate_like(&l.resource, &l.domain, operation)
                    .map_err(|e| at(c, &e))?
                {
                    (RateLike::Meter(m), e) => {
                        let unit = unit_of(&m);
                        (Decider::Meter(m), e, unit)
                    }
                    // (the unit comes from the tier that decides)
                    (RateLike::Tiers(r), e) => (tiers_of(r, &l.domain, e), e, None),
                }
            }
        };
        let ignored = enforcement == Enforcement::Ignore;
        let op = if cost == 0 {
            Op::dry_run(Amount::exactly(1).map_err(|e| at(c, &e))?)
        } else {
            let amount = Amount::exactly(cost).map_err(|e| at(c, &e))?;
            match decider {
                // Burst tiers take `ignore_configured` themselves (granted
                // and recorded past every limit), as `charon.v1` has them.
                Decider::Meter(_) if ignored => Op::Charge(cost),
                _ => Op::request(amount),
            }
        };
        // An ignored, shadowed or quota limit never stops the batch (it
        // answers OK whatever it decides), nor does any under every_hit or
        // the section's shadow_mode.
        let lenient = ignored
            || l.shadow
            || l.quota
            || settings.shadow_mode
            || settings.record == Record::EveryHit;
        out.push(Resolved {
            decider,
            op,
            cost,
            unit,
            ignored,
            lenient,
        });
    }
    Ok(out)
}

fn tiers_of<'c>(r: &'c RateResource, domain: &str, enforcement: Enforcement) -> Decider<'c> {
    Decider::Tiers {
        limits: r.limits_for(domain),
        policy: r.policy_for(domain),
        enforcement,
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
    if req.domain.is_empty() {
        return Err(ClientError::invalid("the call's domain must not be empty").into());
    }
    let domain = req.domain.as_str();
    // Everything is checked and resolved before the store is asked, so a
    // bad descriptor anywhere records nothing anywhere.
    let descriptors: Vec<Vec<(&str, &str)>> = req
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect();
    if envoy.domain(domain).is_none() {
        metrics::envoy_unknown_domain(envoy.settings.unknown_domain);
    }
    let mut plan = envoy.plan(domain, &descriptors)?;
    if envoy.settings.descriptor_limits == DescriptorLimits::Apply {
        for (i, d) in req.descriptors.iter().enumerate() {
            let Some(limit) = d.limit.as_ref().and_then(override_of) else {
                continue;
            };
            plan.apply_override(domain, i, &descriptors[i], limit)
                .map_err(|e| ClientError::invalid(format!("descriptors[{i}]: {e}")))?;
        }
    }
    if let Some(i) = req.descriptors.iter().position(|d| d.is_negative_hits) {
        return Err(ClientError::invalid(format!(
            "descriptors[{i}]: is_negative_hits is not supported: hits already counted are not \
             given back"
        ))
        .into());
    }
    if !plan.known {
        metrics::envoy_call(metrics::UNKNOWN_DOMAIN, false);
        return Ok(Some(all_ok(req)));
    }
    let resolved = resolve(config, envoy, &plan, req)?;
    for c in &plan.checks {
        if c.limit.invalid_addresses > 0 {
            metrics::envoy_invalid_addresses(domain, c.limit.label, c.limit.invalid_addresses);
        }
    }
    // `same_slot`: every count of the call under the Envoy domain's tag.
    let slot = envoy
        .domain(domain)
        .filter(|d| d.same_slot())
        .map(|_| domain);
    let (ops, at): (Vec<MeterOp<'_>>, Vec<Option<usize>>) = {
        let mut ops = Vec::with_capacity(resolved.len());
        let mut at = Vec::with_capacity(resolved.len());
        for (c, r) in plan.checks.iter().zip(&resolved) {
            let limit = match &r.decider {
                Decider::DenyAll { .. } => {
                    at.push(None);
                    continue;
                }
                Decider::Meter(m) => Limit::Meter(m),
                Decider::Tiers {
                    limits,
                    policy,
                    enforcement,
                } => Limit::Tiers {
                    limits: *limits,
                    policy: *policy,
                    enforcement: *enforcement,
                },
            };
            at.push(Some(ops.len()));
            ops.push(MeterOp {
                resource: &c.limit.resource,
                domain: &c.limit.domain,
                limit,
                op: r.op,
                shadow: r.lenient,
                slot,
            });
        }
        (ops, at)
    };
    let batch = if ops.is_empty() {
        None
    } else {
        Some(state.limiter.store().meters(&ops).await?)
    };
    let replies: &[OpReply] = batch.as_ref().map_or(&[], |b| &b.replies);
    if envoy.settings.record == Record::EveryHit {
        // envoyproxy/ratelimit's counters count the hits of a descriptor
        // over its limit too.
        let charges: Vec<MeterOp<'_>> = ops
            .iter()
            .zip(replies)
            .filter(|(o, r)| matches!(o.op, Op::Request { dry_run: false, .. }) && r.rejects(o.op))
            .map(|(o, _)| MeterOp {
                op: Op::Charge(match o.op {
                    Op::Request { amount, .. } => amount.copies(),
                    Op::Charge(n) | Op::Refund(n) => n,
                }),
                ..*o
            })
            .collect();
        if !charges.is_empty() {
            state.limiter.store().meters(&charges).await?;
        }
    }
    let outcomes: Vec<reply::Outcome> = plan
        .checks
        .iter()
        .zip(&resolved)
        .zip(&at)
        .map(|((_, r), i)| match (i, &r.decider) {
            (None, Decider::DenyAll { window }) => reply::Outcome::deny_all(*window, r.unit),
            (Some(i), _) => {
                let (reply, op) = (&replies[*i], &ops[*i]);
                reply::Outcome::of(reply, &op.limit, r.unit, !r.ignored && reply.rejects(op.op))
            }
            (None, _) => reply::Outcome::deny_all(0, r.unit),
        })
        .collect();
    for ((c, r), o) in plan.checks.iter().zip(&resolved).zip(&outcomes) {
        state.emit(|now| reply::event(now, c, r.cost, o));
    }
    Ok(Some(reply::respond(domain, envoy, &plan, &outcomes)))
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
        // Its metrics are Envoy's own, not the decision metrics.
        let decision = Decision::start(&self.state, "envoy", "", &req.domain).since(started);
        let result = decision
            .decide(async {
                let config = self.state.limiter.config();
                decide(&self.state, &config, &req).await
            })
            .await;
        let outcome = observe::outcome_of(&result, |response| match response {
            Some(r) if r.overall_code == Code::OverLimit as i32 => metrics::Outcome::Rejected,
            _ => metrics::Outcome::Granted,
        });
        metrics::envoy_duration(decision.end_span(outcome));
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
                Ok(Response::new(all_ok(&req)))
            }
            Err(e) => {
                metrics::envoy_error(e.class());
                self.state
                    .emit(|now| Event::new(now, "envoy", "", &req.domain, outcome.into()));
                Err(status::to_status(&e))
            }
        }
    }
}
