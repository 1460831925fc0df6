//! The replay of a bucket, a window or a queue (SPEC §7–10) behind `POST
//! /simulator/api/run`.
//!
//! Every decision is [`Meter::decide`]'s, on the state type the stores
//! keep. Between decisions this module only reads the state through the
//! kind's own methods ([`Level::remaining`], [`window::Params::seen`]), so
//! the page can draw a bucket's level, a window's count and estimate and a
//! queue's backlog over time without a rule of its own.

use charon_core::Millis;
use charon_core::meter::{Level, Meter, MeterState, Op, Reply, State, ban_left};
use charon_core::window;
use serde::Serialize;

use crate::error::ApiError;
use crate::error::encoding;
use crate::input::resource_value;
use crate::input::{Event, EventHead, Replay};

/// Samples of the level spread evenly over `[report_from, at]`, so that a
/// refill or a drain between events is drawn as it happens.
const SAMPLES: u64 = 240;

/// Window boundaries (the millisecond before and the one at the turn) are
/// sampled too when the span holds at most this many, so a count drops to
/// 0 exactly where the window turns.
const MAX_TURNS: u64 = 400;

/// The level of the pair at one time, read with the kind's own methods.
#[derive(Debug, Clone, Copy, Serialize)]
struct Reading {
    t: Millis,
    /// `remaining` as a reply at `t` would say it.
    remaining: u64,
    /// `limit − remaining`: tokens used, a window's count or estimate, a
    /// queue's backlog (what a soft limit is compared with).
    usage: u64,
    /// Windows: hits in the current window.
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    /// `sliding_counter` windows: hits in the previous window.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<u64>,
    /// Windows: the count the limit is compared with (the count for
    /// `fixed`; for `sliding_counter` the weighted estimate).
    #[serde(skip_serializing_if = "Option::is_none")]
    estimate: Option<u64>,
    /// The end of a ban in force at `t` (exclusive).
    #[serde(skip_serializing_if = "Option::is_none")]
    banned_until: Option<Millis>,
}

#[derive(Debug, Serialize)]
struct EventOut {
    #[serde(flatten)]
    head: EventHead,
    /// SPEC §10, encoded as `charon simulate` encodes it.
    reply: Reply,
    /// The level just before and just after the event (a dry run leaves it
    /// as it was).
    before: Reading,
    after: Reading,
}

#[derive(Debug, Default, Serialize)]
struct Totals {
    /// Requests, dry runs included.
    requests: usize,
    granted_requests: usize,
    rejected_requests: usize,
    /// Units granted to requests that were not dry runs.
    granted_hits: u64,
    dry_runs: usize,
    charges: usize,
    charged: u64,
    refunds: usize,
    refunded: u64,
    /// Replies with `warning: true`.
    warnings: usize,
    /// Replies with `banned: true`.
    banned: usize,
    /// Bans started.
    bans: usize,
}

/// A ban: from the rejection that set it to its end (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct BanSpan {
    from: Millis,
    until: Millis,
}

#[derive(Debug, Serialize)]
struct NowOut {
    #[serde(flatten)]
    level: Reading,
    /// `reset_after_ms` as a reply at `t` would say it.
    reset_after_ms: Millis,
    /// Whether usage at `t` is at least the soft limit.
    warning: bool,
}

/// The answer but its `events`, which are written as they are replayed.
#[derive(Debug, Serialize)]
struct Answer<'a> {
    resource: serde_json::Value,
    adjustments: &'a [charon_core::config::Adjustment],
    totals: Totals,
    skipped: usize,
    /// `bucket`, `window` or `queue`.
    kind: &'static str,
    /// The limit in force (burst, limit, size).
    limit: u64,
    /// The least usage that warns (`soft_limit`), if one is set.
    soft_threshold: Option<u64>,
    /// Every ban that had not ended by `report_from`, oldest first.
    bans: Vec<BanSpan>,
    /// The level over `[report_from, now.t]`, in time order: even samples,
    /// window turns, and each listed event's `before` and `after`.
    series: Vec<Reading>,
    now: NowOut,
}

/// Replays `replay.events` on `meter` from empty state; the answer as
/// JSON, its `events` written as they are decided (see [`crate::replay`]).
pub(crate) fn run(replay: &Replay, meter: Meter) -> Result<Vec<u8>, ApiError> {
    let mut state = meter.empty();
    let mut totals = Totals::default();
    let mut bans: Vec<BanSpan> = Vec::new();
    let last = replay.events.last().map_or(0, |e| e.t);
    let at = replay.at.unwrap_or(last).max(last);
    let from = replay.report_from.min(at);
    let mut samples = sample_times(&meter, from, at).into_iter().peekable();
    let mut series = Vec::new();
    let mut json = Vec::with_capacity(replay.events.len().min(20_000) * 256);
    json.extend_from_slice(b"{\"events\":[");
    let mut listed = 0usize;
    for (index, ev) in replay.events.iter().enumerate() {
        let now = ev.t;
        let listing = now >= replay.report_from;
        while let Some(t) = samples.next_if(|&t| t < now) {
            series.push(level(&meter, &state, t));
        }
        let before = level(&meter, &state, now);
        let reply = meter.decide(&mut state, now, ev.op).map_err(|e| {
            ApiError::invalid(vec![charon_core::config::ConfigIssue {
                path: format!("events[{index}].{}", field_of(ev)),
                message: e.to_string(),
            }])
        })?;
        count(&mut totals, ev, &reply);
        if let Some(until) = banned_until(&state)
            && bans.last().map(|b| b.until) != Some(until)
        {
            totals.bans += 1;
            bans.push(BanSpan { from: now, until });
        }
        if !listing {
            continue;
        }
        let after = level(&meter, &state, now);
        series.push(before);
        series.push(after);
        if listed > 0 {
            json.push(b',');
        }
        listed += 1;
        serde_json::to_writer(
            &mut json,
            &EventOut {
                head: ev.head(index),
                reply,
                before,
                after,
            },
        )
        .map_err(encoding)?;
    }
    json.push(b']');
    series.extend(samples.map(|t| level(&meter, &state, t)));
    let now_level = level(&meter, &state, at);
    series.push(now_level);
    bans.retain(|b| b.until >= replay.report_from);
    let limit = meter.limit();
    let soft = meter.policy().soft_limit;
    let rest = serde_json::to_vec(&Answer {
        resource: resource_value(replay),
        adjustments: &replay.setup.adjustments,
        skipped: totals.requests + totals.charges + totals.refunds - listed,
        totals,
        kind: kind_name(&meter),
        limit,
        soft_threshold: soft.map(|s| s.threshold(limit)),
        bans,
        series,
        now: NowOut {
            level: now_level,
            reset_after_ms: reset_after(&meter, &state, at),
            warning: soft.is_some_and(|s| s.warns(limit, now_level.remaining)),
        },
    })
    .map_err(encoding)?;
    json.push(b',');
    json.extend_from_slice(rest.strip_prefix(b"{").unwrap_or(&rest));
    Ok(json)
}

/// The field a decision's client error is about.
fn field_of(ev: &Event) -> &'static str {
    match ev.op {
        Op::Refund(_) => "op",
        Op::Request { .. } | Op::Charge(_) => "copies",
    }
}

fn count(totals: &mut Totals, ev: &Event, reply: &Reply) {
    match ev.op {
        Op::Request { dry_run, .. } => {
            totals.requests += 1;
            if reply.granted > 0 {
                totals.granted_requests += 1;
            } else {
                totals.rejected_requests += 1;
            }
            if dry_run {
                totals.dry_runs += 1;
            } else {
                totals.granted_hits += reply.granted;
            }
        }
        Op::Charge(n) => {
            totals.charges += 1;
            totals.charged += n;
        }
        Op::Refund(n) => {
            totals.refunds += 1;
            totals.refunded += n;
        }
    }
    totals.warnings += usize::from(reply.warning);
    totals.banned += usize::from(reply.banned);
}

fn kind_name(meter: &Meter) -> &'static str {
    match meter {
        Meter::Bucket(_) => "bucket",
        Meter::Window(_) => "window",
        Meter::Queue(_) => "queue",
    }
}

/// When to sample the level between events: evenly over `[from, to]`, and
/// a window's turns when there are few enough to show.
fn sample_times(meter: &Meter, from: Millis, to: Millis) -> Vec<Millis> {
    let span = to - from;
    let mut times: Vec<Millis> = (0..SAMPLES).map(|i| from + span * i / SAMPLES).collect();
    if let Meter::Window(p) = meter {
        let w = p.window();
        let first = from.div_ceil(w);
        let last = to / w;
        if last >= first && last - first < MAX_TURNS {
            for k in first..=last {
                let turn = k * w;
                times.extend([turn.saturating_sub(1).max(from), turn]);
            }
        }
    }
    times.retain(|&t| t < to);
    times.sort_unstable();
    times.dedup();
    times
}

/// The end of the ban in the state, if one is stored.
fn banned_until(state: &MeterState) -> Option<Millis> {
    match state {
        MeterState::Bucket(s) => s.banned_until,
        MeterState::Window(s) => s.banned_until,
        MeterState::Queue(s) => s.banned_until,
    }
}

fn level(meter: &Meter, state: &MeterState, t: Millis) -> Reading {
    match (meter, state) {
        (Meter::Bucket(p), MeterState::Bucket(s)) => read(p, s, t),
        (Meter::Queue(p), MeterState::Queue(s)) => read(p, s, t),
        (Meter::Window(p), MeterState::Window(s)) => {
            let seen = p.seen(live(p, s, t).as_ref(), t);
            Reading {
                count: Some(seen.count),
                previous: (p.algorithm() == window::Algorithm::SlidingCounter)
                    .then_some(seen.previous),
                estimate: Some(seen.estimate),
                ..read(p, s, t)
            }
        }
        // The replay's state is always of the meter's kind.
        _ => Reading {
            t,
            remaining: meter.limit(),
            usage: 0,
            count: None,
            previous: None,
            estimate: None,
            banned_until: None,
        },
    }
}

/// The level as a decision at `t` reads it: a level that can no longer
/// change a decision counts as none (as in [`charon_core::meter::decide`]).
fn live<L: Level>(kind: &L, s: &State<L::State>, t: Millis) -> Option<L::State> {
    s.level.filter(|l| kind.forget_at(l) > t)
}

fn read<L: Level>(kind: &L, s: &State<L::State>, t: Millis) -> Reading {
    let limit = kind.limit();
    let remaining = kind.remaining(live(kind, s, t).as_ref(), t);
    Reading {
        t,
        remaining,
        usage: limit - remaining.min(limit),
        count: None,
        previous: None,
        estimate: None,
        banned_until: ban_left(s.banned_until, t).and(s.banned_until),
    }
}

fn reset_after(meter: &Meter, state: &MeterState, t: Millis) -> Millis {
    fn of<L: Level>(kind: &L, s: &State<L::State>, t: Millis) -> Millis {
        kind.reset_after(live(kind, s, t).as_ref(), t)
    }
    match (meter, state) {
        (Meter::Bucket(p), MeterState::Bucket(s)) => of(p, s, t),
        (Meter::Window(p), MeterState::Window(s)) => of(p, s, t),
        (Meter::Queue(p), MeterState::Queue(s)) => of(p, s, t),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_stay_inside_the_span_and_include_window_turns() {
        let w = Meter::Window(
            window::Params::new(
                window::Algorithm::Fixed,
                5,
                1_000,
                charon_core::meter::Policy::default(),
            )
            .expect("valid"),
        );
        let times = sample_times(&w, 500, 3_000);
        assert!(times.iter().all(|&t| (500..3_000).contains(&t)));
        for t in [999, 1_000, 1_999, 2_000, 2_999] {
            assert!(times.contains(&t), "{t} missing");
        }
        assert!(times.windows(2).all(|p| p[0] < p[1]));
    }
}
