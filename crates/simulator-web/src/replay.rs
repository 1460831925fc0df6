//! The stateless replay behind `POST /simulator/api/run`.
//!
//! Every decision is [`charon_core::rate::decide`]'s, on the same state type
//! the stores keep; this module only watches the state between decisions
//! and describes it. One domain is simulated, so the global hit log sees
//! exactly the domain's hits (and G, which the simulator does not offer,
//! would behave as H).

use charon_core::Millis;
use charon_core::config::{Adjustment, ConfigIssue, Enforcement, Tier};
use charon_core::meter::Op;
use charon_core::rate::{HitLog, Phase, RateReply, RateState, decide_op};
use serde::Serialize;
use serde_json::Value;

use crate::error::{ApiError, encoding};
use crate::input::{Detail, EventHead, Replay, resource_value};

/// The most `[time, hits]` entries one answer may list in its tier
/// snapshots. Each snapshot lists a window's worth of hits, so long windows
/// and many requests multiply; past this the caller is told to ask for
/// `detail: "replies"` or a later `report_from`. (About 1.5 MB of JSON.)
pub const MAX_HIT_TIMES: usize = 100_000;

/// The most tier states one `detail: "full"` answer may list with its
/// events (listed events × tiers; the `now` snapshot is not counted). Each
/// is about 170 bytes of JSON: this keeps a full answer near 3.5 MB, the
/// size of a `detail: "replies"` answer of 20 000 events.
pub const MAX_LISTED_TIER_STATES: usize = 20_000;

/// The domain the replay runs as (no overrides exist, so any name would do).
pub(crate) const DOMAIN: &str = "simulated";

/// The answer to a replay but its `events`, which are written as they are
/// replayed (see [`run`]).
#[derive(Debug, Serialize)]
struct Answer<'a> {
    /// The resource as it will be enforced: normalized, SPEC §6 layout.
    resource: Value,
    /// What normalization changed, body-relative paths.
    adjustments: &'a [Adjustment],
    totals: Totals,
    /// Events before `report_from`, replayed but not listed.
    skipped: usize,
    /// For each tier (index 0 is tier 1), every period it was entered whose
    /// cooldown had not ended by `report_from`, oldest first.
    periods: Vec<Vec<Period>>,
    /// The state at the page's clock.
    now: NowOut,
}

#[derive(Debug, Default, Serialize)]
struct Totals {
    requests: usize,
    granted_requests: usize,
    rejected_requests: usize,
    granted_hits: u64,
    bursts: usize,
}

#[derive(Debug, Serialize)]
struct EventOut {
    #[serde(flatten)]
    head: EventHead,
    /// SPEC §2 rule 6, encoded as `charon simulate` encodes it.
    reply: RateReply,
    /// Where the granted hits went: several tiers when one request passed
    /// through several (rule 5).
    placed: Vec<Placed>,
    /// Every tier after the decision (`detail: "full"` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    tiers: Option<Vec<TierSnapshot>>,
}

#[derive(Debug, Serialize)]
struct Placed {
    tier: usize,
    hits: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Period {
    entered: Millis,
    /// `None`: active for ever.
    active_until: Option<Millis>,
    cooldown_until: Option<Millis>,
}

impl Period {
    /// The periods of SPEC §2 rule 2 for `tier` entered at `e`.
    fn of(tier: &Tier, e: Millis) -> Self {
        let active_until = tier.active.map(|a| e.saturating_add(a));
        Self {
            entered: e,
            active_until,
            cooldown_until: active_until.map(|a| a.saturating_add(tier.cooldown)),
        }
    }
}

#[derive(Debug, Serialize)]
struct TierSnapshot {
    tier: usize,
    /// `inactive`, `active` or `cooldown`.
    phase: &'static str,
    current: bool,
    /// Active under a higher active tier: keeps its hits, receives none.
    shadowed: bool,
    /// The latest entry, while the tier is active or cooling down (`null`
    /// when inactive).
    entered: Option<Millis>,
    /// When that entry's active period ends (`null`: never, or inactive).
    active_until: Option<Millis>,
    /// When its cooldown ends (`null`: never, or inactive).
    cooldown_until: Option<Millis>,
    limit: u64,
    /// Tw in milliseconds (normalized), to draw the window.
    window_ms: Millis,
    /// Hits in its window.
    hits: u64,
    /// Those hits as `[time, hits]`, oldest first.
    hit_times: Vec<(Millis, u64)>,
}

#[derive(Debug, Serialize)]
struct NowOut {
    t: Millis,
    current_tier: usize,
    domain_hits_last_second: u64,
    tiers: Vec<TierSnapshot>,
}

/// Replays `replay.events` from empty state; the answer as JSON. Each
/// listed event is written as soon as it is decided (the answer starts
/// with `"events"`), so what is held is the answer's bytes, not a tree of
/// values several times their size.
pub(crate) fn run(replay: &Replay) -> Result<Vec<u8>, ApiError> {
    if let Some(meter) = replay.setup.meter(DOMAIN) {
        return crate::meters::run(replay, meter);
    }
    let rate = replay
        .setup
        .rate()
        .ok_or_else(|| ApiError::Internal("the simulator replays rate-like kinds only".into()))?;
    let limits = rate.limits_for(DOMAIN);
    let policy = rate.policy_for(DOMAIN);
    let tiers = limits.tiers;
    let mut state = RateState::default();
    let mut global = HitLog::default();
    let mut periods: Vec<Vec<Period>> = vec![Vec::new(); tiers.len()];
    let mut totals = Totals::default();
    let mut json = Vec::with_capacity(replay.events.len().min(MAX_EVENTS_RESERVED) * 256);
    json.extend_from_slice(b"{\"events\":[");
    let mut listed = 0usize;
    let mut budget = MAX_HIT_TIMES;
    let mut states = MAX_LISTED_TIER_STATES;
    for (index, ev) in replay.events.iter().enumerate() {
        let now = ev.t;
        // `decide` brings the state to `now` first as well; doing it here
        // makes the counts below the hits in each window just before the
        // decision, so the difference after it is where the hits went.
        state.advance(tiers, now);
        let before: Vec<u64> = (1..=tiers.len()).map(|i| state.tier_hits(i)).collect();
        let reply = decide_op(
            limits,
            policy,
            &mut state,
            &mut global,
            now,
            ev.op,
            Enforcement::Enforce,
        )
        .map_err(|e| {
            let field = match ev.op {
                Op::Request { .. } => "copies",
                Op::Charge(_) | Op::Refund(_) => "op",
            };
            ApiError::invalid(vec![ConfigIssue {
                path: format!("events[{index}].{field}"),
                message: e.to_string(),
            }])
        })?;

        totals.requests += 1;
        if reply.granted > 0 {
            totals.granted_requests += 1;
        } else {
            totals.rejected_requests += 1;
        }
        // A dry run records nothing: its grant is not a hit, its burst none.
        if !matches!(ev.op, Op::Request { dry_run: true, .. }) {
            totals.granted_hits += reply.granted;
            totals.bursts += usize::from(reply.burst);
        }
        for (i, (tier, log)) in tiers.iter().zip(&mut periods).enumerate() {
            if let Some(e) = state.tiers.get(i).and_then(|t| t.entered)
                && log.last().map(|p| p.entered) != Some(e)
            {
                log.push(Period::of(tier, e));
            }
        }
        if now < replay.report_from {
            continue;
        }
        let placed = before
            .iter()
            .enumerate()
            .filter_map(|(i, &b)| {
                let hits = state.tier_hits(i + 1).saturating_sub(b);
                (hits > 0).then_some(Placed { tier: i + 1, hits })
            })
            .collect();
        let snapshots = match replay.detail {
            Detail::Full => {
                states = states
                    .checked_sub(tiers.len())
                    .ok_or(ApiError::TooManyTierStates)?;
                Some(snapshot(tiers, &state, now, &mut budget)?)
            }
            Detail::Replies => None,
        };
        if listed > 0 {
            json.push(b',');
        }
        listed += 1;
        serde_json::to_writer(
            &mut json,
            &EventOut {
                head: ev.head(index),
                reply,
                placed,
                tiers: snapshots,
            },
        )
        .map_err(encoding)?;
    }
    json.push(b']');

    let last = replay.events.last().map_or(0, |e| e.t);
    let at = replay.at.unwrap_or(last).max(last);
    // A view of the state at the page's clock: what time alone changed
    // (windows emptied, tiers cooled down), never a decision.
    let mut view = state;
    view.advance(tiers, at);
    let now = NowOut {
        t: at,
        current_tier: view.current_tier(tiers, at),
        domain_hits_last_second: view.last_second.count(),
        tiers: snapshot(tiers, &view, at, &mut budget)?,
    };
    for log in &mut periods {
        log.retain(|p| p.cooldown_until.is_none_or(|c| c >= replay.report_from));
    }
    let resource = resource_value(replay);
    let rest = serde_json::to_vec(&Answer {
        resource,
        adjustments: &replay.setup.adjustments,
        skipped: totals.requests - listed,
        totals,
        periods,
        now,
    })
    .map_err(encoding)?;
    // `rest` is an object: its fields follow the events.
    json.push(b',');
    json.extend_from_slice(rest.strip_prefix(b"{").unwrap_or(&rest));
    Ok(json)
}

/// Events whose answer space is reserved up front (the rest grows).
const MAX_EVENTS_RESERVED: usize = 20_000;

/// Every tier of `state` (already brought to `now`) as of `now`, with the
/// times of the hits in its window, charged to `budget`.
fn snapshot(
    tiers: &[Tier],
    state: &RateState,
    now: Millis,
    budget: &mut usize,
) -> Result<Vec<TierSnapshot>, ApiError> {
    let current = state.current_tier(tiers, now);
    tiers
        .iter()
        .enumerate()
        .map(|(i, tier)| {
            let index = i + 1;
            let ts = state.tiers.get(i);
            let phase = state.phase(tiers, index, now);
            let times: Vec<(Millis, u64)> =
                ts.map(|t| t.hits.entries().collect()).unwrap_or_default();
            *budget = budget
                .checked_sub(times.len())
                .ok_or(ApiError::TooManyHitTimes)?;
            let period = ts.and_then(|t| t.entered).map(|e| Period::of(tier, e));
            Ok(TierSnapshot {
                tier: index,
                phase: phase.name(),
                current: index == current,
                shadowed: phase == Phase::Active && index < current,
                entered: period.map(|p| p.entered),
                active_until: period.and_then(|p| p.active_until),
                cooldown_until: period.and_then(|p| p.cooldown_until),
                limit: tier.limit,
                window_ms: tier.window,
                hits: state.tier_hits(index),
                hit_times: times,
            })
        })
        .collect()
}
