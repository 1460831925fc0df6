//! The hot-page stampede view of the page (`POST /simulator/api/stampede`):
//! many callers want the same expensive result (a page to render, a cache
//! entry to fill) at about the same time. Three ways are run on the same
//! arrivals and compared:
//!
//! - `no_limit`: every caller computes the result itself;
//! - `backoff`: a copy limit of 1 with no waiting; a refused caller
//!   retries after a jittered exponential back-off (seeded, so the same
//!   body gives the same run), and reads the cache first on every attempt;
//! - `shared_result`: a copy limit of 1 with `wait_mode: shared_result`
//!   and waiting; the one that computes releases with its result ready,
//!   and every waiter is answered at that instant.
//!
//! Every copy decision (grant, refusal, wake-up with the result ready) is
//! made by the `charon simulate` runner on the in-memory store and a
//! virtual clock, so by the same rules as a server; this module only
//! schedules the callers' actions and counts.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use charon_core::config::{Config, ConfigIssue};
use charon_core::fields::{self, Issues, Path};
use charon_simulate::Simulation;
use serde_json::{Value, json};

use crate::error::{ApiError, encoding};
use crate::throttle::{Rng, count_in};

/// The most callers one run may have: the runner's cost grows faster
/// than linearly with callers waiting at once (1 000 at one instant take
/// about 10 s of a debug build), so a run is kept to this.
pub const MAX_CALLERS: u64 = 1_000;
/// The longest computation, ms.
pub const MAX_WORK_MS: u64 = 60_000;
/// The longest arrival spread, ms.
pub const MAX_SPREAD_MS: u64 = 600_000;
/// The most copy reserves the back-off mode is expected to make in one
/// run: what one call may cost is bounded by it.
pub const MAX_ATTEMPTS: u64 = 200_000;
/// A back-off never grows past this many times its base.
const BACKOFF_CAP: u64 = 64;
/// Buckets of the chart of when callers got their result.
const BUCKETS: u64 = 60;

const FIELDS: &[&str] = &["callers", "work_ms", "spread_ms", "backoff_ms", "seed"];

/// A run, read from the body.
#[derive(Debug, Clone, Copy)]
struct Setup {
    callers: u64,
    work_ms: u64,
    spread_ms: u64,
    backoff_ms: u64,
    seed: u64,
}

fn setup(v: &Value) -> Result<Setup, Vec<ConfigIssue>> {
    let mut issues = Issues::default();
    let root = Path::root();
    let Some(m) = fields::object(v, &root, &mut issues, "a stampede run", FIELDS) else {
        return Err(issues.into_vec());
    };
    let s = Setup {
        callers: count_in(m, "callers", 200, (1, MAX_CALLERS), &mut issues),
        work_ms: count_in(m, "work_ms", 50, (1, MAX_WORK_MS), &mut issues),
        spread_ms: count_in(m, "spread_ms", 100, (0, MAX_SPREAD_MS), &mut issues),
        backoff_ms: count_in(m, "backoff_ms", 10, (1, 10_000), &mut issues),
        seed: count_in(m, "seed", 1, (0, charon_core::MAX_COUNT), &mut issues),
    };
    if !issues.is_empty() {
        return Err(issues.into_vec());
    }
    // Each refused caller doubles its back-off up to the cap, then retries
    // every cap until the computation is done.
    let per_caller =
        u64::from(BACKOFF_CAP.ilog2()) + 2 + s.work_ms / (s.backoff_ms * BACKOFF_CAP / 2);
    let attempts = s.callers.saturating_mul(per_caller);
    if attempts > MAX_ATTEMPTS {
        issues.push(
            &root,
            format!(
                "about {attempts} retries with back-off; a run makes at most {MAX_ATTEMPTS} (fewer callers, a shorter computation or a longer back-off)"
            ),
        );
        return Err(issues.into_vec());
    }
    Ok(s)
}

/// Runs a body: the JSON answer.
pub(crate) fn run(bytes: &[u8]) -> Result<Vec<u8>, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(vec![ConfigIssue {
            path: String::new(),
            message: format!("not JSON: {e}"),
        }])
    })?;
    let s = setup(&v).map_err(ApiError::invalid)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ApiError::Internal(format!("no runtime for the stampede: {e}")))?;
    let arrivals = arrivals(&s);
    let modes = [Mode::NoLimit, Mode::Backoff, Mode::Shared]
        .into_iter()
        .map(|mode| runtime.block_on(Run::new(s, mode, &arrivals)?.finish()))
        .collect::<Result<Vec<_>, _>>()?;
    serde_json::to_vec(&answer(&s, &arrivals, &modes)).map_err(encoding)
}

/// When each caller first asks, ms: uniform over the spread, sorted, the
/// same for every mode.
fn arrivals(s: &Setup) -> Vec<u64> {
    let mut rng = Rng(s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut a: Vec<u64> = (0..s.callers)
        .map(|_| (rng.next() * (s.spread_ms + 1) as f64).floor() as u64)
        .map(|t| t.min(s.spread_ms))
        .collect();
    a.sort_unstable();
    a
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoLimit,
    Backoff,
    Shared,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoLimit => "no_limit",
            Mode::Backoff => "backoff",
            Mode::Shared => "shared_result",
        }
    }
}

/// What a caller does next, at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Reads the cache; on a miss, reserves the copy.
    Ask(usize),
    /// Has computed the result: stores it and releases its copy.
    Finish(usize),
}

/// How each caller got its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    Computed,
    Woken,
    Cache,
}

/// One mode's run: the caller's actions in time order, each copy decision
/// asked of the simulation.
struct Run {
    s: Setup,
    mode: Mode,
    sim: Option<Simulation>,
    rng: Rng,
    /// (time, sequence, action): the sequence keeps one instant's actions
    /// in the order they were scheduled.
    actions: BinaryHeap<Reverse<(u64, u64, Action)>>,
    seq: u64,
    /// Since when the result is in the cache.
    cached_at: Option<u64>,
    done: Vec<Option<(u64, Got)>>,
    copy_ops: Vec<u64>,
    attempts: Vec<u32>,
}

/// One mode's figures.
struct Outcome {
    mode: Mode,
    done: Vec<(u64, Got)>,
    copy_ops: u64,
}

impl Run {
    fn new(s: Setup, mode: Mode, arrivals: &[u64]) -> Result<Self, ApiError> {
        let sim = match mode {
            Mode::NoLimit => None,
            Mode::Backoff => Some("{ name: hot, kind: copy, domain_limit: 1 }".to_owned()),
            Mode::Shared => Some(format!(
                "{{ name: hot, kind: copy, domain_limit: 1, wait_mode: shared_result, queue_limit: {MAX_CALLERS} }}"
            )),
        }
        .map(|resource| {
            Config::from_yaml(&format!("resources:\n  - {resource}\n"))
                .map(|(config, _)| Simulation::new(config))
                .map_err(|e| ApiError::Internal(format!("the stampede's configuration: {e:?}")))
        })
        .transpose()?;
        let n = arrivals.len();
        let mut run = Self {
            s,
            mode,
            sim,
            rng: Rng(s.seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1),
            actions: BinaryHeap::new(),
            seq: 0,
            cached_at: None,
            done: vec![None; n],
            copy_ops: vec![0; n],
            attempts: vec![0; n],
        };
        for (i, &t) in arrivals.iter().enumerate() {
            run.schedule(t, Action::Ask(i));
        }
        Ok(run)
    }

    fn schedule(&mut self, t: u64, action: Action) {
        self.actions.push(Reverse((t, self.seq, action)));
        self.seq += 1;
    }

    /// The jittered exponential back-off before caller `i`'s next try:
    /// base × 2^(tries − 1), capped, times a factor in [0.5, 1.5).
    fn backoff(&mut self, i: usize) -> u64 {
        let tries = u64::from(self.attempts[i].clamp(1, 32));
        let grown = self
            .s
            .backoff_ms
            .saturating_mul(1u64 << (tries - 1).min(u64::from(BACKOFF_CAP.ilog2())));
        ((grown as f64) * (0.5 + self.rng.next())).round().max(1.0) as u64
    }

    async fn finish(mut self) -> Result<Outcome, ApiError> {
        while let Some(Reverse((t, _, action))) = self.actions.pop() {
            match action {
                Action::Ask(i) => self.ask(t, i).await?,
                Action::Finish(i) => self.store(t, i).await?,
            }
        }
        if let Some(sim) = self.sim.as_mut() {
            let left = sim.end().await;
            if !left.is_empty() {
                return Err(ApiError::Internal(format!(
                    "callers still waiting at the end: {left:?}"
                )));
            }
        }
        let done = self
            .done
            .iter()
            .enumerate()
            .map(|(i, d)| d.ok_or_else(|| ApiError::Internal(format!("caller {i} got no result"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Outcome {
            mode: self.mode,
            done,
            copy_ops: self.copy_ops.iter().sum(),
        })
    }

    async fn ask(&mut self, t: u64, i: usize) -> Result<(), ApiError> {
        if self.cached_at.is_some_and(|c| c <= t) {
            self.done[i] = Some((t, Got::Cache));
            return Ok(());
        }
        if self.sim.is_none() {
            self.schedule(t + self.s.work_ms, Action::Finish(i));
            return Ok(());
        }
        self.attempts[i] += 1;
        self.copy_ops[i] += 1;
        // A waiter waits at most for one computation (and a margin).
        let wait_ms = if self.mode == Mode::Shared {
            self.s.work_ms + 1000
        } else {
            0
        };
        let event = json!({"t": t, "op": "reserve", "id": i.to_string(), "resource": "hot",
            "domain": "page", "copies": 1, "wait_ms": wait_ms, "session": format!("c{i}")});
        self.apply(event).await
    }

    async fn store(&mut self, t: u64, i: usize) -> Result<(), ApiError> {
        self.done[i] = Some((t, Got::Computed));
        self.cached_at.get_or_insert(t);
        if self.sim.is_none() {
            return Ok(());
        }
        self.copy_ops[i] += 1;
        let mut event = json!({"t": t, "op": "release", "resource": "hot", "domain": "page",
            "copies": 1, "session": format!("c{i}")});
        if self.mode == Mode::Shared {
            event["result_ready"] = json!(true);
        }
        self.apply(event).await
    }

    /// Sends one event and acts on every reserve it decided: the event's
    /// own and the waiters it answered.
    async fn apply(&mut self, event: Value) -> Result<(), ApiError> {
        let line = serde_json::to_vec(&event).map_err(encoding)?;
        let sim = self.sim.as_mut().expect("a mode with copies");
        for out in sim.lines(&line).await {
            if out.get("error").is_some() {
                return Err(ApiError::Internal(format!(
                    "the simulation refused {event}: {out}"
                )));
            }
            if out["op"] != "reserve" {
                continue;
            }
            let (Some(at), Some(i)) = (
                out["t"].as_u64(),
                out["id"].as_str().and_then(|id| id.parse::<usize>().ok()),
            ) else {
                return Err(ApiError::Internal(format!("an unexpected line: {out}")));
            };
            if out["granted"].as_u64().unwrap_or(0) >= 1 {
                self.schedule(at + self.s.work_ms, Action::Finish(i));
            } else if out["result_ready"] == true {
                self.done[i] = Some((at, Got::Woken));
            } else {
                let delay = self.backoff(i);
                self.schedule(at + delay, Action::Ask(i));
            }
        }
        Ok(())
    }
}

/// The answer: per mode its figures and a histogram of when its callers
/// got their result, on one time axis for all modes.
fn answer(s: &Setup, arrivals: &[u64], modes: &[Outcome]) -> Value {
    let horizon = modes
        .iter()
        .flat_map(|m| m.done.iter().map(|d| d.0))
        .max()
        .unwrap_or(0)
        + 1;
    let bucket_ms = horizon.div_ceil(BUCKETS).max(1);
    let n = arrivals.len() as f64;
    let modes: Vec<Value> = modes
        .iter()
        .map(|m| {
            let mut latencies: Vec<u64> =
                m.done.iter().zip(arrivals).map(|(d, a)| d.0 - a).collect();
            latencies.sort_unstable();
            let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
            let count = |g: Got| m.done.iter().filter(|d| d.1 == g).count();
            let mut histogram = vec![0u64; horizon.div_ceil(bucket_ms) as usize];
            for d in &m.done {
                histogram[(d.0 / bucket_ms) as usize] += 1;
            }
            json!({
                "mode": m.mode.name(),
                "computations": count(Got::Computed),
                "result_ready": count(Got::Woken),
                "from_cache": count(Got::Cache),
                "p50_ms": pct(0.5),
                "p99_ms": pct(0.99),
                "max_ms": latencies.last().copied().unwrap_or(0),
                "copy_ops": m.copy_ops,
                "copy_ops_per_caller": (m.copy_ops as f64 / n * 100.0).round() / 100.0,
                "histogram": histogram,
            })
        })
        .collect();
    json!({
        "callers": s.callers,
        "work_ms": s.work_ms,
        "spread_ms": s.spread_ms,
        "backoff_ms": s.backoff_ms,
        "seed": s.seed,
        "bucket_ms": bucket_ms,
        "modes": modes,
    })
}
