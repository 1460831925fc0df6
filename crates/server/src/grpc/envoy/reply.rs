//! The answer to one call: one status per descriptor, the overall code,
//! and the response headers of the section's `headers:` style, from the
//! outcomes of the limits the call checked.
//!
//! What the statuses say, as both envoyproxy/ratelimit and Limitador say
//! it: a descriptor over its limit has `limit_remaining: 0`; one within
//! its limit has what is left after its hits (as if granted, when all or
//! nothing left the call unrecorded); an `unlimited` one has
//! `limit_remaining: 4294967295`; `duration_until_reset` is in whole
//! seconds, rounded up. The section's `shadow_mode` keeps every status and
//! answers the call OK; a node's `shadow_mode` answers its own status OK.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use charon_core::envoy::{CallPlan, Check, Envoy, Headers, Settings, Status, Unit};
use charon_core::meter::Meter;
use charon_proto::envoy::config::core::v3::HeaderValue;
use charon_proto::envoy::service::ratelimit::v3::RateLimitResponse;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use charon_store::{Limit, OpReply};

use crate::events::{Count, Event, EventOutcome};
use crate::metrics;

/// At most this many distinct metric labels with request values
/// (`detailed_metric`, `value_to_metric`) per process; past it, a node's
/// own label is used, so a flood of values cannot grow the metrics
/// without bound.
pub(super) const MAX_DETAILED_LABELS: usize = 10_000;

/// One decided limit as its status and the headers see it, whatever its
/// kind.
pub(super) struct Outcome {
    limit: u64,
    /// What the store answered: for a limit within its hits, what is left
    /// after them.
    remaining: u64,
    /// `None`: never whole again (burst tiers only).
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    warning: bool,
    unit: Option<Unit>,
    /// The window the limit counts in, where it has one.
    window_ms: Option<u64>,
    /// Over its own limit (an ignored limit never is).
    over: bool,
    granted: u64,
    tier: Option<u32>,
}

impl Outcome {
    /// A meter's reply as it is; burst tiers' through the tier the pair is
    /// in after the decision (where a grant put its hits, or the current
    /// one on a rejection): its limit and, where its window is as long as
    /// one, its unit; `remaining` and the waits are the pair's (bursts, H
    /// and G included: what a request could get now, when the pair is
    /// whole again, when `min_copies` would be granted).
    pub(super) fn of(reply: &OpReply, limit: &Limit<'_>, unit: Option<Unit>, over: bool) -> Self {
        match (reply, limit) {
            (OpReply::Meter(r), l) => Outcome {
                limit: r.limit,
                remaining: r.remaining,
                reset_after_ms: Some(r.reset_after_ms),
                retry_after_ms: r.retry_after_ms,
                warning: r.warning,
                unit,
                window_ms: match l {
                    Limit::Meter(Meter::Window(p)) => Some(p.window()),
                    _ => None,
                },
                over,
                granted: r.granted,
                tier: None,
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
                    unit: unit.or_else(|| window.and_then(Unit::of_window)),
                    window_ms: window,
                    over,
                    granted: r.granted,
                    tier: u32::try_from(r.tier).ok().filter(|&t| t > 0),
                }
            }
        }
    }

    /// A limit of 0: over, with the reset of its window (aligned to the
    /// epoch, by this server's clock).
    pub(super) fn deny_all(window: u64, unit: Option<Unit>) -> Self {
        let now = charon_core::Clock::now(&charon_store::SystemClock::new());
        Outcome {
            limit: 0,
            remaining: 0,
            reset_after_ms: Some(window.saturating_sub(now % window.max(1))),
            retry_after_ms: None,
            warning: false,
            unit,
            window_ms: Some(window),
            over: true,
            granted: 0,
            tier: None,
        }
    }

    /// `limit_remaining` as replies show it: 0 over the limit.
    fn shown_remaining(&self) -> u64 {
        if self.over { 0 } else { self.remaining }
    }
}

fn proto_unit(unit: Option<Unit>) -> ProtoUnit {
    match unit {
        Some(Unit::Second) => ProtoUnit::Second,
        Some(Unit::Minute) => ProtoUnit::Minute,
        Some(Unit::Hour) => ProtoUnit::Hour,
        Some(Unit::Day) => ProtoUnit::Day,
        Some(Unit::Week) => ProtoUnit::Week,
        Some(Unit::Month) => ProtoUnit::Month,
        Some(Unit::Year) => ProtoUnit::Year,
        None => ProtoUnit::Unknown,
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whole seconds, rounded up (never tell a client to come back early).
fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

fn header(key: &str, value: impl ToString) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value: value.to_string(),
        ..HeaderValue::default()
    }
}

/// The metrics label of a check: its values where `detailed_metric` or
/// `value_to_metric` ask for them, while fewer than
/// [`MAX_DETAILED_LABELS`] such labels exist; else its node's or limit's.
fn node_label<'a>(c: &'a Check<'_>) -> &'a str {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let Some(detail) = &c.limit.detail else {
        return c.limit.label;
    };
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    let Ok(mut seen) = seen.lock() else {
        return c.limit.label;
    };
    if seen.contains(detail.as_str()) || seen.len() < MAX_DETAILED_LABELS {
        seen.insert(detail.clone());
        detail
    } else {
        c.limit.label
    }
}

/// What a check's `current_limit.name` says: its `name`, else a configured
/// resource's name, else nothing (an inline limit, as envoyproxy/ratelimit
/// answers for one without a name).
fn limit_name(c: &Check<'_>) -> String {
    match (c.limit.name, c.limit.rate_limit) {
        (Some(n), _) => n.to_owned(),
        (None, None) => c.limit.resource.to_string(),
        (None, Some(_)) => String::new(),
    }
}

/// The response for the decided checks, and its metrics.
pub(super) fn respond(
    domain: &str,
    envoy: &Envoy,
    plan: &CallPlan<'_>,
    outcomes: &[Outcome],
) -> RateLimitResponse {
    let settings = &envoy.settings;
    // Per check: whether its status is OVER_LIMIT (a node's shadow_mode
    // answers it OK).
    let over_status: Vec<bool> = plan
        .checks
        .iter()
        .zip(outcomes)
        .map(|(c, o)| o.over && !c.limit.shadow)
        .collect();
    for ((c, o), &over) in plan.checks.iter().zip(outcomes).zip(&over_status) {
        let shadowed = o.over && (!over || settings.shadow_mode);
        metrics::envoy_descriptor(domain, node_label(c), o.over, o.warning, shadowed);
    }
    let mut statuses = Vec::with_capacity(plan.statuses.len());
    for s in &plan.statuses {
        statuses.push(match s {
            Status::NotLimited | Status::Replaced { .. } => {
                let node = match s {
                    Status::Replaced { label } => label,
                    _ => "(none)",
                };
                metrics::envoy_descriptor(domain, node, false, false, false);
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                }
            }
            Status::Unlimited { node } => {
                metrics::envoy_descriptor(domain, node.id(), false, false, false);
                DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                }
            }
            Status::Limited(i) => {
                let (c, o) = (&plan.checks[*i], &outcomes[*i]);
                DescriptorStatus {
                    code: if over_status[*i] {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    } as i32,
                    current_limit: Some(RateLimit {
                        name: limit_name(c),
                        requests_per_unit: clamp(o.limit),
                        unit: proto_unit(o.unit) as i32,
                    }),
                    limit_remaining: clamp(o.shown_remaining()),
                    duration_until_reset: o.reset_after_ms.map(|ms| prost_types::Duration {
                        seconds: i64::try_from(seconds_up(ms)).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                    ..DescriptorStatus::default()
                }
            }
        });
    }
    // Over when a limit that is not in quota mode is over, or every one in
    // quota mode is (envoyproxy/ratelimit's rule).
    let mut failed = false;
    let (mut quota, mut quota_over) = (0, 0);
    for (c, &over) in plan.checks.iter().zip(&over_status) {
        if c.limit.quota {
            quota += 1;
            quota_over += usize::from(over);
        } else {
            failed |= over;
        }
    }
    let over = failed || (quota > 0 && quota == quota_over);
    let response_headers_to_add = headers(settings, plan, outcomes, &over_status);
    let over = over && !settings.shadow_mode;
    metrics::envoy_call(domain, over);
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// The response headers of the section's style, under the names of its
/// `header_names:` where set.
fn headers(
    settings: &Settings,
    plan: &CallPlan<'_>,
    outcomes: &[Outcome],
    over_status: &[bool],
) -> Vec<HeaderValue> {
    let mut h = match settings.headers {
        Headers::None => Vec::new(),
        Headers::Charon => charon_headers(outcomes, over_status),
        Headers::RateLimit => ratelimit_headers(plan, outcomes, over_status),
        Headers::XRateLimit => x_ratelimit_headers(plan, outcomes),
    };
    let names = &settings.header_names;
    if !names.is_empty() {
        for header in &mut h {
            let own = match header.key.trim_start_matches("X-") {
                "RateLimit-Limit" => &names.limit,
                "RateLimit-Remaining" => &names.remaining,
                "RateLimit-Reset" => &names.reset,
                _ => &None,
            };
            if let Some(name) = own {
                header.key.clone_from(name);
            }
        }
    }
    h
}

/// `RateLimit-*` of the limit with the least remaining, and `Retry-After`
/// (the longest wait among those over: until a retry would be granted,
/// else until whole again).
fn charon_headers(outcomes: &[Outcome], over_status: &[bool]) -> Vec<HeaderValue> {
    let Some(t) = outcomes.iter().min_by_key(|o| o.shown_remaining()) else {
        return Vec::new();
    };
    let mut h = vec![
        header("RateLimit-Limit", t.limit),
        header("RateLimit-Remaining", t.shown_remaining()),
    ];
    // (burst tiers that are never whole again have no reset to tell)
    if let Some(ms) = t.reset_after_ms {
        h.push(header("RateLimit-Reset", seconds_up(ms)));
    }
    let retry = outcomes
        .iter()
        .zip(over_status)
        .filter(|(_, over)| **over)
        .filter_map(|(o, _)| o.retry_after_ms.or(o.reset_after_ms))
        .max();
    if let Some(ms) = retry {
        h.push(header("Retry-After", seconds_up(ms)));
    }
    h
}

/// envoyproxy/ratelimit's: `RateLimit-Limit`, `-Remaining` and `-Reset` of
/// the limit with the least remaining, or of the last one over (not in
/// quota mode).
fn ratelimit_headers(
    plan: &CallPlan<'_>,
    outcomes: &[Outcome],
    over_status: &[bool],
) -> Vec<HeaderValue> {
    let mut pick: Option<usize> = None;
    let mut least = u64::from(u32::MAX);
    for (i, (c, o)) in plan.checks.iter().zip(outcomes).enumerate() {
        let shown = o.shown_remaining().min(u64::from(u32::MAX));
        if shown < least || pick.is_none() {
            pick = Some(i);
            least = shown;
        }
        if over_status[i] && !c.limit.quota {
            pick = Some(i);
            least = 0;
        }
    }
    let Some(t) = pick.map(|i| &outcomes[i]) else {
        return Vec::new();
    };
    vec![
        header("RateLimit-Limit", clamp(t.limit)),
        header("RateLimit-Remaining", clamp(t.shown_remaining())),
        header("RateLimit-Reset", seconds_up(t.reset_after_ms.unwrap_or(0))),
    ]
}

/// Limitador's: `X-RateLimit-Limit` lists every limit's quota policy
/// (`10, 10;w=60, 100;w=3600;name="daily"`, the one with the least
/// remaining first), `X-RateLimit-Remaining` and `X-RateLimit-Reset` are
/// that first one's (the reset in whole seconds cut down); sorted by
/// name.
fn x_ratelimit_headers(plan: &CallPlan<'_>, outcomes: &[Outcome]) -> Vec<HeaderValue> {
    let mut order: Vec<usize> = (0..outcomes.len()).collect();
    order.sort_by_key(|&i| outcomes[i].shown_remaining());
    let Some(&first) = order.first() else {
        return Vec::new();
    };
    let t = &outcomes[first];
    let mut policies = String::new();
    for &i in &order {
        let o = &outcomes[i];
        policies.push_str(&format!(", {}", o.limit));
        if let Some(w) = o.window_ms {
            policies.push_str(&format!(";w={}", seconds_up(w)));
        }
        if let Some(name) = plan.checks[i].limit.name {
            policies.push_str(&format!(";name=\"{}\"", name.replace('"', "'")));
        }
    }
    let mut h = vec![
        header("X-RateLimit-Limit", format!("{}{policies}", t.limit)),
        header("X-RateLimit-Remaining", t.shown_remaining()),
    ];
    // Whole seconds cut down, as Limitador's (`Duration::as_secs`).
    if let Some(ms) = t.reset_after_ms {
        h.push(header("X-RateLimit-Reset", ms / 1000));
    }
    h.sort_by(|a, b| a.key.cmp(&b.key));
    h
}

/// The event of one decided check: the Charon resource and domain it was
/// decided on, over its limit or not (`shadowed` when shadow mode let it
/// through).
pub(super) fn event(now: u64, c: &Check<'_>, cost: u64, o: &Outcome) -> Event {
    let outcome = match (o.over, c.limit.shadow) {
        (true, true) => EventOutcome::Shadowed,
        (true, false) => EventOutcome::Rejected,
        (false, _) => EventOutcome::Granted,
    };
    let mut e = Event::new(now, "envoy", &c.limit.resource, &c.limit.domain, outcome);
    e.requested = Some(Count::Whole(cost.max(1)));
    e.granted = Some(Count::Whole(o.granted));
    e.remaining = Some(o.shown_remaining());
    e.warning = o.warning;
    e.tier = o.tier;
    e
}
